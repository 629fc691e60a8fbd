// Note [Filters stored KRSC at load] (runtime/launch_cuda.cc): which constants a CUDA package's
// load stores KRSC (filters_to_store_krsc, from the records alone), and the permutation itself.
// Plain data: runs on any machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/launch_library.h"

namespace kiln {
namespace {

using json = nlohmann::json;

// A channels-last bf16 convolution record reading filter slot `w` ([c_out, c_in/g, kh, kw]).
LaunchRecord conv(int32_t w, int64_t c_in, int64_t c_out, int64_t k, int64_t groups = 1,
                  bool w_krsc = true, int64_t w_offset = 0) {
  json desc = {{"kind", "forward"}, {"dtype", "bfloat16"}, {"layout", w_krsc ? "nhwc" : "nchw"},
               {"n", 1}, {"c_in", c_in}, {"h", 8}, {"w", 8}, {"c_out", c_out}, {"kh", k},
               {"kw", k}, {"groups", groups}, {"stride", {2, 2}}, {"pad_pre", {1, 1}},
               {"pad_post", {1, 1}}, {"dilation", {1, 1}}, {"output_padding", {0, 0}},
               {"bias", true}, {"residual", false}, {"relu", true}, {"allow_tf32", false},
               {"alignment_bytes", 16}};
  json p = {{"desc", desc}, {"engine", "eng0"}, {"x", {0, 0}}, {"w", {w, w_offset}},
            {"bias", {9, 0}}, {"y", {0, 8192}}, {"residual", {-1, 0}}, {"workspace", {0, 65536}},
            {"workspace_bytes", 0}, {"pre", json::array()}, {"post", json::array()},
            {"w_krsc", w_krsc}};
  return {"cudnn_conv", p.dump()};
}

LaunchRecord kernel_reading(int32_t slot) {
  json p = {{"module", "m"}, {"kernel", "k"}, {"grid", 4}, {"block", 128}, {"shared", 0},
            {"args", {{0, 0}, {slot, 0}}}};
  return {"cuda_kernel", p.dump()};
}

int64_t bf16_filter_bytes(int64_t k, int64_t c, int64_t rs) { return k * c * rs * 2; }

TEST(KrscFilters, OnlyFiltersThatChannelsLastConvolutionsAloneReadWhole) {
  // Slots: 1 input; 2..8 constants.
  std::vector<int64_t> bytes(12, 0);
  bytes[2] = bf16_filter_bytes(32, 16, 9);  // read by two convolutions of the same shape
  bytes[3] = bf16_filter_bytes(32, 16, 9);  // also read by a kernel
  bytes[4] = bf16_filter_bytes(32, 16, 9);  // a graph output
  bytes[5] = bf16_filter_bytes(32, 16, 9);  // read by an NCHW convolution too
  bytes[6] = bf16_filter_bytes(32, 16, 9) * 2;  // read at an offset (half of it)
  bytes[7] = bf16_filter_bytes(32, 16, 1);  // 1x1: stored as is, still selected
  bytes[8] = bf16_filter_bytes(32, 16, 9);  // read by convolutions of two shapes
  bytes[9] = 64;                            // a bias (in every record's "bias": never selected)
  std::vector<LaunchRecord> records = {
      conv(2, 16, 32, 3), conv(2, 16, 32, 3), conv(3, 16, 32, 3), kernel_reading(3),
      conv(5, 16, 32, 3), conv(5, 16, 32, 3, 1, /*w_krsc=*/false),
      conv(6, 16, 32, 3, 1, true, /*w_offset=*/bf16_filter_bytes(32, 16, 9)), conv(7, 16, 32, 1),
      conv(8, 16, 32, 3), conv(8, 32, 16, 3), conv(4, 16, 32, 3),
      {"cudnn_conv", "{not json"}};
  std::map<int32_t, KrscFilter> got = filters_to_store_krsc(records, bytes, /*outputs=*/{1, 4});
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(got.count(2));
  EXPECT_EQ(got[2].k, 32);
  EXPECT_EQ(got[2].c, 16);
  EXPECT_EQ(got[2].rs, 9);
  EXPECT_EQ(got[2].elem_bytes, 2);
  ASSERT_TRUE(got.count(7));
  EXPECT_EQ(got[7].rs, 1);
  // A desc's pairs (stride {2, 2}, padding {1, 1}) are not references: slot 2 stays selected
  // even though "stride" reads [2, 2]; with a real reference it goes.
  records.push_back(kernel_reading(2));
  EXPECT_FALSE(filters_to_store_krsc(records, bytes, {1, 4}).count(2));
  // Grouped: c = c_in / groups.
  std::vector<int64_t> g(4, 0);
  g[2] = bf16_filter_bytes(64, 8, 9);
  std::map<int32_t, KrscFilter> grouped =
      filters_to_store_krsc({conv(2, 32, 64, 3, /*groups=*/4)}, g, {});
  ASSERT_TRUE(grouped.count(2));
  EXPECT_EQ(grouped[2].c, 8);
  // A constant whose size is not the filter's is left alone.
  g[2] += 2;
  EXPECT_TRUE(filters_to_store_krsc({conv(2, 32, 64, 3, 4)}, g, {}).empty());
}

TEST(KrscFilters, PermuteMovesEveryElementToItsKrscPlace) {
  std::mt19937 rng(7);
  for (int64_t es : {2, 4, 8}) {
    const KrscFilter f{5, 3, 7, es};
    const int64_t n = f.k * f.c * f.rs;
    std::vector<uint8_t> from(size_t(n * es)), to(size_t(n * es), 0);
    for (uint8_t& b : from) b = uint8_t(rng());
    f.permute(from.data(), to.data());
    for (int64_t k = 0; k < f.k; ++k)
      for (int64_t c = 0; c < f.c; ++c)
        for (int64_t p = 0; p < f.rs; ++p)
          for (int64_t b = 0; b < es; ++b)
            ASSERT_EQ(to[size_t(((k * f.rs + p) * f.c + c) * es + b)],
                      from[size_t(((k * f.c + c) * f.rs + p) * es + b)])
                << "k " << k << " c " << c << " rs " << p << " element size " << es;
  }
}

// restore undoes permute (a package written from an executable that holds its filters KRSC
// stores them KCRS: Note [Filters stored KRSC in process]), for every element size, and for
// 1x1 / depthwise filters (identity: a copy).
TEST(KrscFilters, RestoreUndoesPermute) {
  std::mt19937 rng(8);
  for (int64_t es : {2, 4, 8})
    for (const KrscFilter f : {KrscFilter{6, 5, 9, es}, KrscFilter{4, 8, 1, es}, KrscFilter{3, 1, 25, es}}) {
      const size_t bytes = size_t(f.bytes());
      std::vector<uint8_t> from(bytes), krsc(bytes, 0), back(bytes, 0);
      for (uint8_t& b : from) b = uint8_t(rng());
      f.permute(from.data(), krsc.data());
      if (!f.identity()) EXPECT_NE(krsc, from) << "a permutation that moved nothing";
      f.restore(krsc.data(), back.data());
      EXPECT_EQ(back, from) << "k " << f.k << " c " << f.c << " rs " << f.rs << " element size " << es;
    }
}

}  // namespace
}  // namespace kiln
