// attention-heads-last: attention whose output is only transposed to [..., L, H, Ev] writes it
// so (scaled_dot_product_attention's heads_last attribute), and the transpose goes.
//
// Note [attention writes heads last]
// Multi-head attention computes [B, H, L, Ev] and models transpose that to [B, L, H, Ev] and
// reshape it to [B, L, H * Ev] for the output projection (BERT, ViT's MultiheadAttention, GPT-2
// through ONNX's Transpose). The transpose is a view, but the reshape of that view is not one:
// the memory planner materializes it as a copy kernel, one a layer (BERT-base, ViT-B/16: 12
// launches a call on CUDA). Written heads-last, attention's output is contiguous in the
// transposed order and the reshape is a view of it. Each output element is the same number as
// before: only where it is stored changes.
//
// Rewritten: a scaled_dot_product_attention node (not already heads_last) whose output has a
// batch dim, is not a graph output and has exactly one use, a transpose of dims -3 and -2 (or a
// permute that swaps just those). The node takes the transpose's output name; its provenance
// stays.
//
// Not in the default pipeline: a target runs it through Target::graph_passes where its attention
// kernels write heads-last (CUDA: cuDNN through the output's strides, the direct kernels through
// their output offsets). The CPU target decomposes attention, so it would gain nothing there.
// Expects: a valid graph. Guarantees: no rewritten attention's output is transposed.
#pragma once
#include <memory>

#include "passes/pass.h"

namespace kiln {

std::unique_ptr<Pass> make_attention_heads_last_pass();

// The number of attention nodes rewritten.
int attention_heads_last(Graph& g);

}  // namespace kiln
