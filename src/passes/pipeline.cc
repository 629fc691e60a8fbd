// The one table of graph passes, in pipeline order. Adding a pass: its file pair under
// src/passes/ (declaring make_<name>_pass in its header) and one line here.
#include "passes/pipeline.h"
#include "passes/pass.h"
#include "passes/algebraic_simplify.h"
#include "passes/constant_fold.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/decompose.h"
#include "passes/default_pipeline.h"
#include "passes/fold_conv_bn.h"
#include "passes/fuse_epilogues.h"

namespace kiln {

namespace {
constexpr PassEntry kPasses[] = {
    // name      factory            in the default pipeline
    {"verify", make_verify_pass, false},
    {"decompose", [] { return make_decompose_pass(); }, false},  // norm ops stay whole for now
    {"algebraic-simplify", make_algebraic_simplify_pass, true},
    {"constant-fold", [] { return make_constant_fold_pass(); }, true},
    {"fold-conv-bn", make_fold_conv_bn_pass, true},
    {"cse", make_cse_pass, true},
    {"fuse-epilogues", make_fuse_epilogues_pass, true},
    {"dce", make_dce_pass, true},
    {"default", make_default_pipeline_pass, false},  // all of the above marked true, in order
};
}  // namespace

std::span<const PassEntry> registered_passes() { return kPasses; }

std::vector<std::unique_ptr<Pass>> compiler_pipeline(const std::vector<OpId>& decompose) {
  std::vector<std::unique_ptr<Pass>> passes;
  for (const std::string& name : default_pipeline()) passes.push_back(find_pass(name));
  if (!decompose.empty()) {
    DecomposeOptions o;
    o.ops = decompose;
    passes.push_back(make_decompose_pass(o));
    for (const char* cleanup : {"constant-fold", "cse", "dce"}) passes.push_back(find_pass(cleanup));
  }
  return passes;
}

}  // namespace kiln
