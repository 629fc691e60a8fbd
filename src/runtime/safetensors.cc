// Safetensors reader and writer. See Note [Safetensors format] in safetensors.h.
#include "runtime/safetensors.h"
#include "support/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; a big-endian host needs byte swapping");

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Headers larger than this are rejected before any allocation (the reference implementation
// uses the same bound); real headers are a few hundred KB at most.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct StDType {
  const char* name;
  DType dtype;
};
constexpr StDType kStDTypes[] = {
    {"F32", DType::Float32}, {"F16", DType::Float16}, {"BF16", DType::BFloat16},
    {"F64", DType::Float64}, {"I64", DType::Int64},   {"I32", DType::Int32},
    {"I8", DType::Int8},     {"U8", DType::UInt8},    {"BOOL", DType::Bool},
};
static_assert(std::size(kStDTypes) == size_t(kNumDTypes),
              "every Kiln dtype needs a safetensors name");

bool parse_st_dtype(const std::string& s, DType* out) {
  for (const auto& d : kStDTypes)
    if (s == d.name) {
      *out = d.dtype;
      return true;
    }
  return false;
}

[[noreturn]] void parse_fail(const std::string& source, const std::string& what) {
  throw_error(ErrorKind::ParseError, fmt::format("safetensors '{}': {}", source, what));
}

// One tensor entry of a validated header.
struct Entry {
  std::string name;
  DType dtype;
  Dims sizes;
  uint64_t begin, end;  // relative to the data section
};

// Names and values from a hostile file can be huge; error messages show a bounded prefix.
std::string clip(const std::string& s) {
  return s.size() <= 120 ? s : s.substr(0, 120) + fmt::format("... ({} bytes)", s.size());
}

uint64_t json_uint(const json& v, const std::string& source, const std::string& what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    parse_fail(source,
               fmt::format("{} must be a non-negative integer, found {}", what, clip(v.dump())));
  return v.get<uint64_t>();
}

// Parses and validates the JSON header against a data section of `data_bytes` bytes.
std::vector<Entry> parse_header(const char* text, size_t n, uint64_t data_bytes,
                                const std::string& source,
                                std::map<std::string, std::string>& metadata) {
  // nlohmann keeps the last of duplicate keys silently; a duplicate tensor name is a corrupt
  // file, so the parser callback watches top-level keys. Depth is bounded too: a valid header
  // nests at most three levels.
  std::set<std::string> seen;
  std::string duplicate;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > 4) parse_fail(source, "header JSON nests too deeply");
    if (event == json::parse_event_t::key && depth == 1) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, callback);
  } catch (const json::exception& e) {
    parse_fail(source, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) parse_fail(source, "header is not a JSON object");
  if (!duplicate.empty())
    parse_fail(source, fmt::format("tensor '{}' appears twice", clip(duplicate)));

  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) parse_fail(source, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          parse_fail(source,
                     fmt::format("__metadata__ value '{}' is not a string", clip(m.key())));
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    // save_safetensors refuses an empty name, so reading one would give contents that cannot
    // be written back (found by tests/fuzz/safetensors_fuzz.cc).
    if (name.empty()) parse_fail(source, "a tensor has an empty name");
    auto bad = [&](const std::string& what) {
      parse_fail(source, fmt::format("tensor '{}': {}", clip(name), what));
    };
    if (!v.is_object()) bad("entry is not an object");
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        bad(fmt::format("unknown field '{}'", clip(f.key())));
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing string field 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing array field 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      bad("'data_offsets' must be an array [begin, end]");

    Entry e;
    e.name = name;
    const auto& dtype_name = v["dtype"].get_ref<const std::string&>();
    if (!parse_st_dtype(dtype_name, &e.dtype))
      bad(fmt::format("unsupported dtype '{}' (supported: F32 F16 BF16 F64 I64 I32 I8 U8 BOOL)",
                      clip(dtype_name)));
    const json& shape = v["shape"];
    if (shape.size() > size_t(kMaxRank))
      bad(fmt::format("rank {} exceeds Kiln's maximum rank {}", shape.size(), kMaxRank));
    for (const json& d : shape) {
      uint64_t dim = json_uint(d, source, fmt::format("tensor '{}': shape entry", clip(name)));
      if (dim > uint64_t(INT64_MAX)) bad("shape entry too large");
      e.sizes.push_back(int64_t(dim));
    }
    // Even an empty tensor's strides multiply its other dims: keep that product small.
    uint64_t nonzero_product = 1;
    for (int64_t d : e.sizes) {
      if (d == 0) continue;
      if (nonzero_product > (uint64_t(1) << 60) / uint64_t(d))
        bad(fmt::format("shape {} is too large", to_string(e.sizes)));
      nonzero_product *= uint64_t(d);
    }
    // numel * element size, computed without overflow: anything beyond the data section is
    // already wrong, so the product stops there.
    bool empty = std::find(e.sizes.begin(), e.sizes.end(), int64_t(0)) != e.sizes.end();
    uint64_t nbytes = empty ? 0 : uint64_t(dtype_size(e.dtype));
    bool too_big = false;
    for (int64_t d : e.sizes) {
      if (empty || too_big) break;
      if (nbytes > data_bytes / uint64_t(d)) too_big = true;
      else nbytes *= uint64_t(d);
    }
    std::string offsets_what = fmt::format("tensor '{}': data_offsets", clip(name));
    e.begin = json_uint(v["data_offsets"][0], source, offsets_what);
    e.end = json_uint(v["data_offsets"][1], source, offsets_what);
    if (e.begin > e.end)
      bad(fmt::format("data_offsets [{}, {}] are reversed", e.begin, e.end));
    if (e.end > data_bytes)
      bad(fmt::format("data_offsets [{}, {}] run past the data section ({} bytes; file truncated?)",
                      e.begin, e.end, data_bytes));
    if (too_big || nbytes != e.end - e.begin)
      bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}",
                      to_string(e.sizes), dtype_name,
                      too_big ? std::string("more than the file's") : std::to_string(nbytes),
                      e.begin, e.end, e.end - e.begin));
    entries.push_back(std::move(e));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      parse_fail(source, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap",
                                     clip(entries[i - 1].name), entries[i - 1].begin,
                                     entries[i - 1].end, clip(entries[i].name), entries[i].begin,
                                     entries[i].end));
  return entries;
}

// C++ bool must hold 0 or 1; a hostile BOOL tensor may hold anything.
void normalize_bools(Tensor& t) {
  if (t.dtype() != DType::Bool) return;
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = p[i] != 0;
}

// A host tensor holding `n` bytes of data at `src`, its bools normalized.
Tensor host_tensor(const Dims& sizes, DType dtype, const uint8_t* src, uint64_t n) {
  Tensor t = Tensor::empty(sizes, dtype);
  if (n > 0) std::memcpy(t.raw_data(), src, n);
  normalize_bools(t);
  return t;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---- writing -----------------------------------------------------------------------------------

using Sink = std::function<void(const void* data, size_t n)>;

// Validates the tensors and brings them to contiguous host memory (before anything is written).
NamedTensors host_tensors(const NamedTensors& tensors, const std::string& target) {
  NamedTensors out;
  out.reserve(tensors.size());
  std::set<std::string> names;
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    const Tensor& t = entry.second;
    auto bad = [&](const std::string& what) {
      fail("save_safetensors '{}': tensor '{}': {}", target, name, what);
    };
    if (name.empty()) fail("save_safetensors '{}': a tensor has an empty name", target);
    if (name == "__metadata__") bad("the name is reserved for metadata");
    if (!names.insert(name).second) bad("the name appears twice");
    if (!t.defined()) bad("tensor is undefined");
    if (!t.has_storage()) bad("tensor has no data (a fake tensor)");
    Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
    out.emplace_back(name, h.contiguous());
  }
  return out;
}

void write_safetensors(const NamedTensors& host, const std::map<std::string, std::string>& metadata,
                       const std::string& target, const Sink& sink) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : host) {
    ordered_json shape = ordered_json::array();
    for (int64_t d : t.sizes()) shape.push_back(d);
    uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", std::move(shape)},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::exception& e) {
    fail("save_safetensors '{}': cannot encode the header (names must be UTF-8): {}", target,
         e.what());
  }
  // Pad so that the data section (and so every tensor of aligned size) starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  sink(len, 8);
  sink(text.data(), text.size());
  for (const auto& [name, t] : host)
    if (t.nbytes()) sink(t.raw_data(), t.nbytes());
}

std::string errno_str(int e) { return std::strerror(e); }

}  // namespace

const char* safetensors_dtype_name(DType d) {
  for (const auto& s : kStDTypes)
    if (s.dtype == d) return s.name;
  KILN_ASSERT(false);
}

std::vector<uint8_t> safetensors_bytes(const NamedTensors& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  NamedTensors host = host_tensors(tensors, "<memory>");
  std::vector<uint8_t> out;
  write_safetensors(host, metadata, "<memory>", [&](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  NamedTensors host = host_tensors(tensors, path);
  // A temp file next to the target, renamed into place: never a half-written weights file.
  AtomicFile file(path, "save_safetensors");
  write_safetensors(host, metadata, path, [&](const void* p, size_t n) { file.write(p, n); });
  file.commit();
}

namespace {
// The header of safetensors bytes, checked: its entries (offsets relative to the data section),
// its metadata into `metadata`, and where the data section starts.
std::vector<Entry> bytes_header(std::span<const uint8_t> bytes, const std::string& source,
                                std::map<std::string, std::string>& metadata,
                                uint64_t* data_start) {
  if (bytes.size() < 8)
    parse_fail(source, fmt::format("{} bytes is too short for the 8-byte header length",
                                   bytes.size()));
  uint64_t header_len = read_le64(bytes.data());
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8)
    parse_fail(source, fmt::format("header length {} exceeds the {} bytes that follow it",
                                   header_len, bytes.size() - 8));
  *data_start = 8 + header_len;
  return parse_header(reinterpret_cast<const char*>(bytes.data() + 8), header_len,
                      bytes.size() - 8 - header_len, source, metadata);
}
}  // namespace

SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes, const std::string& source) {
  SafetensorsContents out;
  uint64_t data_start = 0;
  const std::vector<Entry> entries = bytes_header(bytes, source, out.metadata, &data_start);
  const uint8_t* data = bytes.data() + data_start;
  for (const Entry& e : entries)
    out.tensors.emplace_back(e.name, host_tensor(e.sizes, e.dtype, data + e.begin, e.end - e.begin));
  return out;
}

Tensor safetensors_entry_tensor(std::span<const uint8_t> bytes, const SafetensorsEntry& e) {
  return host_tensor(e.sizes, e.dtype, bytes.data() + e.offset, e.nbytes);
}

std::vector<SafetensorsEntry> parse_safetensors_entries(std::span<const uint8_t> bytes,
                                                        const std::string& source) {
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
  std::vector<SafetensorsEntry> out;
  for (Entry& e : bytes_header(bytes, source, metadata, &data_start))
    out.push_back({std::move(e.name), e.dtype, std::move(e.sizes), data_start + e.begin,
                   e.end - e.begin});
  return out;
}

SafetensorsContents load_safetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("safetensors '{}': cannot open: {}", path, errno_str(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("safetensors '{}': cannot stat: {}", path, errno_str(errno));
  if (!S_ISREG(st.st_mode)) fail("safetensors '{}': not a regular file", path);
  uint64_t file_size = uint64_t(st.st_size);

  auto read_at = [&](void* dst, uint64_t n, uint64_t offset, const char* what) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd, p, n, off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) parse_fail(path, fmt::format("reading {} failed: {}", what, errno_str(errno)));
      if (r == 0) parse_fail(path, fmt::format("file ended while reading {}", what));
      p += r;
      n -= uint64_t(r);
      offset += uint64_t(r);
    }
  };
  if (file_size < 8)
    parse_fail(path, fmt::format("{} bytes is too short for the 8-byte header length", file_size));
  uint8_t len[8];
  read_at(len, 8, 0, "the header length");
  uint64_t header_len = read_le64(len);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    parse_fail(path, fmt::format("header length {} exceeds the {} bytes that follow it (file "
                                 "truncated or not safetensors)",
                                 header_len, file_size - 8));
  std::string header(header_len, '\0');
  read_at(header.data(), header_len, 8, "the header");
  SafetensorsContents out;
  uint64_t data_start = 8 + header_len;
  auto entries = parse_header(header.data(), header.size(), file_size - data_start, path,
                              out.metadata);
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.sizes, e.dtype);
    if (e.end > e.begin)
      read_at(t.raw_data(), e.end - e.begin, data_start + e.begin,
              fmt::format("tensor '{}'", e.name).c_str());
    normalize_bools(t);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace kiln
