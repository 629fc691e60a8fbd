#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <cstring>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "runtime/npy.h"

using namespace kiln;

TEST(DType, PromotionRules) {
  EXPECT_EQ(promote_types(DType::Float32, DType::Float64), DType::Float64);
  EXPECT_EQ(promote_types(DType::Float16, DType::BFloat16), DType::Float32);
  EXPECT_EQ(promote_types(DType::Int32, DType::Float16), DType::Float16);
  EXPECT_EQ(promote_types(DType::Int64, DType::Int32), DType::Int64);
  EXPECT_EQ(promote_types(DType::UInt8, DType::Int8), DType::Int32);
  EXPECT_EQ(promote_types(DType::Bool, DType::Int8), DType::Int8);
  EXPECT_EQ(promote_types(DType::Bool, DType::Bool), DType::Bool);
  DType d;
  EXPECT_TRUE(parse_dtype("bf16", &d));
  EXPECT_EQ(d, DType::BFloat16);
  EXPECT_TRUE(parse_dtype("float64", &d));
  EXPECT_EQ(d, DType::Float64);
  EXPECT_FALSE(parse_dtype("f128", &d));
}

TEST(DType, HalfConversionIsCorrectlyRounded) {
  // Every half value converts to float and back exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Half::to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(Half::from_float(f), uint16_t(h)) << h;
  }
  // Midpoints round to even; overflow goes to inf; tiny values to subnormals.
  EXPECT_EQ(float(Half(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(float(Half(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_TRUE(std::isinf(float(Half(70000.0f))));
  EXPECT_EQ(float(Half(65504.0f)), 65504.0f);
  EXPECT_EQ(float(Half(5.960464477539063e-08f)), 5.960464477539063e-08f);
  EXPECT_TRUE(std::isnan(float(Half(NAN))));
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(float(BFloat16(1.00390625f)), 1.0f);    // exact midpoint -> even
  EXPECT_EQ(float(BFloat16(1.01171875f)), 1.015625f);  // midpoint above odd -> up
  EXPECT_TRUE(std::isnan(float(BFloat16(NAN))));
}

TEST(DType, SaturatingFloatToInt) {
  int8_t i8;
  store_f64(&i8, DType::Int8, 1000.0);
  EXPECT_EQ(i8, 127);
  store_f64(&i8, DType::Int8, NAN);
  EXPECT_EQ(i8, 0);
  uint8_t u8;
  store_f64(&u8, DType::UInt8, -3.0);
  EXPECT_EQ(u8, 0);
  int64_t i64;
  store_f64(&i64, DType::Int64, -2.7);
  EXPECT_EQ(i64, -2);  // truncation toward zero
}

TEST(Tensor, ViewsShareStorageAndVersion) {
  Generator g(1);
  Tensor t = Tensor::randn({2, 3}, g);
  EXPECT_TRUE(t.is_contiguous());
  Tensor tt = t.as_strided({3, 2}, {1, 3}, 0);  // transpose view
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.impl()->storage.get(), t.impl()->storage.get());
  t.data<float>()[1] = 42.0f;  // t[0][1] == tt[1][0]
  EXPECT_EQ(tt.contiguous().data<float>()[2], 42.0f);
  uint64_t v = tt.version();
  Tensor src = Tensor::randn({3, 2}, g);
  tt.copy_(src);
  EXPECT_GT(t.version(), v);  // version is per storage: writes through a view count
  EXPECT_EQ(t.to_vector<float>()[3], src.to_vector<float>()[1]);  // t[1][0] == tt[0][1]
}

TEST(Tensor, RefcountReleasesStorage) {
  Tensor a = Tensor::zeros({4});
  Storage* s = a.impl()->storage.get();
  EXPECT_EQ(s->ref_count(), 1);
  {
    Tensor view = a.as_strided({2}, {2}, 1);
    EXPECT_EQ(s->ref_count(), 2);
  }
  EXPECT_EQ(s->ref_count(), 1);
}

TEST(Tensor, AsStridedOutOfBoundsIsAnError) {
  Tensor a = Tensor::zeros({4});
  EXPECT_THROW(a.as_strided({3}, {2}, 0), Error);
  EXPECT_THROW(a.as_strided({2}, {1}, 3), Error);
}

TEST(Tensor, CopyConvertsDtypesAndStrides) {
  Generator g(2);
  Tensor a = Tensor::randn({3, 4}, g, DType::Float64);
  Tensor at = a.as_strided({4, 3}, {1, 4}, 0);
  Tensor h = Tensor::empty({4, 3}, DType::Float16);
  h.copy_(at);
  std::vector<double> av = at.to_vector<double>();
  std::vector<float> hv = h.to_vector<float>();
  for (size_t i = 0; i < av.size(); ++i) EXPECT_EQ(hv[i], float(Half(float(av[i]))));
}

TEST(Tensor, GeneratorIsDeterministic) {
  Generator g1(7), g2(7), g3(8);
  Tensor a = Tensor::randn({100}, g1), b = Tensor::randn({100}, g2), c = Tensor::randn({100}, g3);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  // Roughly standard normal.
  Generator g(3);
  Tensor big = Tensor::randn({20000}, g, DType::Float64);
  double s = 0, s2 = 0;
  for (double v : big.to_vector<double>()) s += v, s2 += v * v;
  EXPECT_NEAR(s / 20000, 0.0, 0.05);
  EXPECT_NEAR(s2 / 20000, 1.0, 0.05);
}

TEST(Tensor, FakeTensorsHaveNoData) {
  Tensor f = Tensor::fake({2, 2}, DType::Float32);
  EXPECT_FALSE(f.has_storage());
  EXPECT_THROW(f.raw_data(), Error);
}

TEST(Allocator, CpuAllocationsAreAligned) {
  for (size_t n : {1, 3, 64, 1000, 1 << 20}) {
    void* p = cpu_allocator()->allocate(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kCpuAlignment, 0u);
    cpu_allocator()->deallocate(p, n);
  }
}

TEST(Cuda, NoDeviceIsReportedCleanly) {
  std::string s = cuda_status();
  if (cuda_device_count() == 0) {
    EXPECT_EQ(s.rfind("no CUDA device", 0), 0u) << s;
    try {
      Tensor::zeros({2}, DType::Float32, Device::cuda(0));
      FAIL() << "allocating on a missing device must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_NE(s.find("CUDA device(s)"), std::string::npos) << s;
  }
}

namespace {
std::string temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("kiln_core_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}
std::string python() {
  if (const char* p = std::getenv("KILN_PYTHON")) return p;
  return std::string(std::getenv("HOME") ? std::getenv("HOME") : "/root") +
         "/.cache/kiln/venv/bin/python";
}
}  // namespace

TEST(Npy, RoundTripAllDtypes) {
  Generator g(4);
  std::string dir = temp_dir();
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::Int64, DType::Int32,
                  DType::Int8, DType::UInt8, DType::Bool}) {
    Tensor t = Tensor::randn({2, 3, 5}, g, DType::Float64).to(d);
    std::string p = dir + "/t.npy";
    write_npy(p, t);
    Tensor r = read_npy(p);
    EXPECT_EQ(r.dtype(), d);
    EXPECT_EQ(r.sizes(), t.sizes());
    EXPECT_EQ(std::memcmp(r.raw_data(), t.raw_data(), t.nbytes()), 0) << dtype_name(d);
  }
  Tensor s = Tensor::scalar(3.5, DType::Float32);
  write_npy(dir + "/s.npy", s);
  EXPECT_EQ(read_npy(dir + "/s.npy").item(), 3.5);
  std::filesystem::remove_all(dir);
}

TEST(Npy, CorruptFilesAreErrors) {
  std::string dir = temp_dir();
  Generator g(5);
  write_npy(dir + "/ok.npy", Tensor::randn({10, 10}, g));
  std::ifstream in(dir + "/ok.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (size_t cut : {size_t(3), size_t(20), bytes.size() - 1}) {
    std::ofstream(dir + "/bad.npy", std::ios::binary).write(bytes.data(), std::streamsize(cut));
    EXPECT_THROW(read_npy(dir + "/bad.npy"), Error) << cut;
  }
  std::string huge = bytes;
  size_t pos = huge.find("(10, 10)");
  huge.replace(pos, 8, "(99999999999, 99999999999)");
  std::ofstream(dir + "/huge.npy", std::ios::binary).write(huge.data(), std::streamsize(huge.size()));
  EXPECT_THROW(read_npy(dir + "/huge.npy"), Error);
  EXPECT_THROW(read_npy(dir + "/missing.npy"), Error);
  std::filesystem::remove_all(dir);
}

// A size-0 tensor whose other sizes' product overflows int64 (an ONNX initializer of dims
// [63, 2^63 - 2^41, 0] made contiguous_strides and is_contiguous overflow: UBSan, found by
// tests/fuzz/onnx_import_fuzz.cc), and a non-empty one whose byte size does, are errors.
TEST(Tensor, SizesWhoseProductOverflowsAreErrors) {
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THROW(Tensor::empty(Dims({63, huge, 0}), DType::Int8), Error);
  EXPECT_THROW(Tensor::fake(Dims({0, huge, huge}), DType::Float32), Error);
  EXPECT_THROW(Tensor::empty(Dims({int64_t(1) << 31, int64_t(1) << 31}), DType::Float64), Error);
  EXPECT_EQ(Tensor::empty(Dims({huge / 8, 0}), DType::Float32).numel(), 0);
}

// A version 1.0 .npy file whose header is exactly `header` (no padding), then `data_bytes`
// zero bytes.
static std::vector<uint8_t> npy_with_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(header.size() & 0xff),
                            uint8_t(header.size() >> 8)};
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data_bytes);
  return b;
}

TEST(Npy, InMemoryRoundTripMatchesTheFile) {
  Generator g(7);
  Tensor t = Tensor::randn({3, 1, 2}, g);
  std::vector<uint8_t> bytes = npy_bytes(t);
  std::string dir = temp_dir();
  write_npy(dir + "/m.npy", t);
  std::ifstream in(dir + "/m.npy", std::ios::binary);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(std::vector<uint8_t>(file.begin(), file.end()), bytes);
  Tensor r = parse_npy(bytes);
  EXPECT_EQ(r.sizes(), t.sizes());
  EXPECT_EQ(std::memcmp(r.raw_data(), t.raw_data(), t.nbytes()), 0);
  std::filesystem::remove_all(dir);
}

// Malformed header dicts that once read past the header (a key with no value after it: the
// value's first character was read at std::string::npos), threw std::out_of_range (an empty
// shape), or were silently accepted ("(3x, 2)" as (3, 2)). Each is now a kiln::Error naming
// the file. Found while adding the .npy fuzz harness (tests/fuzz/npy_fuzz.cc).
TEST(Npy, MalformedHeadersAreParseErrors) {
  struct Case {
    std::string dict;
    size_t data_bytes;
    std::string expected;
  };
  const Case cases[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape':", 0, "no value for 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape'", 0, "no ':' after 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': , }", 0, "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': 6, }", 24, "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3x, 2), }", 24, "expected ','"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", 0, "expected a size"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
       "more than 8 dimensions"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 4,
       "size too large"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }", 4, "not supported"},
      {"{'descr': '<f4', 'fortran_order': False", 0, "unterminated value"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bytes = npy_with_header(c.dict, c.data_bytes);
    try {
      parse_npy(bytes, "case.npy");
      ADD_FAILURE() << "accepted: " << c.dict;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("case.npy"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos)
          << c.dict << " -> " << e.what();
    }
  }
  // The well-formed variants of the same header parse.
  Tensor t = parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 24));
  EXPECT_EQ(t.sizes(), Dims({3, 2}));
  Tensor s = parse_npy(npy_with_header("{'descr':'<i8','fortran_order':False,'shape':()}", 8));
  EXPECT_EQ(s.sizes().size(), 0u);
}

TEST(Npy, InteroperatesWithNumPy) {
  std::string py = python();
  ASSERT_TRUE(std::filesystem::exists(py)) << "Python venv missing at " << py
                                           << ": run scripts/setup_python.sh";
  std::string dir = temp_dir();
  Generator g(6);
  Tensor t = Tensor::randn({3, 4}, g);
  write_npy(dir + "/k.npy", t);
  std::string cmd = py + " -c \"import numpy as np; a = np.load('" + dir +
                    "/k.npy'); assert a.shape == (3, 4) and a.dtype == np.float32; "
                    "np.save('" + dir + "/n.npy', (a * 2).astype(np.float64))\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Tensor n = read_npy(dir + "/n.npy");
  ASSERT_EQ(n.dtype(), DType::Float64);
  auto tv = t.to_vector<float>();
  auto nv = n.to_vector<double>();
  for (size_t i = 0; i < tv.size(); ++i) EXPECT_EQ(nv[i], double(tv[i]) * 2);
  std::filesystem::remove_all(dir);
}
