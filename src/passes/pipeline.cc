// The one table of graph passes, in pipeline order. Adding a pass: its file pair under
// src/passes/ (declaring make_<name>_pass in its header) and one line here.
#include "passes/pipeline.h"
#include "passes/pass.h"
#include "passes/algebraic_simplify.h"
#include "passes/attention_heads_last.h"
#include "passes/attention_mask_guard.h"
#include "passes/autocast.h"
#include "passes/constant_fold.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/deconv_to_conv.h"
#include "passes/decompose.h"
#include "passes/default_pipeline.h"
#include "passes/fold_conv_bn.h"
#include "passes/fuse_attention.h"
#include "passes/fuse_epilogues.h"
#include "passes/grid_sample_layout.h"
#include "passes/matmul_to_linear.h"
#include "passes/merge_linears.h"
#include "passes/patch_conv.h"
#include "passes/window_conv.h"

namespace kiln {

namespace {
constexpr PassEntry kPasses[] = {
    // name      factory            in the default pipeline
    {"verify", make_verify_pass, false},
    {"decompose", [] { return make_decompose_pass(); }, false},  // norm ops stay whole for now
    {"algebraic-simplify", make_algebraic_simplify_pass, true},
    {"constant-fold", [] { return make_constant_fold_pass(); }, true},
    {"matmul-to-linear", make_matmul_to_linear_pass, true},
    {"pointwise-deconv-to-conv", make_pointwise_deconv_to_conv_pass, true},  // before fold-conv-bn
    // a target's choice (Target::graph_passes: CUDA), after the default pipeline
    {"patch-conv-to-linear", make_patch_conv_to_linear_pass, false},
    {"merge-sibling-linears", make_merge_sibling_linears_pass, false},
    {"fuse-attention", make_fuse_attention_pass, false},
    {"attention-heads-last", make_attention_heads_last_pass, false},
    {"fold-conv-bn", make_fold_conv_bn_pass, true},
    {"one-window-conv-to-linear", make_one_window_conv_to_linear_pass, true},  // before fuse-epilogues
    {"cse", make_cse_pass, true},
    {"fuse-epilogues", make_fuse_epilogues_pass, true},
    {"dce", make_dce_pass, true},
    // compile option precision (not in the default pipeline: compiler_pipeline adds one)
    {"autocast-bf16", [] { return make_autocast_pass(DType::BFloat16); }, false},
    {"autocast-f16", [] { return make_autocast_pass(DType::Float16); }, false},
    // a target's choice after autocast (Target::precision_graph_passes: CUDA, CPU)
    {"attention-mask-guard", make_attention_mask_guard_pass, false},
    {"grid-sample-channels-last", make_grid_sample_channels_last_pass, false},  // the CPU's
    {"default", make_default_pipeline_pass, false},  // all of the above marked true, in order
};
}  // namespace

std::span<const PassEntry> registered_passes() { return kPasses; }

std::vector<std::unique_ptr<Pass>> autocast_pipeline(DType precision) {
  check_precision(precision, "autocast");
  std::vector<std::unique_ptr<Pass>> passes;
  if (precision == DType::Float32) return passes;
  passes.push_back(make_autocast_pass(precision));
  // Casts the model had that now pair up exactly (low -> f32 -> low) go; duplicates merge.
  for (const char* cleanup : {"algebraic-simplify", "cse", "dce"}) passes.push_back(find_pass(cleanup));
  return passes;
}

std::vector<std::unique_ptr<Pass>> compiler_pipeline(
    const std::vector<OpId>& decompose, DType precision,
    std::function<bool(const Graph&, const Node&)> keep_node,
    const std::vector<std::string>& target_passes,
    const std::vector<std::string>& precision_passes) {
  std::vector<std::unique_ptr<Pass>> passes;
  for (const std::string& name : default_pipeline()) passes.push_back(find_pass(name));
  for (const std::string& name : target_passes) passes.push_back(find_pass(name));
  // After the inference passes (batch norm folded in float32), before the decompositions (a
  // float32 group_norm decomposes into float32 parts).
  for (auto& p : autocast_pipeline(precision)) passes.push_back(std::move(p));
  // After autocast: rewrites that depend on the dtypes the kernels will read.
  for (const std::string& name : precision_passes) passes.push_back(find_pass(name));
  if (!decompose.empty()) {
    DecomposeOptions o;
    o.ops = decompose;
    o.keep_node = std::move(keep_node);
    passes.push_back(make_decompose_pass(o));
    for (const char* cleanup : {"constant-fold", "cse", "dce"}) passes.push_back(find_pass(cleanup));
  }
  return passes;
}

}  // namespace kiln
