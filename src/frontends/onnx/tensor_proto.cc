// TensorProto <-> Tensor: dtype mapping, size validation, external data. See Note [ONNX import].
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {

namespace fs = std::filesystem;

bool dtype_from_onnx(int32_t t, DType* out) {
  switch (t) {
    case pb::TensorProto::FLOAT: *out = DType::Float32; return true;
    case pb::TensorProto::UINT8: *out = DType::UInt8; return true;
    case pb::TensorProto::INT8: *out = DType::Int8; return true;
    case pb::TensorProto::INT32: *out = DType::Int32; return true;
    case pb::TensorProto::INT64: *out = DType::Int64; return true;
    case pb::TensorProto::BOOL: *out = DType::Bool; return true;
    case pb::TensorProto::FLOAT16: *out = DType::Float16; return true;
    case pb::TensorProto::DOUBLE: *out = DType::Float64; return true;
    case pb::TensorProto::BFLOAT16: *out = DType::BFloat16; return true;
    default: return false;
  }
}

int32_t onnx_type_from_dtype(DType d) {
  switch (d) {
    case DType::Float32: return pb::TensorProto::FLOAT;
    case DType::UInt8: return pb::TensorProto::UINT8;
    case DType::Int8: return pb::TensorProto::INT8;
    case DType::Int32: return pb::TensorProto::INT32;
    case DType::Int64: return pb::TensorProto::INT64;
    case DType::Bool: return pb::TensorProto::BOOL;
    case DType::Float16: return pb::TensorProto::FLOAT16;
    case DType::Float64: return pb::TensorProto::DOUBLE;
    case DType::BFloat16: return pb::TensorProto::BFLOAT16;
  }
  return pb::TensorProto::UNDEFINED;
}

std::string onnx_type_name(int32_t t) {
  if (pb::TensorProto::DataType_IsValid(t)) {
    std::string s = pb::TensorProto::DataType_Name(pb::TensorProto::DataType(t));
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  return fmt::format("type {}", t);
}

namespace {

// Bytes of an external-data tensor, read from a file inside model_dir.
std::string read_external(const pb::TensorProto& t, const std::string& model_dir,
                          int64_t expected_bytes, const std::string& what) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const pb::StringStringEntryProto& e : t.external_data()) {
    auto parse_int = [&](const std::string& s) {
      int64_t v = 0;
      if (s.empty() || s.size() > 18) fail_kind(ErrorKind::ParseError, "{}: external data '{}' = '{}' is not a valid size", what, e.key(), s);
      for (char c : s) {
        if (c < '0' || c > '9')
          fail_kind(ErrorKind::ParseError, "{}: external data '{}' = '{}' is not a valid size", what, e.key(), s);
        v = v * 10 + (c - '0');
      }
      return v;
    };
    if (e.key() == "location") location = e.value();
    else if (e.key() == "offset") offset = parse_int(e.value());
    else if (e.key() == "length") length = parse_int(e.value());
  }
  if (location.empty())
    fail_kind(ErrorKind::ParseError, "{}: external data without a 'location'", what);
  if (model_dir.empty())
    fail_kind(ErrorKind::InvalidArgument,
              "{}: external data '{}' cannot be resolved (the model was not read from a file)",
              what, location);
  fs::path rel(location);
  bool escapes = rel.is_absolute() || rel.has_root_name() || rel.has_root_directory();
  for (const fs::path& part : rel)
    if (part == "..") escapes = true;
  // Symlinks inside the directory could still point elsewhere: compare resolved paths.
  std::error_code ec;
  fs::path root = fs::canonical(model_dir, ec);
  fs::path file = fs::weakly_canonical(fs::path(model_dir) / rel, ec);
  if (!escapes && !ec) {
    auto r = root.begin(), f = file.begin();
    for (; r != root.end(); ++r, ++f)
      if (f == file.end() || *r != *f) escapes = true;
  }
  if (escapes)
    fail_kind(ErrorKind::InvalidArgument,
              "{}: external data location '{}' leaves the model directory {}; it must be a "
              "relative path inside it", what, location, model_dir);
  if (ec || !fs::is_regular_file(file))
    fail_kind(ErrorKind::InvalidArgument, "{}: external data file '{}' not found in {}", what,
              location, model_dir);
  int64_t size = int64_t(fs::file_size(file, ec));
  if (length < 0) length = size - offset;
  if (length != expected_bytes)
    fail_kind(ErrorKind::InvalidArgument,
              "{}: external data '{}' holds {} bytes, the tensor's dims need {}", what, location,
              length, expected_bytes);
  if (offset > size || length > size - offset)
    fail_kind(ErrorKind::InvalidArgument,
              "{}: external data '{}' is truncated: offset {} + length {} > file size {}", what,
              location, offset, length, size);
  std::string bytes(size_t(length), '\0');
  std::ifstream in(file, std::ios::binary);
  in.seekg(offset);
  in.read(bytes.data(), std::streamsize(length));
  if (!in) fail_kind(ErrorKind::Runtime, "{}: cannot read external data '{}'", what, location);
  return bytes;
}

// The typed repeated fields, converted element by element into out's dtype.
template <typename Field>
void copy_field(const Field& f, Tensor& out) {
  char* p = static_cast<char*>(out.raw_data());
  int64_t es = out.element_size();
  bool floating = is_floating(out.dtype());
  for (int i = 0; i < f.size(); ++i) {
    if (floating) store_f64(p + i * es, out.dtype(), double(f.Get(i)));
    else store_i64(p + i * es, out.dtype(), int64_t(f.Get(i)));
  }
}

}  // namespace

Tensor tensor_from_proto(const pb::TensorProto& t, const std::string& model_dir,
                         int64_t max_bytes, const std::string& what) {
  DType dtype = DType::Float32;
  if (!dtype_from_onnx(t.data_type(), &dtype))
    fail_kind(ErrorKind::NotSupported, "{}: element type {} is not supported by Kiln", what,
              onnx_type_name(t.data_type()));
  if (t.has_segment())
    fail_kind(ErrorKind::NotSupported, "{}: segmented tensors are not supported", what);
  if (t.dims_size() > kMaxRank)
    fail_kind(ErrorKind::NotSupported, "{}: rank {} exceeds Kiln's maximum rank {}", what,
              t.dims_size(), kMaxRank);
  Dims dims;
  int64_t n = 1;
  int64_t elem = dtype_size(dtype);
  for (int64_t d : t.dims()) {
    if (d < 0) fail_kind(ErrorKind::InvalidArgument, "{}: negative dim {}", what, d);
    dims.push_back(d);
    if (d != 0 && n > max_bytes / elem / d)
      fail_kind(ErrorKind::InvalidArgument,
                "{}: dims {} need more than the {}-byte tensor limit (ImportOptions::"
                "max_tensor_bytes)", what, to_string(Dims(t.dims().begin(), t.dims().end())),
                max_bytes);
    n *= d;
  }
  int64_t nbytes = n * elem;

  bool external = t.data_location() == pb::TensorProto::EXTERNAL;
  const std::string* raw = t.has_raw_data() ? &t.raw_data() : nullptr;
  std::string ext_bytes;
  if (external) {
    ext_bytes = read_external(t, model_dir, nbytes, what);
    raw = &ext_bytes;
  }
  Tensor out = Tensor::empty(dims, dtype);
  if (raw) {
    if (int64_t(raw->size()) != nbytes)
      fail_kind(ErrorKind::InvalidArgument,
                "{}: raw data holds {} bytes, dims {} of {} need {}", what, raw->size(),
                to_string(dims), dtype_name(dtype), nbytes);
    if (nbytes) std::memcpy(out.raw_data(), raw->data(), size_t(nbytes));
    if (dtype == DType::Bool) {  // any nonzero byte is true; Kiln bools are 0/1
      auto* p = static_cast<uint8_t*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] != 0;
    }
    return out;
  }
  int64_t have = 0;
  switch (t.data_type()) {
    case pb::TensorProto::FLOAT: have = t.float_data_size(); break;
    case pb::TensorProto::DOUBLE: have = t.double_data_size(); break;
    case pb::TensorProto::INT64: have = t.int64_data_size(); break;
    default: have = t.int32_data_size(); break;
  }
  if (have != n)
    fail_kind(ErrorKind::InvalidArgument, "{}: holds {} values, dims {} need {}", what, have,
              to_string(dims), n);
  if (n == 0) return out;
  switch (t.data_type()) {
    case pb::TensorProto::FLOAT: copy_field(t.float_data(), out); break;
    case pb::TensorProto::DOUBLE: copy_field(t.double_data(), out); break;
    case pb::TensorProto::INT64: copy_field(t.int64_data(), out); break;
    case pb::TensorProto::FLOAT16:
    case pb::TensorProto::BFLOAT16: {  // int32_data holds the 16-bit patterns
      auto* p = static_cast<uint16_t*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) p[i] = uint16_t(t.int32_data(int(i)));
      break;
    }
    case pb::TensorProto::BOOL: {
      auto* p = static_cast<uint8_t*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) p[i] = t.int32_data(int(i)) != 0;
      break;
    }
    default: copy_field(t.int32_data(), out); break;
  }
  return out;
}

}  // namespace kiln::onnx
