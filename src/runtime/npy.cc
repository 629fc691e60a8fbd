#include "runtime/npy.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

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

bool parse_descr(const std::string& s, DType* out) {
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

// Extracts the value text of 'key' from the header dict.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) fail_kind(ErrorKind::ParseError, "{}: .npy header has no '{}'", path, key);
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) fail_kind(ErrorKind::ParseError, "{}: malformed .npy header", path);
  size_t b = header.find_first_not_of(' ', colon + 1);
  size_t e;
  if (header[b] == '(') {
    e = header.find(')', b);
    if (e == std::string::npos) fail_kind(ErrorKind::ParseError, "{}: malformed shape in .npy header", path);
    return header.substr(b, e - b + 1);
  }
  if (header[b] == '\'') {
    e = header.find('\'', b + 1);
    if (e == std::string::npos) fail_kind(ErrorKind::ParseError, "{}: malformed .npy header", path);
    return header.substr(b + 1, e - b - 1);
  }
  e = header.find_first_of(",}", b);
  return header.substr(b, e - b);
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}' for reading", path);
  f.seekg(0, std::ios::end);
  int64_t file_size = f.tellg();
  f.seekg(0);
  char magic[8];
  if (!f.read(magic, 8) || std::string(magic, 6) != "\x93NUMPY")
    fail_kind(ErrorKind::ParseError, "'{}' is not a .npy file (bad magic)", path);
  int major = uint8_t(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) fail_kind(ErrorKind::ParseError, "'{}': truncated header", path);
    hlen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) fail_kind(ErrorKind::ParseError, "'{}': truncated header", path);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  } else {
    fail_kind(ErrorKind::ParseError, "'{}': unsupported .npy version {}", path, major);
  }
  if (int64_t(hlen) > file_size) fail_kind(ErrorKind::ParseError, "'{}': header length {} exceeds file size", path, hlen);
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) fail_kind(ErrorKind::ParseError, "'{}': truncated header", path);
  std::string descr = dict_value(header, "descr", path);
  DType dtype;
  if (!parse_descr(descr, &dtype))
    fail_kind(ErrorKind::NotSupported, "'{}': dtype '{}' is not supported (use float32/16/64, "
              "int64/32/8, uint8 or bool, little-endian)", path, descr);
  if (dict_value(header, "fortran_order", path) != "False")
    fail_kind(ErrorKind::NotSupported, "'{}': Fortran-order arrays are not supported; save with "
              "np.ascontiguousarray", path);
  std::string shape_s = dict_value(header, "shape", path);
  Dims sizes;
  {
    std::string inner = shape_s.substr(1, shape_s.size() - 2);
    std::stringstream ss(inner);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      size_t b = tok.find_first_not_of(' ');
      if (b == std::string::npos) continue;
      char* end = nullptr;
      long long v = std::strtoll(tok.c_str() + b, &end, 10);
      if (v < 0 || end == tok.c_str() + b) fail_kind(ErrorKind::ParseError, "'{}': bad shape {}", path, shape_s);
      sizes.push_back(v);
    }
  }
  int64_t payload = file_size - int64_t(f.tellg());
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s != 0 && n > payload / s) fail_kind(ErrorKind::ParseError, "'{}': shape {} is larger than the file", path, shape_s);
    n *= s;
  }
  int64_t bytes = n * dtype_size(dtype);
  if (bytes != payload)
    fail_kind(ErrorKind::ParseError, "'{}': shape {} of {} needs {} bytes of data but the file has {}",
              path, shape_s, dtype_name(dtype), bytes, payload);
  Tensor t = Tensor::empty(sizes, dtype);
  if (bytes && !f.read(static_cast<char*>(t.raw_data()), bytes))
    fail_kind(ErrorKind::ParseError, "'{}': truncated data", path);
  return t;
}

void write_npy(const std::string& path, const Tensor& t0) {
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
  AtomicFile f(path, "write_npy");
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t hl = uint16_t(header.size());
  char hb[2] = {char(hl & 0xff), char(hl >> 8)};
  f.write(hb, 2);
  f.write(header);
  f.write(t.raw_data(), size_t(t.nbytes()));
  f.commit();
}

}  // namespace kiln
