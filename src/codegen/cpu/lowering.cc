// Which ops the CPU compiler lowers, recorded in their op records for `kiln ops` and the docs.
// The loop bodies themselves live in codegen.cc (expr_code) and the prelude; the scheduler's
// loop_supported() decides per node (dtype, shapes) whether a listed op really gets loop code.
#include "codegen/cpu/lowering.h"

#include <string_view>

#include "ops/op.h"

namespace kiln {

namespace {
const CpuLowering kPointwise{"loop", "pointwise loop code, fused with neighbouring pointwise ops"};
const CpuLowering kReduce{"loop", "reduction loop with fused pointwise prologue and epilogue"};
const CpuLowering kNorm{"loop", "two-pass norm kernel with fused prologue and epilogue"};
const CpuLowering kConv{"onednn", "oneDNN primitive built at compile time; blocked layouts, post-ops"};
const CpuLowering kLinear{"onednn", "oneDNN primitive with post-ops; small ones become a generated GEMV"};
const CpuLowering kPool{"onednn", "oneDNN pooling primitive (global average pooling: a loop reduction)"};
}  // namespace

void register_cpu_lowerings() {
  for (int i = 0; i < kNumOps; ++i) {
    OpDef& d = define_op(OpId(i));
    std::string_view fam = d.family;
    if (!d.is_view && (fam == "unary" || fam == "binary" || d.id == OpId::Copy)) d.cpu_lowering = &kPointwise;
    switch (d.id) {
      case OpId::Sum: case OpId::Mean: case OpId::Max: case OpId::Min: case OpId::Prod:
      case OpId::Var:
        d.cpu_lowering = &kReduce;
        break;
      case OpId::Softmax: case OpId::LogSoftmax: case OpId::LayerNorm:
        d.cpu_lowering = &kNorm;
        break;
      case OpId::Conv2d: case OpId::FusedConv2d: case OpId::ConvTranspose2d:
        d.cpu_lowering = &kConv;
        break;
      case OpId::Linear: case OpId::FusedLinear: case OpId::Matmul:
        d.cpu_lowering = &kLinear;
        break;
      case OpId::MaxPool2d: case OpId::AvgPool2d: case OpId::AdaptiveAvgPool2d:
        d.cpu_lowering = &kPool;
        break;
      default: break;
    }
  }
}

}  // namespace kiln
