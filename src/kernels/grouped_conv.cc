// Note [Kiln grouped convolution]
// ResNeXt's 3x3 convolutions have 4-32 channels per group (32 groups), RegNet's 8-48. oneDNN
// 2.6 runs such a convolution, in any layout, far from this CPU's FLOP rate: with 4 channels
// per group (ResNeXt-50's layer1, 128 -> 128 at 56x56) its best kernel takes 1.0-1.1 ms a call
// on one core, 6-7x the 0.16 ms its multiply-adds need (Note [convolution roofline]); oneDNN
// vectorizes over the channels of a group, and 4 of them fill a quarter of a 16-lane vector.
//
// This kernel vectorizes over the output's columns instead, which every group has many of. Work
// is split over (image, band of 8 output rows); a thread then takes the band's groups one after
// another: it stages the group's input channels for the band into a zero-padded plane (scratch
// per thread: the borders are zeros, so the inner loop has no bounds tests), then for each
// block of 4 output channels, each 4 output rows (2 without AVX-512's 32 registers) and each
// run of V output columns (V = 16 floats with AVX-512, 8 with AVX2, 4 otherwise) it keeps 4 x 4
// vector accumulators and, per input channel and tap, loads the 4 rows' V inputs once and adds
// them times the 4 output channels' weights (broadcast from a weight array rearranged as
// [group][block][channel][tap][4] at build time): 16 fused multiply-adds per 4 loads and 4
// broadcasts. The epilogue is oneDNN's order: + bias, + sum_scale * residual, then relu or clamp
// (NaN kept, as Kiln's relu and clamp keep it). A last partial run of columns is computed as a
// whole run ending at the row's end (overlapping the one before, to the same values), or lane
// by lane where the row is shorter than a vector or the residual is the output's own buffer.
// x and y may be NCHW or NHWC, so that between oneDNN convolutions computing in nhwc the node
// needs no reorder (a first NCHW-only version won its own timing and made the next 1x1
// convolution reorder back: slower overall). NHWC is staged 4 channels at a time, each pixel's
// 16 bytes joined into vectors in registers and transposed with two rounds of shuffles, and
// stored through the inverse; the band keeps every channel of its pixels in the caches while
// the thread goes through the groups.
//
// Float32 only, strides 1 and 2 (a stride-2 row is staged as two phases, even and odd input
// columns, so that a run of output columns still reads contiguous staged columns; from NCHW,
// 2V inputs at a time split into their even and odd elements by two shuffles), no dilation;
// also ungrouped convolutions of at most 4 input channels (image stems, where oneDNN's kernels
// vectorize over input channels too). The epilogue may end in silu (EfficientNet's stems and
// depthwise convolutions), v / (1 + e^-v) with a vector exp (exp_of below). A stem with NHWC
// out and a multiple of 8 output channels runs on output-channel vectors instead (Note [Image
// stems on output-channel vectors]), the bands keeping the others (NCHW out). It is not chosen
// by a rule:
// it is one more candidate of the measured convolution layout (Note [measured convolution
// layout] in targets/cpu/onednn_lowering.cc), conv_layout "kiln-direct", timed beside oneDNN's
// layouts with its reorders, for convolutions that oneDNN leaves more than 3x from their
// roofline; the knob grouped_conv=kiln pins it (tests), grouped_conv=onednn never tries it.
// The sums run over (channel, kh, kw) in a different order than the float64 reference's, as
// oneDNN's do; the result is within float32's tolerance.
//
// Tried and dropped: the three taps of a 3-wide filter from two aligned loads and two shifts
// (valignd) instead of three loads that straddle cache lines, 0.29-0.34 -> 0.37-0.42 ms on
// ResNeXt's 56x56 shape (NCHW, one thread, the two builds one after the other): on this CPU the
// shifts take the port that the second FMA pipe uses. The compute runs at about 45% of the FMA
// peak (0.29 ms for 29 MFLOP at best); the NHWC path adds its staging and stores (0.48-0.59).
#include "kernels/grouped_conv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/parallel.h"

namespace kiln::kernels {

namespace {

constexpr int kBlock = 4;  // output channels per block
// Output rows per band: a thread stages and computes every group of one band before the next,
// so that with NHWC values the band's pixels (all channels) stay in its caches.
constexpr int64_t kBand = 8;

template <int V>
struct VecOf;
template <>
struct VecOf<16> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<4> {
  typedef float type __attribute__((vector_size(16)));
};

// Note [Kiln grouped convolution], NHWC output: four vectors a, b, c, d of V columns each (4
// consecutive output channels) interleaved into four vectors of (column, channel) pairs, each
// holding V / 4 columns' 4 channels: what NHWC memory holds at those pixels. Two rounds of
// two-input shuffles (vpermt2ps with AVX-512). __builtin_shufflevector takes its indices as
// constants (GCC 12 and clang alike), so each width spells them out. With index lists
//   lo:    0, V, 1, V+1, ... (the first halves, alternating)    hi: the same from V/2
//   pairs: 0, 1, V, V+1, 2, 3, V+2, V+3, ... (pairs alternating), from 0 and from V/2.
#define KN_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#define KN_LIST(...) __VA_ARGS__
// Both directions are two rounds of shuffles with the same pairing: lists A and B take the
// first round over (in0, in1) and (in2, in3), lists C and D the second over the results.
//   interleave:   A = lo, B = hi, C = pairs from 0, D = pairs from V/2
//   deinterleave: A = the even pairs, B = the odd pairs, C = even elements, D = odd elements
#define KN_TWO_ROUNDS(A, B, C, D)                                                         \
  const vf p0 = KN_SHUF(in[0], in[1], KN_LIST A), p1 = KN_SHUF(in[0], in[1], KN_LIST B); \
  const vf p2 = KN_SHUF(in[2], in[3], KN_LIST A), p3 = KN_SHUF(in[2], in[3], KN_LIST B); \
  out[0] = KN_SHUF(p0, p2, KN_LIST C);                                                   \
  out[1] = KN_SHUF(p0, p2, KN_LIST D);                                                   \
  out[2] = KN_SHUF(p1, p3, KN_LIST C);                                                   \
  out[3] = KN_SHUF(p1, p3, KN_LIST D);
template <int V>
struct Shuffles;
template <>
struct Shuffles<16> {
  using vf = VecOf<16>::type;
  using v4 = VecOf<4>::type;
  using v8 = VecOf<8>::type;
  // 4 floats at p, p + stride, p + 2 stride, p + 3 stride (pixels of NHWC memory) as one vector,
  // through 16-byte loads joined in registers; and the reverse, storing the first `pixels`.
  static inline __attribute__((always_inline)) void load_quads(const float* p, int64_t stride,
                                                               vf& out) {
    v4 q[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) std::memcpy(&q[i], p + i * stride, sizeof(v4));
    const v8 h0 = KN_SHUF(q[0], q[1], 0, 1, 2, 3, 4, 5, 6, 7);
    const v8 h1 = KN_SHUF(q[2], q[3], 0, 1, 2, 3, 4, 5, 6, 7);
    out = KN_SHUF(h0, h1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static inline __attribute__((always_inline)) void store_quads(const vf& v, float* p,
                                                                int64_t stride, int64_t pixels) {
    v4 q[4] = {KN_SHUF(v, v, 0, 1, 2, 3), KN_SHUF(v, v, 4, 5, 6, 7), KN_SHUF(v, v, 8, 9, 10, 11),
               KN_SHUF(v, v, 12, 13, 14, 15)};
    if (pixels == 4) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) std::memcpy(p + i * stride, &q[i], sizeof(v4));
      return;
    }
    for (int64_t i = 0; i < pixels; ++i) std::memcpy(p + i * stride, &q[i], sizeof(v4));
  }
  static inline __attribute__((always_inline)) void interleave(const vf* in, vf* out) {
    KN_TWO_ROUNDS((0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                  (8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                  (0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
                  (8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31))
  }
  // The inverse: (column, channel) pairs as NHWC memory holds them into one vector per channel.
  static inline __attribute__((always_inline)) void deinterleave(const vf* in, vf* out) {
    KN_TWO_ROUNDS((0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
                  (2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31),
                  (0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                  (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31))
  }
  // 2V consecutive floats (a, then b) into their even and odd elements: a stride-2 row's two
  // phases (stage()).
  static inline __attribute__((always_inline)) void split_even_odd(const vf& a, const vf& b,
                                                                    vf& even, vf& odd) {
    even = KN_SHUF(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    odd = KN_SHUF(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  }
};
template <>
struct Shuffles<8> {
  using vf = VecOf<8>::type;
  using v4 = VecOf<4>::type;
  static inline __attribute__((always_inline)) void load_quads(const float* p, int64_t stride,
                                                               vf& out) {
    v4 q[2];
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) std::memcpy(&q[i], p + i * stride, sizeof(v4));
    out = KN_SHUF(q[0], q[1], 0, 1, 2, 3, 4, 5, 6, 7);
  }
  static inline __attribute__((always_inline)) void store_quads(const vf& v, float* p,
                                                                int64_t stride, int64_t pixels) {
    v4 q[2] = {KN_SHUF(v, v, 0, 1, 2, 3), KN_SHUF(v, v, 4, 5, 6, 7)};
    if (pixels == 2) {
      std::memcpy(p, &q[0], sizeof(v4));
      std::memcpy(p + stride, &q[1], sizeof(v4));
      return;
    }
    for (int64_t i = 0; i < pixels; ++i) std::memcpy(p + i * stride, &q[i], sizeof(v4));
  }
  static inline __attribute__((always_inline)) void interleave(const vf* in, vf* out) {
    KN_TWO_ROUNDS((0, 8, 1, 9, 2, 10, 3, 11),
                  (4, 12, 5, 13, 6, 14, 7, 15),
                  (0, 1, 8, 9, 2, 3, 10, 11),
                  (4, 5, 12, 13, 6, 7, 14, 15))
  }
  static inline __attribute__((always_inline)) void deinterleave(const vf* in, vf* out) {
    KN_TWO_ROUNDS((0, 1, 4, 5, 8, 9, 12, 13),
                  (2, 3, 6, 7, 10, 11, 14, 15),
                  (0, 2, 4, 6, 8, 10, 12, 14),
                  (1, 3, 5, 7, 9, 11, 13, 15))
  }
  static inline __attribute__((always_inline)) void split_even_odd(const vf& a, const vf& b,
                                                                    vf& even, vf& odd) {
    even = KN_SHUF(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    odd = KN_SHUF(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
  }
};
template <>
struct Shuffles<4> {
  using vf = VecOf<4>::type;
  static inline __attribute__((always_inline)) void load_quads(const float* p, int64_t, vf& out) {
    std::memcpy(&out, p, sizeof(vf));
  }
  static inline __attribute__((always_inline)) void store_quads(const vf& v, float* p, int64_t,
                                                                int64_t pixels) {
    if (pixels > 0) std::memcpy(p, &v, sizeof(vf));
  }
  static inline __attribute__((always_inline)) void interleave(const vf* in, vf* out) {
    KN_TWO_ROUNDS((0, 4, 1, 5), (2, 6, 3, 7), (0, 1, 4, 5), (2, 3, 6, 7))
  }
  static inline __attribute__((always_inline)) void deinterleave(const vf* in, vf* out) {
    KN_TWO_ROUNDS((0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7))
  }
  static inline __attribute__((always_inline)) void split_even_odd(const vf& a, const vf& b,
                                                                    vf& even, vf& odd) {
    even = KN_SHUF(a, b, 0, 2, 4, 6);
    odd = KN_SHUF(a, b, 1, 3, 5, 7);
  }
};
#undef KN_TWO_ROUNDS
#undef KN_LIST
#undef KN_SHUF

// One (image, group)'s work.
struct Args {
  float* plane;        // staged input channels: [cg][sh][st_w][sw], zero-padded
  int64_t sh, sw;      // its rows, and the columns of one phase of a row
  int64_t st_h, st_w;  // the convolution's strides
  int64_t rb, re;      // the band of output rows [rb, re); plane row i is staged row rb + i
  const float* x;      // the input at (image, first channel of the group)
  int64_t h, w, pad_top, pad_left;
  int64_t c, o;        // all channels of x and y (NHWC's pixel strides)
  bool x_nhwc, y_nhwc;
  const float* wk;     // the group's weights: [blocks][cg][kh][kw][kBlock]
  const float* bias;   // the group's bias: [og]
  const float* res;    // the residual at (image, first channel of the group), or null
  float* y;            // the output at (image, first channel of the group)
  int64_t cg, og, blocks, kh, kw, oh, ow;
  GroupedConvEpilogue e;
};

// e^t, lane by lane, for silu: 2^n e^r with n = round(t / ln 2) and r = t - n ln 2 (ln 2 in
// two parts, Cody and Waite's, so that r keeps its low bits), e^r = 1 + r + r^2 P(r) with
// Cephes' degree-5 P (within 2 ulp of float32's e^r on |r| <= ln 2 / 2). NaN stays NaN.
//   - AVX-512 (64-byte vectors): t clamped to [-104, 89], n rounded by vrndscaleps, and 2^n
//     applied by vscalefps, which gives inf past float32's range and 0 (or a subnormal) below;
//     as inline assembly, since these functions are templates shared by every vector width and
//     only group_avx512 is compiled for AVX-512 (16 vector operations, a third fewer than the
//     portable form, which made silu cost as much as the stem's convolution on this CPU).
//   - Other widths: t clamped to [-87.34, 88] so that n lies in [-126, 127]; n rounded by adding
//     and subtracting 1.5 * 2^23 (whose bits then hold n), 2^n made in the exponent field; the
//     result is inf above 88 and e^-87.34 (1.2e-38) below -87.34. For silu, v / (1 + e^-v), that
//     is -0 where float32 would hold about -1e-37, and v where 1 + e^-v is 1 either way.
// (By reference: a 64-byte vector passed by value changes the ABI outside AVX-512 code.)
template <typename vf>
inline __attribute__((always_inline)) void exp_of(const vf& t, vf& e) {
  using vi = decltype(t < t);
  const vf zero = vf{};
  vf c, n;
  if constexpr (sizeof(vf) == 64) {
    // (AT&T order: vmaxps b, a, d is d = a > b ? a : b, which is b where either is NaN.)
    const vf lo = zero - 104.0f, hi = zero + 89.0f;
    __asm__("vmaxps %2, %1, %0" : "=v"(c) : "v"(lo), "v"(t));
    __asm__("vminps %2, %1, %0" : "=v"(c) : "v"(hi), "v"(c));
    const vf x = c * 1.44269504088896341f;
    __asm__("vrndscaleps $0, %1, %0" : "=v"(n) : "v"(x));
  } else {
    const vf hi = zero + 88.0f, lo = zero - 87.3365448f;
    c = t < lo ? lo : t;
    c = c > hi ? hi : c;
    n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // 1.5 * 2^23
  }
  const vf r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
  vf p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vf er = p * (r * r) + r + 1.0f;
  if constexpr (sizeof(vf) == 64) {
    __asm__("vscalefps %2, %1, %0" : "=v"(e) : "v"(er), "v"(n));
  } else {
    // n + 127 into the exponent field.
    const vf out = er * (vf)((__builtin_convertvector(n, vi) + 127) << 23);
    e = t > 88.0f ? zero + __builtin_inff() : out;
  }
}

// The epilogue's activation: relu or clamp, NaN kept (a comparison with NaN is false, and the
// mask keeps the value where it is false); silu as v / (1 + e^-v), which gives NaN for NaN and
// for -inf (as v * sigmoid(v) does), -0 below about -88 and v above 88. Selects as bit masks:
// GCC and clang both take them.
template <typename vf>
inline __attribute__((always_inline)) void activation(const GroupedConvEpilogue& e, vf& v) {
  using vi = decltype(v < v);
  const vf zero = vf{};
  if (e.act == GroupedConvEpilogue::Act::Silu) {
    vf e_neg;
    exp_of(-v, e_neg);
    v = v / (e_neg + 1.0f);
  } else if (e.act == GroupedConvEpilogue::Act::Relu) {
    const vi m = v < zero;  // where v is below zero; NaN compares false and stays
    v = (vf)((vi)v & ~m);
  } else if (e.act == GroupedConvEpilogue::Act::Clamp) {
    const vf lo = zero + e.lo, hi = zero + e.hi;
    vi m = v < lo;
    v = (vf)(((vi)lo & m) | ((vi)v & ~m));
    m = v > hi;
    v = (vf)(((vi)hi & m) | ((vi)v & ~m));
  }
}

// One whole vector v of NHWC output (the sums and the bias) at element `at` of y: + sum_scale
// x the residual's vector there (read before the store: the residual may be y itself), the
// activation, stored.
template <typename vf>
inline __attribute__((always_inline)) void finish_vector(const GroupedConvEpilogue& e, vf& v,
                                                         const float* res, float* y,
                                                         int64_t at) {
  if (e.residual) {
    vf rv;
    std::memcpy(&rv, res + at, sizeof(vf));
    v = v + rv * e.sum_scale;
  }
  activation(e, v);
  std::memcpy(y + at, &v, sizeof(vf));
}

// ROWS output rows x V columns from (r0, c0) of output block `blk`. KH / KW: the filter's size
// when it is known at compile time (3x3), else 0 (read from `a`).
template <int V, int ROWS, int KH, int KW, int S>
inline __attribute__((always_inline)) void tile(const Args& a, int64_t blk, int64_t r0,
                                                int64_t c0) {
  using vf = typename VecOf<V>::type;
  const int64_t kh = KH ? KH : a.kh, kw = KW ? KW : a.kw;
  // Strides (S: both, when known at compile time). A plane row holds st_w phases of sw columns:
  // phase p, column j is the padded input column j * st_w + p, so output column c at tap k
  // reads phase k % st_w, column c + k / st_w: contiguous along c whatever the stride.
  const int64_t st_h = S ? S : a.st_h, st_w = S ? S : a.st_w, rs = st_w * a.sw;
  // (The small loops are unrolled so that the accumulators live in registers: GCC at -O2
  // keeps an array it indexes in a loop in memory.)
  vf acc[ROWS][kBlock];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < kBlock; ++j) acc[r][j] = vf{};
  const float* wb = a.wk + blk * a.cg * kh * kw * kBlock;
  for (int64_t ic = 0; ic < a.cg; ++ic) {
    const float* base = a.plane + (ic * a.sh + (r0 - a.rb) * st_h) * rs + c0;
#pragma GCC unroll 8
    for (int64_t i = 0; i < kh; ++i) {
      const float* row = base + i * rs;
      const float* wr = wb + (ic * kh + i) * kw * kBlock;
#pragma GCC unroll 8
      for (int64_t k = 0; k < kw; ++k) {
        vf x[ROWS];
        const float* at = row + (k % st_w) * a.sw + k / st_w;
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; ++r) std::memcpy(&x[r], at + r * st_h * rs, sizeof(vf));
        const float* wp = wr + k * kBlock;
#pragma GCC unroll 8
        for (int j = 0; j < kBlock; ++j) {
          const float wj = wp[j];
#pragma GCC unroll 8
          for (int r = 0; r < ROWS; ++r) acc[r][j] += x[r] * wj;
        }
      }
    }
  }
  const int64_t lanes = std::min<int64_t>(V, a.ow - c0);
  const vf zero = vf{};
  if (a.y_nhwc && (blk + 1) * kBlock <= a.og) {
    // NHWC: the block's 4 channels interleaved per column (Interleave), then 16 bytes per
    // pixel: bias before, residual (read the same way) and activation after.
    constexpr int P = V / 4;  // pixels per interleaved vector
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      vf in[kBlock], out[kBlock];
#pragma GCC unroll 8
      for (int j = 0; j < kBlock; ++j) in[j] = acc[r][j] + a.bias[blk * kBlock + j];
      Shuffles<V>::interleave(in, out);
      const int64_t row = (r0 + r) * a.ow;
#pragma GCC unroll 8
      for (int k = 0; k < kBlock; ++k) {
        vf v = out[k];
        const int64_t first = c0 + k * P;  // this vector's first pixel
        const int64_t pixels = std::min<int64_t>(P, a.ow - first);
        if (pixels <= 0) break;
        if (a.e.residual) {
          vf rv = zero;
          if (pixels == P) {
            Shuffles<V>::load_quads(a.res + (row + first) * a.o + blk * kBlock, a.o, rv);
          } else {
            for (int64_t q = 0; q < pixels; ++q)
              for (int j = 0; j < 4; ++j)
                rv[4 * q + j] = a.res[(row + first + q) * a.o + blk * kBlock + j];
          }
          v = v + rv * a.e.sum_scale;
        }
        activation(a.e, v);
        Shuffles<V>::store_quads(v, a.y + (row + first) * a.o + blk * kBlock, a.o, pixels);
      }
    }
    return;
  }
  // Element strides of y (and the residual) along channels and columns.
  const int64_t cs = a.y_nhwc ? 1 : a.oh * a.ow, ws = a.y_nhwc ? a.o : 1;
#pragma GCC unroll 8
  for (int j = 0; j < kBlock; ++j) {
    const int64_t oc = blk * kBlock + j;
    if (oc >= a.og) break;
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      const int64_t at = oc * cs + ((r0 + r) * a.ow + c0) * ws;
      vf v = acc[r][j] + a.bias[oc];
      // (Whole vectors by fixed-size copies, which are vector loads and stores; a copy of a
      // variable size is a loop through the stack.)
      if (a.e.residual) {
        vf rv = zero;
        if (lanes == V && ws == 1) std::memcpy(&rv, a.res + at, sizeof(vf));
        else
          for (int64_t l = 0; l < lanes; ++l) rv[l] = a.res[at + l * ws];
        v = v + rv * a.e.sum_scale;
      }
      activation(a.e, v);
      if (lanes == V && ws == 1) std::memcpy(a.y + at, &v, sizeof(vf));
      else
        for (int64_t l = 0; l < lanes; ++l) a.y[at + l * ws] = v[l];
    }
  }
}

// The group's input channels for the band into the staged plane: plane row i is input row
// rb * st_h + i - pad_top (all zeros outside the input); with stride 1, plane column c is input
// column c - pad_left, and the columns outside the input were zeroed by the caller and are never
// written; with a larger stride, phase p's column j is input column j * st_w + p - pad_left,
// every one written (zeros outside). Whole vectors by fixed-size copies (vector moves), the
// rest element by element.
template <int V>
inline __attribute__((always_inline)) void stage(const Args& a) {
  using vf = typename VecOf<V>::type;
  const int64_t rows = (a.re - a.rb - 1) * a.st_h + a.kh, rs = a.st_w * a.sw;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t ih = a.rb * a.st_h + i - a.pad_top;
    if (ih < 0 || ih >= a.h) {
      for (int64_t ic = 0; ic < a.cg; ++ic)
        std::memset(a.plane + (ic * a.sh + i) * rs, 0, size_t(rs) * sizeof(float));
      continue;
    }
    if (a.st_w == 2 && !a.x_nhwc) {
      // Two phases of an NCHW row: 2V consecutive inputs split into even and odd columns,
      // element by element where the 2V would reach past the row (the padding) or before it.
      for (int64_t ic = 0; ic < a.cg; ++ic) {
        const float* src = a.x + (ic * a.h + ih) * a.w;
        float* d0 = a.plane + (ic * a.sh + i) * rs;
        float* d1 = d0 + a.sw;
        auto one = [&](int64_t j) {
          const int64_t iw = 2 * j - a.pad_left;
          d0[j] = iw >= 0 && iw < a.w ? src[iw] : 0.0f;
          d1[j] = iw + 1 >= 0 && iw + 1 < a.w ? src[iw + 1] : 0.0f;
        };
        int64_t j = 0;
        for (; j < a.sw && 2 * j - a.pad_left < 0; ++j) one(j);
        for (; j + V <= a.sw && 2 * (j + V) - a.pad_left <= a.w; j += V) {
          vf lo, hi, even, odd;
          std::memcpy(&lo, src + 2 * j - a.pad_left, sizeof(vf));
          std::memcpy(&hi, src + 2 * j - a.pad_left + V, sizeof(vf));
          Shuffles<V>::split_even_odd(lo, hi, even, odd);
          std::memcpy(d0 + j, &even, sizeof(vf));
          std::memcpy(d1 + j, &odd, sizeof(vf));
        }
        // Past the row's last input column both phases are zeros (the stems' tiles reach
        // a row of 24 pixels further: a loop of tests there cost a fifth of a stem's time).
        for (; j < a.sw && 2 * j - a.pad_left < a.w; ++j) one(j);
        if (j < a.sw) {
          std::memset(d0 + j, 0, size_t(a.sw - j) * sizeof(float));
          std::memset(d1 + j, 0, size_t(a.sw - j) * sizeof(float));
        }
      }
      continue;
    }
    if (a.st_w != 1) {  // phases, element by element
      for (int64_t ic = 0; ic < a.cg; ++ic)
        for (int64_t p = 0; p < a.st_w; ++p) {
          float* dst = a.plane + (ic * a.sh + i) * rs + p * a.sw;
          for (int64_t j = 0; j < a.sw; ++j) {
            const int64_t iw = j * a.st_w + p - a.pad_left;
            dst[j] = iw < 0 || iw >= a.w ? 0.0f
                     : a.x_nhwc      ? a.x[(ih * a.w + iw) * a.c + ic]
                                     : a.x[(ic * a.h + ih) * a.w + iw];
          }
        }
      continue;
    }
    if (a.x_nhwc) {  // the group's channels are contiguous at each pixel
      int64_t col = 0;
      if (a.cg % 4 == 0) {
        // V pixels x 4 channels at a time: 16 bytes per pixel into four vectors, then
        // deinterleaved into one vector per channel.
        constexpr int P = V / 4;
        for (; col + V <= a.w; col += V)
          for (int64_t q4 = 0; q4 < a.cg; q4 += 4) {
            vf in[4], out[4];
#pragma GCC unroll 8
            for (int k = 0; k < 4; ++k)
              Shuffles<V>::load_quads(a.x + (ih * a.w + col + k * P) * a.c + q4, a.c, in[k]);
            Shuffles<V>::deinterleave(in, out);
#pragma GCC unroll 8
            for (int j = 0; j < 4; ++j)
              std::memcpy(a.plane + ((q4 + j) * a.sh + i) * a.sw + a.pad_left + col, &out[j],
                          sizeof(vf));
          }
      }
      for (; col < a.w; ++col) {
        const float* src = a.x + (ih * a.w + col) * a.c;
        float* dst = a.plane + i * a.sw + a.pad_left + col;
        for (int64_t ic = 0; ic < a.cg; ++ic) dst[ic * a.sh * a.sw] = src[ic];
      }
      continue;
    }
    for (int64_t ic = 0; ic < a.cg; ++ic) {
      const float* src = a.x + (ic * a.h + ih) * a.w;
      float* dst = a.plane + (ic * a.sh + i) * a.sw + a.pad_left;
      int64_t c = 0;
      for (; c + V <= a.w; c += V) std::memcpy(dst + c, src + c, sizeof(vf));
      for (; c < a.w; ++c) dst[c] = src[c];
    }
  }
}

// Rows per tile: 4 with AVX-512's 32 vector registers (16 accumulators), else 2.
template <int V, int KH, int KW, int S>
inline __attribute__((always_inline)) void group_of(const Args& a) {
  stage<V>(a);
  constexpr int R = V == 16 ? 4 : 2;
  // Columns: whole runs of V, then the rest as one more whole run ending at the last column
  // (its first columns computed again, to the same values) where the row has V columns and
  // the residual is not the output's own buffer (whose first columns are then already
  // overwritten), else as a partial run.
  const int64_t whole = a.ow / V * V;
  const int64_t last = a.ow == whole ? -1
                       : a.ow > V && !(a.e.residual && a.res == a.y) ? a.ow - V
                                                                     : whole;
  for (int64_t blk = 0; blk < a.blocks; ++blk) {
    int64_t r = a.rb;
    for (; r + R <= a.re; r += R) {
      for (int64_t c0 = 0; c0 < whole; c0 += V) tile<V, R, KH, KW, S>(a, blk, r, c0);
      if (last >= 0) tile<V, R, KH, KW, S>(a, blk, r, last);
    }
    for (; r < a.re; ++r) {
      for (int64_t c0 = 0; c0 < whole; c0 += V) tile<V, 1, KH, KW, S>(a, blk, r, c0);
      if (last >= 0) tile<V, 1, KH, KW, S>(a, blk, r, last);
    }
  }
}

template <int V>
inline __attribute__((always_inline)) void group(const Args& a) {
  const bool k3 = a.kh == 3 && a.kw == 3;
  if (k3 && a.st_h == 1 && a.st_w == 1) group_of<V, 3, 3, 1>(a);
  else if (k3 && a.st_h == 2 && a.st_w == 2) group_of<V, 3, 3, 2>(a);
  else group_of<V, 0, 0, 0>(a);
}

// Note [Image stems on output-channel vectors]
// An image stem (3 or 4 input channels, not grouped: EfficientNet's 3x3 stride-2 3 -> 24 or
// 32, MobileNet's, RegNet's, ResNet's 7x7 3 -> 64) has few inputs per output and many outputs
// per input pixel. The bands above vectorize over output columns and stage the output through
// shuffles into NHWC; with 3 input channels the shuffles and the staging cost as much as the
// multiply-adds. Where the output is NHWC and its channels a multiple of 8, this path
// vectorizes over output channels instead: an accumulator holds V consecutive channels of one
// output pixel, so a tile of P pixels of one output row and a block of up to 4 vectors of
// channels is P x (vectors) accumulators; per tap (input channel, kh, kw) it loads the block's
// weight vectors once (rearranged at build time as [block][tap][channels of the block]) and
// multiplies each pixel's input, broadcast from the staged plane (stage(), as for the bands:
// zero-padded, one phase per column of the stride, so that pixel p of the tile reads column
// c0 + p + k / stride of phase k % stride), into the pixel's accumulators: every multiply-add
// is useful, the loads are broadcasts (load ports, not the shuffle port the multiply-adds
// share), and the results are stored as whole vectors of NHWC memory with no shuffle. With
// AVX-512 a block's last 8 channels (24, 40, ...) take a 256-bit vector (HALF). P keeps the
// accumulators within the registers: 24 / vectors per pixel with AVX-512's 32, 12 / vectors
// with AVX2's 16. A row's last tile computes P pixels (the plane is staged wide enough, with
// zeros) and stores the ones inside the row. The sums run over (input channel, kh, kw) for
// every output, whatever the block or thread: two thread counts give the same bits.
template <int V, int NV, int HALF>
inline __attribute__((always_inline)) void stem_row(const Args& a, int64_t r, int64_t ch0) {
  using vf = typename VecOf<V>::type;
  using hf = typename VecOf<V / 2>::type;
  constexpr int W = NV + HALF;                 // vectors per pixel
  constexpr int P = (V == 16 ? 24 : 12) / W;   // pixels per tile
  static_assert(!HALF || (V == 16 && P % 2 == 0), "half vectors come in pairs of pixels");
  constexpr int NA = NV ? NV : 1;              // (arrays of zero size are not standard)
  const int64_t width = NV * V + HALF * (V / 2), taps = a.cg * a.kh * a.kw;
  // Strides are 1 or 2 (why_not): phase k % s and column k / s by mask and shift.
  const int64_t sm = a.st_w - 1, rs = a.st_w * a.sw;
  const float* wb = a.wk + ch0 * taps;  // [tap][width]
  for (int64_t c0 = 0; c0 < a.ow; c0 += P) {
    vf acc[P][NA];
    hf acch[P];
#pragma GCC unroll 24
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
      for (int j = 0; j < NA; ++j) acc[p][j] = vf{};
      acch[p] = hf{};
    }
    const float* wt = wb;
    for (int64_t ic = 0; ic < a.cg; ++ic) {
      const float* base = a.plane + (ic * a.sh + (r - a.rb) * a.st_h) * rs + c0;
      for (int64_t i = 0; i < a.kh; ++i) {
        const float* row = base + i * rs;
        for (int64_t k = 0; k < a.kw; ++k, wt += width) {
          const float* at = row + (k & sm) * a.sw + (k >> sm);
          vf w[NA];
          hf wh;
#pragma GCC unroll 4
          for (int j = 0; j < NV; ++j) std::memcpy(&w[j], wt + j * V, sizeof(vf));
          if constexpr (HALF) std::memcpy(&wh, wt + NV * V, sizeof(hf));
#pragma GCC unroll 24
          for (int p = 0; p < P; ++p) {
            if constexpr (V == 16 && HALF && NV > 0) {
              // One broadcast into a register for the pixel's full and half vectors: GCC
              // would fold it into each multiply-add as an embedded broadcast, a load each
              // (3 -> 24 at 112x112, one core: 0.25 -> 0.21 ms; with whole vectors only the
              // folded form was as fast or faster: 3 -> 64 0.37 against 0.44 ms).
              vf xb;
              __asm__("vbroadcastss %1, %0" : "=v"(xb) : "m"(at[p]));
#pragma GCC unroll 4
              for (int j = 0; j < NV; ++j) acc[p][j] += w[j] * xb;
              acch[p] += wh * __builtin_shufflevector(xb, xb, 0, 1, 2, 3, 4, 5, 6, 7);
            } else {
              const float xv = at[p];
#pragma GCC unroll 4
              for (int j = 0; j < NV; ++j) acc[p][j] += w[j] * xv;
              if constexpr (HALF) acch[p] += wh * xv;
            }
          }
        }
      }
    }
    const int64_t pixels = std::min<int64_t>(P, a.ow - c0);
#pragma GCC unroll 24
    for (int p = 0; p < P; ++p) {
      if (p >= pixels) break;
      const int64_t at = (r * a.ow + c0 + p) * a.o + ch0;
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        vf b;
        std::memcpy(&b, a.bias + ch0 + j * V, sizeof(vf));
        vf v = acc[p][j] + b;
        finish_vector(a.e, v, a.res, a.y, at + j * V);
      }
    }
    if constexpr (HALF) {
      // The half vectors of two pixels side by side in one: an activation (silu's exp) per
      // 16 channels rather than per 8 (3 -> 24 stride 2 with silu at 224x224, one core:
      // 0.351 -> 0.301 ms).
      hf b;
      std::memcpy(&b, a.bias + ch0 + NV * V, sizeof(hf));
#pragma GCC unroll 12
      for (int p = 0; p < P; p += 2) {
        if (p >= pixels) break;
        const bool second = p + 1 < pixels;
        const int64_t at = (r * a.ow + c0 + p) * a.o + ch0 + NV * V;
        vf v = __builtin_shufflevector(acch[p] + b, acch[p + 1] + b, 0, 1, 2, 3, 4, 5, 6, 7, 8,
                                       9, 10, 11, 12, 13, 14, 15);
        if (a.e.residual) {  // both read before either store: the residual may be y itself
          hf r0, r1 = hf{};
          std::memcpy(&r0, a.res + at, sizeof(hf));
          if (second) std::memcpy(&r1, a.res + at + a.o, sizeof(hf));
          v = v + __builtin_shufflevector(r0, r1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                          14, 15) * a.e.sum_scale;
        }
        activation(a.e, v);
        const hf lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
        const hf hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
        std::memcpy(a.y + at, &lo, sizeof(hf));
        if (second) std::memcpy(a.y + at + a.o, &hi, sizeof(hf));
      }
    }
  }
}

// The channels of a stem's block starting at ch0: 4 vectors, else what is left (a multiple of
// 8: whole vectors and, with AVX-512, a half). The weights' layout follows the same blocks.
inline int64_t stem_block(int64_t v, int64_t o, int64_t ch0) { return std::min(4 * v, o - ch0); }

template <int V>
inline __attribute__((always_inline)) void stem(const Args& a) {
  stage<V>(a);
  for (int64_t r = a.rb; r < a.re; ++r)
    for (int64_t ch0 = 0; ch0 < a.o; ch0 += stem_block(V, a.o, ch0)) {
      const int64_t width = stem_block(V, a.o, ch0), nv = width / V;
      const bool half = width % V != 0;
      if constexpr (V == 16) {
        if (half) {
          if (nv == 0) stem_row<V, 0, 1>(a, r, ch0);
          else if (nv == 1) stem_row<V, 1, 1>(a, r, ch0);
          else if (nv == 2) stem_row<V, 2, 1>(a, r, ch0);
          else stem_row<V, 3, 1>(a, r, ch0);
          continue;
        }
      }
      if (nv == 1) stem_row<V, 1, 0>(a, r, ch0);
      else if (nv == 2) stem_row<V, 2, 0>(a, r, ch0);
      else if (nv == 3) stem_row<V, 3, 0>(a, r, ch0);
      else stem_row<V, 4, 0>(a, r, ch0);
    }
}

// (AVX-512VL for the 256-bit half vectors in registers 16-31: without it they spill.)
__attribute__((target("avx512f,avx512vl,fma"))) void stem_avx512(const Args& a) { stem<16>(a); }
__attribute__((target("avx2,fma"))) void stem_avx2(const Args& a) { stem<8>(a); }

__attribute__((target("avx512f,fma"))) void group_avx512(const Args& a) { group<16>(a); }
__attribute__((target("avx2,fma"))) void group_avx2(const Args& a) { group<8>(a); }
void group_generic(const Args& a) { group<4>(a); }

// Note [Grouped convolution on channel lanes]
// With NHWC input and output and G = channels per group in = out, G dividing the vector's V
// floats and the channels a multiple of V, a vector holds V consecutive channels of one pixel:
// V / G whole groups, lane (g, j) = output channel j of group g. Output channel j of a group
// sums its G input channels; split the sum by rotation r = 0 .. G-1: at rotation r, lane (g, j)
// takes input channel (j + r) mod G of its group. That input vector is the pixel's V channels
// rotated by r within each run of G lanes (a shuffle with constant indices: vpermilps with an
// immediate for G <= 4 under AVX-512, vpermps otherwise), and its weights are one vector per
// (tap, rotation), rearranged at build time. So every load and store is a whole vector of NHWC
// memory, with no staging, no transposes and no scratch (the band kernel above stages planes and
// interleaves its NHWC results through shuffles that compete with the multiply-adds for the
// same port). A tile is P = 8 output pixels of one row and one block of V channels;
// per kernel row and rotation, each input pixel the tile reads is loaded and rotated once and
// multiplied into the (up to 3) accumulators whose taps it is, with that row's kw weight
// vectors held in registers. Input pixels outside the image (padding) are skipped, as oneDNN
// and the float64 reference skip them; tiles that touch an edge or the row's end test each
// pixel (EDGE), the rest do not. Work is split over (image, output row); a thread takes every
// block and tile of its rows, so an output is computed by one thread in a fixed order whatever
// the thread count. Taken for 3x3 filters with AVX2 or AVX-512: G = 1 (depthwise), 2 or 4 at
// equal strides of 1 or 2, G = 8 at stride 1 (lane_row_fn says why not more). On ResNeXt-50's layer1 (4 channels per group, 128 -> 128 at 56x56, relu, one
// thread of the 2026-12-07 Emerald Rapids VM) 0.63 -> 0.37 ms, 2.3x its FLOP floor; tiles of
// 12, 14 or 16 pixels were slower (docs/benchmarks.md, forty-second session). With AVX-512, at
// stride 1 and up to 4 channels per group, a tile covers two output rows (lane_tile2).

// Output pixels per tile: 8 accumulators (16 for a pair of rows) cover the multiply-add's
// latency on both pipes, beside the kw weight vectors and an input in the registers.
constexpr int kLanePixels = 8;

struct LaneArgs {
  const float* x;     // the image's input, NHWC
  const float* wl;    // [blocks][kh][kw][G][V]: lane (g, j) of rotation r
  const float* bias;  // [o]
  const float* res;   // the image's residual, NHWC, or null
  float* y;           // the image's output, NHWC
  int64_t c;          // channels of x and y
  int64_t h, w, oh, ow, kh, pad_top, pad_left;
  GroupedConvEpilogue e;
};

// v with each run of G lanes rotated by R: lane (g, j) <- v[g * G + (j + R) % G]. (In place:
// a 64-byte vector returned by value changes the ABI outside AVX-512 code.)
template <int V, int G, int R, size_t... I>
inline __attribute__((always_inline)) void rotate_by(typename VecOf<V>::type& v,
                                                     std::index_sequence<I...>) {
  v = __builtin_shufflevector(v, v, int((I / G) * G + (I % G + R) % G)...);
}
template <int V, int G, int R>
inline __attribute__((always_inline)) void rotate(typename VecOf<V>::type& v) {
  if constexpr (R != 0) rotate_by<V, G, R>(v, std::make_index_sequence<V>{});
}

// One rotation's products for a tile: the Q input pixels of kernel row `xr` the tile's P
// outputs read, each rotated once and added into the accumulators it is a tap of: acc0's with
// row w0's weights (TO0) and, for the second row of a pair (lane_tile2), acc1's with w1's (TO1).
template <int V, int G, int S, int R, bool EDGE, bool TO0, bool TO1>
inline __attribute__((always_inline)) void lane_rotation(const LaneArgs& a, const float* xr,
                                                         const float* w0, const float* w1,
                                                         int64_t q0,
                                                         typename VecOf<V>::type* acc0,
                                                         typename VecOf<V>::type* acc1) {
  using vf = typename VecOf<V>::type;
  constexpr int KW = 3, P = kLanePixels, Q = (P - 1) * S + KW;
  vf wk0[KW], wk1[KW];
#pragma GCC unroll 3
  for (int k = 0; k < KW; ++k) {
    if constexpr (TO0) std::memcpy(&wk0[k], w0 + (k * G + R) * V, sizeof(vf));
    if constexpr (TO1) std::memcpy(&wk1[k], w1 + (k * G + R) * V, sizeof(vf));
  }
#pragma GCC unroll 32
  for (int q = 0; q < Q; ++q) {
    const int64_t iw = q0 + q;
    if (EDGE && (iw < 0 || iw >= a.w)) continue;
    vf xv;
    std::memcpy(&xv, xr + iw * a.c, sizeof(vf));
    rotate<V, G, R>(xv);
#pragma GCC unroll 3
    for (int k = 0; k < KW; ++k) {
      // Output p reads input q at tap k when p * S + k == q.
      if ((q - k) % S != 0 || q < k || (q - k) / S >= P) continue;
      if constexpr (TO0) acc0[(q - k) / S] += xv * wk0[k];
      if constexpr (TO1) acc1[(q - k) / S] += xv * wk1[k];
    }
  }
}

// The tile's outputs: + bias, + sum_scale * residual, the activation; whole vectors of NHWC.
template <int V, bool EDGE>
inline __attribute__((always_inline)) void lane_store(const LaneArgs& a, int64_t orow, int64_t cb,
                                                      int64_t c0,
                                                      typename VecOf<V>::type* acc) {
  using vf = typename VecOf<V>::type;
  constexpr int P = kLanePixels;
  const int64_t ch = cb * V;
  vf bias;
  std::memcpy(&bias, a.bias + ch, sizeof(vf));
  const int64_t pixels = EDGE ? std::min<int64_t>(P, a.ow - c0) : P;
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    if (EDGE && p >= pixels) break;
    vf v = acc[p] + bias;
    finish_vector(a.e, v, a.res, a.y, (orow * a.ow + c0 + p) * a.c + ch);
  }
}

template <int V, int G, int S, bool EDGE, int... R>
inline __attribute__((always_inline)) void lane_tile(const LaneArgs& a, int64_t orow, int64_t cb,
                                                     int64_t c0, std::integer_sequence<int, R...>) {
  using vf = typename VecOf<V>::type;
  constexpr int KW = 3, P = kLanePixels;
  vf acc[P];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) acc[p] = vf{};
  const int64_t ch = cb * V, q0 = c0 * S - a.pad_left;
  for (int64_t i = 0; i < a.kh; ++i) {
    const int64_t ih = orow * S + i - a.pad_top;
    if (ih < 0 || ih >= a.h) continue;
    const float* xr = a.x + ih * a.w * a.c + ch;
    const float* wr = a.wl + (cb * a.kh + i) * KW * G * V;
    (lane_rotation<V, G, S, R, EDGE, true, false>(a, xr, wr, nullptr, q0, acc, nullptr), ...);
  }
  lane_store<V, EDGE>(a, orow, cb, c0, acc);
}

// Stride 1, AVX-512, at most 4 channels per group (rotations by immediates): output rows orow
// and orow + 1 at once (16 accumulators). Input row orow - pad_top + u is kernel row u of the
// first (u <= 2) and u - 1 of the second (u >= 1), so each input pixel is loaded and rotated
// once for both: half the shuffles per multiply-add (0.387 -> 0.36 ms on ResNeXt's layer1).
// With 8 or 16 per group the rotations' index vectors leave too few registers (0.32 -> 0.42 ms).
template <int V, int G, bool EDGE, int U, int... R>
inline __attribute__((always_inline)) void lane_input_row2(const LaneArgs& a, int64_t orow,
                                                           int64_t cb, int64_t q0,
                                                           typename VecOf<V>::type* acc0,
                                                           typename VecOf<V>::type* acc1,
                                                           std::integer_sequence<int, R...>) {
  constexpr int KW = 3;
  const int64_t ih = orow - a.pad_top + U;
  if (ih < 0 || ih >= a.h) return;
  const float* xr = a.x + ih * a.w * a.c + cb * V;
  const float* wb = a.wl + cb * a.kh * KW * G * V;
  const float* w0 = U <= 2 ? wb + U * KW * G * V : nullptr;
  const float* w1 = U >= 1 ? wb + (U - 1) * KW * G * V : nullptr;
  (lane_rotation<V, G, 1, R, EDGE, (U <= 2), (U >= 1)>(a, xr, w0, w1, q0, acc0, acc1), ...);
}

template <int V, int G, bool EDGE>
inline __attribute__((always_inline)) void lane_tile2(const LaneArgs& a, int64_t orow, int64_t cb,
                                                      int64_t c0) {
  using vf = typename VecOf<V>::type;
  constexpr int P = kLanePixels;
  constexpr auto rotations = std::make_integer_sequence<int, G>{};
  vf acc0[P], acc1[P];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) acc0[p] = acc1[p] = vf{};
  const int64_t q0 = c0 - a.pad_left;
  lane_input_row2<V, G, EDGE, 0>(a, orow, cb, q0, acc0, acc1, rotations);
  lane_input_row2<V, G, EDGE, 1>(a, orow, cb, q0, acc0, acc1, rotations);
  lane_input_row2<V, G, EDGE, 2>(a, orow, cb, q0, acc0, acc1, rotations);
  lane_input_row2<V, G, EDGE, 3>(a, orow, cb, q0, acc0, acc1, rotations);
  lane_store<V, EDGE>(a, orow, cb, c0, acc0);
  lane_store<V, EDGE>(a, orow + 1, cb, c0, acc1);
}

// Every block and tile of output row `orow`, and of orow + 1 where the item is a pair of rows
// (GroupedConv::run).
template <int V, int G, int S>
inline __attribute__((always_inline)) void lane_row(const LaneArgs& a, int64_t orow, bool pair) {
  constexpr int KW = 3, P = kLanePixels;
  const auto rotations = std::make_integer_sequence<int, G>{};
  for (int64_t cb = 0; cb < a.c / V; ++cb)
    for (int64_t c0 = 0; c0 < a.ow; c0 += P) {
      const int64_t q0 = c0 * S - a.pad_left;
      const bool inside = c0 + P <= a.ow && q0 >= 0 && q0 + (P - 1) * S + KW <= a.w;
      if constexpr (S == 1 && V == 16 && G <= 4) {
        if (pair) {
          if (inside) lane_tile2<V, G, false>(a, orow, cb, c0);
          else lane_tile2<V, G, true>(a, orow, cb, c0);
          continue;
        }
      }
      if (inside) lane_tile<V, G, S, false>(a, orow, cb, c0, rotations);
      else lane_tile<V, G, S, true>(a, orow, cb, c0, rotations);
    }
}

// The shapes taken (GroupedConv::lanes_): 1, 2 or 4 channels per group at strides 1 and 2,
// 8 at stride 1, each one function per vector width, compiled for its ISA (under clang's
// UBSan the unrolled tiles' arithmetic checks made this file take over ten minutes to build:
// CMakeLists.txt turns five of them off for it, 88 s). 16 per
// group and 8 at stride 2 would add the largest tiles for convolutions that oneDNN already runs
// within 3x of their floor (RegNet's 16 per group at 1.3x) or faster than this kernel
// (ResNeXt's stride-2 8 per group: 0.53 against 0.60 ms), so they stay on the bands.
#define KN_LANE_ROW(V, G, S, ISA)                                                       \
  __attribute__((target(ISA), noinline)) void lane_row_##V##_##G##_##S(                  \
      const LaneArgs& a, int64_t orow, bool pair) {                                     \
    lane_row<V, G, S>(a, orow, pair);                                                   \
  }
KN_LANE_ROW(16, 1, 1, "avx512f,fma")
KN_LANE_ROW(16, 1, 2, "avx512f,fma")
KN_LANE_ROW(16, 2, 1, "avx512f,fma")
KN_LANE_ROW(16, 2, 2, "avx512f,fma")
KN_LANE_ROW(16, 4, 1, "avx512f,fma")
KN_LANE_ROW(16, 4, 2, "avx512f,fma")
KN_LANE_ROW(16, 8, 1, "avx512f,fma")
KN_LANE_ROW(8, 1, 1, "avx2,fma")
KN_LANE_ROW(8, 1, 2, "avx2,fma")
KN_LANE_ROW(8, 2, 1, "avx2,fma")
KN_LANE_ROW(8, 2, 2, "avx2,fma")
KN_LANE_ROW(8, 4, 1, "avx2,fma")
KN_LANE_ROW(8, 4, 2, "avx2,fma")
KN_LANE_ROW(8, 8, 1, "avx2,fma")
#undef KN_LANE_ROW

using LaneRowFn = void (*)(const LaneArgs&, int64_t, bool);

// The function for a vector width, channels per group and stride that lanes_ admits.
LaneRowFn lane_row_fn(int64_t v, int64_t g, int64_t s) {
  const bool s1 = s == 1;
  if (v == 16) {
    if (g == 1) return s1 ? lane_row_16_1_1 : lane_row_16_1_2;
    if (g == 2) return s1 ? lane_row_16_2_1 : lane_row_16_2_2;
    if (g == 4) return s1 ? lane_row_16_4_1 : lane_row_16_4_2;
    return lane_row_16_8_1;
  }
  if (g == 1) return s1 ? lane_row_8_1_1 : lane_row_8_1_2;
  if (g == 2) return s1 ? lane_row_8_2_1 : lane_row_8_2_2;
  if (g == 4) return s1 ? lane_row_8_4_1 : lane_row_8_4_2;
  return lane_row_8_8_1;
}

int64_t vector_floats() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
  return 4;
}

}  // namespace

std::string GroupedConv::why_not(const GroupedConvShape& s, int64_t dilation_h,
                                 int64_t dilation_w) {
  if (s.groups < 2 && s.c > 4) return "not grouped, and more than 4 input channels";
  if (s.stride_h < 1 || s.stride_w < 1 || s.stride_h > 2 || s.stride_w > 2)
    return "stride is not 1 or 2";
  if (dilation_h != 1 || dilation_w != 1) return "dilated";
  if (s.n < 1 || s.c < 1 || s.h < 1 || s.w < 1 || s.o < 1 || s.oh < 1 || s.ow < 1 || s.kh < 1 ||
      s.kw < 1)
    return "empty";
  if (s.c % s.groups != 0 || s.o % s.groups != 0) return "channels not divisible by groups";
  if (s.pad_top < 0 || s.pad_left < 0 || s.pad_top >= s.kh || s.pad_left >= s.kw)
    return "padding outside [0, kernel)";
  // The last output's window ends at most kernel - 1 past the input (the bottom and right
  // pads), and no more than stride - 1 before its end (the input columns a stride leaves
  // over): the staged plane holds every input column, and nothing is staged past it.
  const int64_t pad_bottom = (s.oh - 1) * s.stride_h + s.kh - s.pad_top - s.h;
  const int64_t pad_right = (s.ow - 1) * s.stride_w + s.kw - s.pad_left - s.w;
  if (pad_bottom >= s.kh || pad_right >= s.kw)
    return "bottom or right padding of a kernel's size or more";
  if (pad_bottom <= -s.stride_h || pad_right <= -s.stride_w)
    return "output smaller than its input and padding give";
  return "";
}

GroupedConv::GroupedConv(const GroupedConvShape& s, const GroupedConvEpilogue& e,
                         const float* weights, const float* bias, int64_t vector_floats)
    : s_(s), e_(e) {
  const std::string why = why_not(s, 1, 1);
  KILN_CHECK(why.empty(), "grouped convolution kernel: {}", why);
  cg_ = s.c / s.groups;
  og_ = s.o / s.groups;
  blocks_ = (og_ + kBlock - 1) / kBlock;
  vec_ = kiln::kernels::vector_floats();
  KILN_CHECK(vector_floats == 0 || ((vector_floats == 4 || vector_floats == 8 ||
                                     vector_floats == 16) && vector_floats <= vec_),
             "grouped convolution kernel: {} floats per vector asked, this CPU runs at most {}",
             vector_floats, vec_);
  if (vector_floats) vec_ = vector_floats;
  // A band's rows; one phase's columns: the vector runs' reach, (ow rounded up to vectors) - 1
  // + (kw - 1) / stride, plus one.
  sh_ = (std::min(s.oh, kBand) - 1) * s.stride_h + s.kh;
  sw_ = (s.ow + vec_ - 1) / vec_ * vec_ + (s.kw - 1) / s.stride_w;
  const int64_t taps = s.kh * s.kw;
  bias_.assign(size_t(s.o), 0.0f);
  if (bias) std::memcpy(bias_.data(), bias, size_t(s.o) * sizeof(float));
  // (lane_row_fn: the shapes instantiated; AVX2 and AVX-512 only.)
  lanes_ = s.x_nhwc && s.y_nhwc && cg_ == og_ && vec_ >= 8 && s.c % vec_ == 0 && s.kh == 3 &&
           s.kw == 3 && s.stride_h == s.stride_w &&
           (((cg_ == 1 || cg_ == 2 || cg_ == 4) && (s.stride_h == 1 || s.stride_h == 2)) ||
            (cg_ == 8 && s.stride_h == 1));
  // Note [Image stems on output-channel vectors]: the tiles' reach past the row's last column
  // (a multiple of 24 pixels covers every tile width of either vector size).
  stem_ = !lanes_ && s.groups == 1 && s.c <= 4 && s.y_nhwc && s.o % 8 == 0 &&
          (vec_ == 8 || (vec_ == 16 && __builtin_cpu_supports("avx512vl")));
  if (stem_) {
    sw_ = std::max(sw_, (s.ow + 23) / 24 * 24 + (s.kw - 1) / s.stride_w);
    const int64_t taps_all = s.c * taps;
    wk_.assign(size_t(s.o * taps_all), 0.0f);
    for (int64_t ch0 = 0; ch0 < s.o; ch0 += stem_block(vec_, s.o, ch0)) {
      const int64_t width = stem_block(vec_, s.o, ch0);
      for (int64_t t = 0; t < taps_all; ++t)
        for (int64_t l = 0; l < width; ++l)
          wk_[size_t(ch0 * taps_all + t * width + l)] = weights[(ch0 + l) * taps_all + t];
    }
    return;
  }
  if (lanes_) {
    // Note [Grouped convolution on channel lanes]: block b's vector for (tap, rotation r) holds,
    // at lane (g, j), the weight of output channel b * V + g * G + j on its group's input
    // channel (j + r) mod G.
    const int64_t v = vec_, g = cg_;
    wk_.assign(size_t(s.o * taps * g), 0.0f);
    for (int64_t b = 0; b < s.o / v; ++b)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t r = 0; r < g; ++r)
          for (int64_t lane = 0; lane < v; ++lane) {
            const int64_t oc = b * v + lane, ic = (lane % g + r) % g;
            wk_[size_t(((b * taps + t) * g + r) * v + lane)] = weights[(oc * g + ic) * taps + t];
          }
    return;
  }
  wk_.assign(size_t(s.groups * blocks_ * cg_ * taps * kBlock), 0.0f);
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t b = 0; b < blocks_; ++b)
      for (int64_t j = 0; j < kBlock; ++j) {
        const int64_t oc = b * kBlock + j;
        if (oc >= og_) break;
        const float* src = weights + (g * og_ + oc) * cg_ * taps;
        for (int64_t ic = 0; ic < cg_; ++ic)
          for (int64_t t = 0; t < taps; ++t)
            wk_[size_t((((g * blocks_ + b) * cg_ + ic) * taps + t) * kBlock + j)] =
                src[ic * taps + t];
      }
}

const char* GroupedConv::isa() const {
  return vec_ == 16 ? "avx512" : vec_ == 8 ? "avx2" : "generic";
}

int64_t GroupedConv::scratch_bytes(int threads) const {
  if (lanes_) return 0;
  const int64_t plane = (cg_ * sh_ * s_.stride_w * sw_ * int64_t(sizeof(float)) + 63) / 64 * 64;
  return plane * std::max(threads, 1);
}

void GroupedConv::run(const float* x, const float* residual, float* y, void* scratch) const {
  if (lanes_) {
    const LaneRowFn row = lane_row_fn(vec_, cg_, s_.stride_h);
    // Items: (image, output row), or pairs of rows at stride 1 with AVX-512 and up to 4 channels
    // per group (lane_tile2; with 8 or 16 the rotations' index vectors leave too few registers).
    const int64_t per = vec_ == 16 && s_.stride_h == 1 && cg_ <= 4 ? 2 : 1;
    const int64_t per_image = (s_.oh + per - 1) / per;
    const int64_t items = s_.n * per_image, in_image = s_.c * s_.h * s_.w,
                  out_image = s_.o * s_.oh * s_.ow;
    parallel_for(items, true, [&](int64_t it) {
      const int64_t ni = it / per_image, orow = it % per_image * per;
      const LaneArgs a{x + ni * in_image, wk_.data(), bias_.data(),
                       e_.residual ? residual + ni * out_image : nullptr, y + ni * out_image,
                       s_.c, s_.h, s_.w, s_.oh, s_.ow, s_.kh, s_.pad_top, s_.pad_left, e_};
      row(a, orow, per == 2 && orow + 1 < s_.oh);
    });
    return;
  }
  const int64_t bands = (s_.oh + kBand - 1) / kBand, items = s_.n * bands;
  const int64_t plane = scratch_bytes(1) / int64_t(sizeof(float));  // one thread's
  void (*fn)(const Args&) = stem_       ? (vec_ == 16 ? stem_avx512 : stem_avx2)
                            : vec_ == 16 ? group_avx512
                            : vec_ == 8  ? group_avx2
                                         : group_generic;
  // Each thread zeroes its plane once: the padding columns stay zero, stage() writes the rest.
  parallel_blocks(items, true, [&](int thread, int64_t first, int64_t end) {
    float* pl = static_cast<float*>(scratch) + int64_t(thread) * plane;
    std::memset(pl, 0, size_t(plane) * sizeof(float));
    for (int64_t it = first; it < end; ++it) {
      const int64_t ni = it / bands, rb = it % bands * kBand, re = std::min(s_.oh, rb + kBand);
      for (int64_t gi = 0; gi < s_.groups; ++gi) {
        // The group's first channel of image ni (NHWC: at its first pixel).
        const int64_t out_at = s_.y_nhwc ? ni * s_.o * s_.oh * s_.ow + gi * og_
                                         : (ni * s_.o + gi * og_) * s_.oh * s_.ow;
        const int64_t in_at = s_.x_nhwc ? ni * s_.c * s_.h * s_.w + gi * cg_
                                        : (ni * s_.c + gi * cg_) * s_.h * s_.w;
        Args a{pl, sh_, sw_, s_.stride_h, s_.stride_w, rb, re,
               x + in_at, s_.h, s_.w, s_.pad_top, s_.pad_left, s_.c, s_.o, s_.x_nhwc, s_.y_nhwc,
               wk_.data() + gi * blocks_ * cg_ * s_.kh * s_.kw * kBlock,
               bias_.data() + gi * og_,
               e_.residual ? residual + out_at : nullptr,
               y + out_at,
               cg_, og_, blocks_, s_.kh, s_.kw, s_.oh, s_.ow, e_};
        fn(a);
      }
    }
  });
}

}  // namespace kiln::kernels
