#include "runtime/npy.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "support/files.h"

namespace kiln {
namespace {

const char* npy_descr(DType d) {
  switch (d) {
    case DType::Float32: return "<f4";
    case DType::Float16: return "<f2";
    case DType::Float64: return "<f8";
    case DType::Int64: return "<i8";
    case DType::Int32: return "<i4";
    case DType::Int8: return "|i1";
    case DType::UInt8: return "|u1";
    case DType::Bool: return "|b1";
    case DType::BFloat16: return nullptr;  // NumPy has no bfloat16
  }
  return nullptr;
}

bool parse_descr(std::string_view s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"<f4", DType::Float32}, {"<f2", DType::Float16}, {"<f8", DType::Float64},
      {"<i8", DType::Int64},   {"<i4", DType::Int32},   {"|i1", DType::Int8},
      {"|u1", DType::UInt8},   {"|b1", DType::Bool},    {"<i1", DType::Int8},
      {"<u1", DType::UInt8},   {"<b1", DType::Bool}};
  for (auto& [n, d] : table)
    if (s == n) {
      *out = d;
      return true;
    }
  return false;
}

[[noreturn]] void npy_fail(const std::string& source, const std::string& what) {
  fail_kind(ErrorKind::ParseError, "'{}': {}", source, what);
}

// The magic string, the version and the header length: 10 bytes (version 1) or 12 (2 and 3).
constexpr size_t kPreambleBytes = 12;

// Where the header dict starts and ends, from the file's first bytes (`head`, at least
// min(file size, kPreambleBytes) of them).
struct HeaderSpan {
  size_t begin = 0, end = 0;
};
HeaderSpan header_span(std::string_view head, uint64_t file_size, const std::string& source) {
  if (head.size() < 8 || head.substr(0, 6) != "\x93NUMPY")
    fail_kind(ErrorKind::ParseError, "'{}' is not a .npy file (bad magic)", source);
  int major = uint8_t(head[6]);
  auto byte = [&](size_t i) { return uint32_t(uint8_t(head[i])); };
  HeaderSpan span;
  uint64_t hlen = 0;
  if (major == 1) {
    if (head.size() < 10) npy_fail(source, "truncated header");
    hlen = byte(8) | (byte(9) << 8);
    span.begin = 10;
  } else if (major == 2 || major == 3) {
    if (head.size() < 12) npy_fail(source, "truncated header");
    hlen = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    span.begin = 12;
  } else {
    npy_fail(source, fmt::format("unsupported .npy version {}", major));
  }
  if (hlen > file_size - span.begin)
    npy_fail(source, fmt::format("header length {} exceeds the {} bytes after the preamble",
                                 hlen, file_size - span.begin));
  span.end = span.begin + size_t(hlen);
  return span;
}

// The value text of `key` in the header dict: the quoted string's contents, the parenthesized
// tuple with its parentheses, or the bare word up to the next ',' or '}'.
std::string_view dict_value(std::string_view header, std::string_view key,
                            const std::string& source) {
  std::string quoted = fmt::format("'{}'", key);
  size_t k = header.find(quoted);
  if (k == std::string_view::npos) npy_fail(source, fmt::format(".npy header has no '{}'", key));
  size_t colon = header.find_first_not_of(' ', k + quoted.size());
  if (colon == std::string_view::npos || header[colon] != ':')
    npy_fail(source, fmt::format("malformed .npy header: no ':' after '{}'", key));
  size_t b = header.find_first_not_of(' ', colon + 1);
  if (b == std::string_view::npos)
    npy_fail(source, fmt::format("malformed .npy header: no value for '{}'", key));
  if (header[b] == '(') {
    size_t e = header.find(')', b);
    if (e == std::string_view::npos)
      npy_fail(source, fmt::format("malformed .npy header: unclosed tuple for '{}'", key));
    return header.substr(b, e - b + 1);
  }
  if (header[b] == '\'') {
    size_t e = header.find('\'', b + 1);
    if (e == std::string_view::npos)
      npy_fail(source, fmt::format("malformed .npy header: unclosed string for '{}'", key));
    return header.substr(b + 1, e - b - 1);
  }
  size_t e = header.find_first_of(",}", b);
  if (e == std::string_view::npos)
    npy_fail(source, fmt::format("malformed .npy header: unterminated value for '{}'", key));
  if (e == b) return {};
  size_t last = header.find_last_not_of(' ', e - 1);  // >= b: header[b] is not a blank
  return header.substr(b, last + 1 - b);
}

// "(2, 3)", "(4,)", "()": the sizes, each a non-negative decimal.
Dims parse_shape(std::string_view shape, const std::string& source) {
  auto bad = [&](std::string_view why) {
    npy_fail(source, fmt::format("bad shape {} in .npy header ({})", shape, why));
  };
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') bad("not a tuple");
  std::string_view inner = shape.substr(1, shape.size() - 2);
  Dims sizes;
  size_t i = 0;
  auto skip_blanks = [&] {
    while (i < inner.size() && inner[i] == ' ') ++i;
  };
  skip_blanks();
  while (i < inner.size()) {
    if (inner[i] < '0' || inner[i] > '9') bad("expected a size");
    int64_t v = 0;
    for (; i < inner.size() && inner[i] >= '0' && inner[i] <= '9'; ++i) {
      if (v > (INT64_MAX - 9) / 10) bad("size too large");
      v = v * 10 + (inner[i] - '0');
    }
    if (sizes.size() == kMaxRank)
      bad(fmt::format("more than {} dimensions", kMaxRank));
    sizes.push_back(v);
    skip_blanks();
    if (i == inner.size()) break;
    if (inner[i] != ',') bad("expected ',' between sizes");
    ++i;
    skip_blanks();
  }
  return sizes;
}

struct NpyLayout {
  DType dtype = DType::Float32;
  Dims sizes;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
};

// Checks the header dict (`header`: the bytes of the span) against the file size.
NpyLayout parse_header(std::string_view header, HeaderSpan span, uint64_t file_size,
                       const std::string& source) {
  NpyLayout layout;
  std::string_view descr = dict_value(header, "descr", source);
  if (!parse_descr(descr, &layout.dtype))
    fail_kind(ErrorKind::NotSupported, "'{}': dtype '{}' is not supported (use float32/16/64, "
              "int64/32/8, uint8 or bool, little-endian)", source, descr);
  if (dict_value(header, "fortran_order", source) != "False")
    fail_kind(ErrorKind::NotSupported, "'{}': Fortran-order arrays are not supported; save with "
              "np.ascontiguousarray", source);
  std::string_view shape = dict_value(header, "shape", source);
  layout.sizes = parse_shape(shape, source);
  layout.data_offset = span.end;
  uint64_t payload = file_size - span.end;
  // numel * itemsize must equal the payload; checked without overflow (payload bounds it).
  uint64_t bytes = uint64_t(dtype_size(layout.dtype));
  bool empty = false;
  for (int64_t s : layout.sizes) empty |= s == 0;
  if (empty) bytes = 0;
  for (int64_t s : layout.sizes) {
    if (empty) break;
    if (uint64_t(s) > payload / bytes)
      npy_fail(source, fmt::format("shape {} is larger than the file", shape));
    bytes *= uint64_t(s);
  }
  if (bytes != payload)
    npy_fail(source, fmt::format("shape {} of {} needs {} bytes of data but the file has {}",
                                 shape, dtype_name(layout.dtype), bytes, payload));
  layout.data_bytes = bytes;
  return layout;
}

}  // namespace

Tensor parse_npy(std::span<const uint8_t> bytes, const std::string& source) {
  std::string_view all(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  HeaderSpan span = header_span(all.substr(0, kPreambleBytes), all.size(), source);
  NpyLayout layout = parse_header(all.substr(span.begin, span.end - span.begin), span,
                                  all.size(), source);
  Tensor t = Tensor::empty(layout.sizes, layout.dtype);
  if (layout.data_bytes) std::memcpy(t.raw_data(), bytes.data() + layout.data_offset, layout.data_bytes);
  return t;
}

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}' for reading", path);
  f.seekg(0, std::ios::end);
  std::streamoff end = f.tellg();
  if (end < 0) fail("cannot read '{}' (not a regular file?)", path);
  uint64_t file_size = uint64_t(end);
  f.seekg(0);
  std::string head(size_t(std::min<uint64_t>(file_size, kPreambleBytes)), '\0');
  if (!f.read(head.data(), std::streamsize(head.size()))) npy_fail(path, "truncated header");
  HeaderSpan span = header_span(head, file_size, path);
  std::string header(span.end - span.begin, '\0');
  f.seekg(std::streamoff(span.begin));
  if (!f.read(header.data(), std::streamsize(header.size()))) npy_fail(path, "truncated header");
  NpyLayout layout = parse_header(header, span, file_size, path);
  Tensor t = Tensor::empty(layout.sizes, layout.dtype);
  if (layout.data_bytes &&
      !f.read(static_cast<char*>(t.raw_data()), std::streamsize(layout.data_bytes)))
    npy_fail(path, "truncated data");
  return t;
}

std::vector<uint8_t> npy_bytes(const Tensor& t0) {
  Tensor t = t0.device().is_cpu() ? t0 : t0.to(Device::cpu());
  if (t.dtype() == DType::BFloat16) t = t.to(DType::Float32);  // NumPy has no bfloat16
  t = t.contiguous();
  std::string shape = "(";
  for (size_t i = 0; i < t.sizes().size(); ++i) shape += fmt::format("{}, ", t.sizes()[i]);
  if (t.sizes().size() > 1) shape.resize(shape.size() - 2);
  else if (t.sizes().size() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_descr(t.dtype()), shape);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> out;
  out.reserve(10 + header.size() + size_t(t.nbytes()));
  const char magic[] = "\x93NUMPY\x01\x00";
  out.insert(out.end(), magic, magic + 8);
  out.push_back(uint8_t(header.size() & 0xff));
  out.push_back(uint8_t(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  const auto* data = static_cast<const uint8_t*>(t.raw_data());
  out.insert(out.end(), data, data + t.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& t) {
  std::vector<uint8_t> bytes = npy_bytes(t);
  AtomicFile f(path, "write_npy");
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace kiln
