// Kiln's own CPU kernel for grouped convolutions with few channels per group, where oneDNN's
// kernels stay far from the machine's FLOP rate whatever the layout (Note [convolution roofline]
// in targets/cpu/onednn_lowering.cc: 2-6 channels per group at 4.6-21x). See Note [Kiln grouped
// convolution] in grouped_conv.cc. The oneDNN node layer (onednn_node.cc) runs it as one step of
// a node's plan, so the compiler's measurement, packages and the runtime treat it as any other
// implementation of the node.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::kernels {

// float32, no dilation. x and y (the residual: y's layout) are NCHW, or NHWC in memory (dims
// still N, C, H, W).
struct GroupedConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // x
  int64_t o = 0, oh = 0, ow = 0;       // y
  int64_t groups = 1, kh = 0, kw = 0;  // weights [o, c / groups, kh, kw]
  int64_t pad_top = 0, pad_left = 0;   // the bottom and right pads follow from oh and ow
  int64_t stride_h = 1, stride_w = 1;
  bool x_nhwc = false, y_nhwc = false;
};

// The epilogue, in oneDNN's order: y = act(conv + bias + sum_scale * residual). Silu is
// v * sigmoid(v) (oneDNN's swish with alpha 1; EfficientNet's stems).
struct GroupedConvEpilogue {
  enum class Act : uint8_t { None, Relu, Clamp, Silu } act = Act::None;
  float lo = 0, hi = 0;  // Clamp
  float sum_scale = 1.0f;
  bool residual = false;
};

class GroupedConv {
 public:
  // Why the kernel does not take this convolution ("" when it does).
  // Grouped, or ungrouped with at most 4 input channels (an image stem); strides up to 2.
  static std::string why_not(const GroupedConvShape& s, int64_t dilation_h, int64_t dilation_w);
  // `weights`: [o, c / groups, kh, kw], float32, row-major; `bias`: [o] or null. Both are copied
  // (rearranged for the kernel).
  // `vector_floats`: 16 (AVX-512), 8 (AVX2) or 4 (generic) to run a narrower path than this
  // CPU's widest (tests of every path); 0 for the widest.
  GroupedConv(const GroupedConvShape& s, const GroupedConvEpilogue& e, const float* weights,
              const float* bias, int64_t vector_floats = 0);
  // Bytes of scratch run() needs when called with up to `threads` OpenMP threads.
  int64_t scratch_bytes(int threads) const;
  // x, residual (when the epilogue has one; may be y itself), y: float32 in the shape's
  // layouts. `scratch`: scratch_bytes(threads) bytes, 64-byte aligned. Parallel over images and
  // bands of output rows with the calling thread's OpenMP thread count (at most `threads` of
  // scratch_bytes).
  void run(const float* x, const float* residual, float* y, void* scratch) const;
  // "avx512" / "avx2" / "generic": the vector code this CPU runs.
  const char* isa() const;
  // Whether it runs on channel lanes (Note [Grouped convolution on channel lanes]: AVX2 or
  // AVX-512, NHWC in and out, 3x3, as many channels per group out as in: 1, 2 or 4 at equal
  // strides of 1 or 2, 8 at stride 1; channels a multiple of the vector) rather than in bands
  // of staged planes; that path needs no scratch.
  bool on_channel_lanes() const { return lanes_; }
  // Whether it runs an image stem on output-channel vectors (Note [Image stems on
  // output-channel vectors]: AVX2 or AVX-512, not grouped, at most 4 input channels, NHWC out,
  // output channels a multiple of 8).
  bool on_stem_path() const { return stem_; }

 private:
  GroupedConvShape s_;
  GroupedConvEpilogue e_;
  int64_t cg_ = 0, og_ = 0, blocks_ = 0;  // channels per group in and out; output blocks
  int64_t vec_ = 4;                        // floats per vector on this CPU
  int64_t sh_ = 0, sw_ = 0;                // the staged (zero-padded) plane's rows and columns
  std::vector<float> wk_;                  // [groups][blocks][cg][kh][kw][kBlock]
  std::vector<float> bias_;                // [o], zeros without a bias
  bool lanes_ = false;                     // on channel lanes, with wk_ as [blocks][kh][kw][G][V]
  bool stem_ = false;                      // a stem on output-channel vectors, wk_ as [block][tap][width]
};

}  // namespace kiln::kernels
