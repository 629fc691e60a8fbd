// ONNX ops whose output shapes depend on input values: NonZero, NonMaxSuppression and If with a
// condition. Each needs its inputs' values: known at import time they fold into constants (or,
// for If, the branch taken is imported in place); computed at run time, the node starts a
// data-dependent tail (Note [Data-dependent tails] in importer.h), where they run with the
// call's values.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "frontends/onnx/convert.h"

namespace kiln::onnx {
namespace {

// ---- NonZero ------------------------------------------------------------------------------------

// The coordinates of the non-zero elements in row-major order, [rank, count] int64. NaN is
// not zero.
void conv_nonzero(NodeCtx& c) {
  Tensor x = c.known_input(0, "the input, whose values set the output's size");
  if (x.dim() == 0) c.not_supported("a rank-0 input");
  const Dims d = x.sizes();
  const int r = x.dim();
  // Its float64 copy and the largest output (every element non-zero) within the tensor limit.
  if (x.numel() > c.options().max_tensor_bytes / 8 / r)
    c.fail("{} elements could give {} coordinates of 8 bytes, beyond the {}-byte tensor limit "
           "(ImportOptions::max_tensor_bytes)", x.numel(), x.numel() * r,
           c.options().max_tensor_bytes);
  std::vector<int64_t> flat;
  if (x.dtype() == DType::Bool) {  // comparisons' masks, the common input: read as they are
    const Tensor xc = x.contiguous();
    const bool* b = xc.data<bool>();
    for (int64_t i = 0; i < xc.numel(); ++i)
      if (b[i]) flat.push_back(i);
  } else {
    // float64 holds every Kiln dtype's zero test (int64 beyond 2^53 is still non-zero).
    const Tensor xd = x.to(DType::Float64).contiguous();
    const double* v = xd.data<double>();
    for (int64_t i = 0; i < xd.numel(); ++i)
      if (v[i] != 0 || std::isnan(v[i])) flat.push_back(i);
  }
  const int64_t n = int64_t(flat.size());
  std::vector<int64_t> out(size_t(r) * size_t(n));
  for (int64_t k = 0; k < n; ++k) {
    int64_t rest = flat[size_t(k)];
    for (int j = r - 1; j >= 0; --j) {
      out[size_t(j) * size_t(n) + size_t(k)] = rest % d[size_t(j)];
      rest /= d[size_t(j)];
    }
  }
  c.out(0, c.constant(Tensor::from_vector(out, Dims{int64_t(r), n})));
}

// ---- NonMaxSuppression -------------------------------------------------------------------------

struct Box {
  float x0, y0, x1, y1;  // x0 <= x1, y0 <= y1
};

// ONNX's box forms: center_point_box 0 is [y1, x1, y2, x2] with either corner first; 1 is
// [x_center, y_center, width, height].
Box box_at(const float* b, bool center) {
  if (center) {
    const float hw = b[2] / 2, hh = b[3] / 2;
    return {b[0] - hw, b[1] - hh, b[0] + hw, b[1] + hh};
  }
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

// Whether b suppresses a: intersection over union above the threshold (float arithmetic, as
// ONNX Runtime computes it; boxes without area suppress nothing).
bool suppresses(const Box& a, const Box& b, float threshold) {
  const float ix0 = std::max(a.x0, b.x0), iy0 = std::max(a.y0, b.y0);
  const float ix1 = std::min(a.x1, b.x1), iy1 = std::min(a.y1, b.y1);
  if (ix1 <= ix0 || iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float area_a = (a.x1 - a.x0) * (a.y1 - a.y0), area_b = (b.x1 - b.x0) * (b.y1 - b.y0);
  const float uni = area_a + area_b - inter;
  if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > threshold;
}

// Kept boxes by the x-range they cover: only boxes whose x-ranges overlap can suppress each
// other (suppresses() is false without a positive overlap), so a candidate is checked against
// the kept boxes in the buckets its range covers and no others, with the same result as
// checking every kept box. Detectors' class-offset boxes (torchvision's batched NMS) make
// this the difference between comparing with every kept box and a few. Boxes with non-finite
// coordinates leave every box checked (reset() returns false).
class KeptBoxes {
 public:
  bool reset(const Box* boxes, const std::vector<int64_t>& cands) {
    if (cands.size() < 64) return false;
    float lo = INFINITY, hi = -INFINITY, width = 0;
    for (int64_t i : cands) {
      const Box& q = boxes[i];
      if (!std::isfinite(q.x0) || !std::isfinite(q.x1) || !std::isfinite(q.y0) ||
          !std::isfinite(q.y1))
        return false;
      lo = std::min(lo, q.x0);
      hi = std::max(hi, q.x1);
      width += q.x1 - q.x0;
    }
    const float mean = width / float(cands.size());
    const double span = double(hi) - double(lo);
    if (!(span > 0) || !(mean > 0)) return false;
    count_ = int32_t(std::clamp(span / double(mean), 1.0, 4096.0));
    lo_ = lo;
    scale_ = double(count_) / span;
    buckets_.assign(size_t(count_), {});
    seen_.clear();
    stamp_ = 0;
    return true;
  }
  void add(int32_t index, const Box& q) {
    for (int32_t k = bucket(q.x0), e = bucket(q.x1); k <= e; ++k) buckets_[size_t(k)].push_back(index);
    seen_.push_back(0);
  }
  bool any_suppresses(const std::vector<Box>& kept, const Box& cand, float iou) {
    ++stamp_;
    for (int32_t k = bucket(cand.x0), e = bucket(cand.x1); k <= e; ++k)
      for (int32_t j : buckets_[size_t(k)]) {
        if (seen_[size_t(j)] == stamp_) continue;
        seen_[size_t(j)] = stamp_;
        if (suppresses(cand, kept[size_t(j)], iou)) return true;
      }
    return false;
  }

 private:
  int32_t bucket(float x) const {
    const double p = (double(x) - double(lo_)) * scale_;
    return int32_t(std::clamp(p, 0.0, double(count_ - 1)));
  }
  float lo_ = 0;
  double scale_ = 1;
  int32_t count_ = 1;
  uint32_t stamp_ = 0;
  std::vector<std::vector<int32_t>> buckets_;
  std::vector<uint32_t> seen_;
};

// Per batch and class: the boxes above score_threshold by descending score (lower index first
// on ties), each kept unless a kept one overlaps it by more than iou_threshold, at most
// max_output_boxes_per_class. Output [selected, 3]: (batch, class, box).
void conv_nms(NodeCtx& c) {
  Tensor boxes = c.known_input(0, "boxes");
  Tensor scores = c.known_input(1, "scores");
  int64_t max_out = 0;
  if (c.has_input(2)) {
    std::vector<int64_t> m = c.ints_input(2, "max_output_boxes_per_class");
    if (m.size() != 1) c.fail("max_output_boxes_per_class must hold one value, got {}", m.size());
    max_out = std::max<int64_t>(m[0], 0);
  }
  float iou = 0;
  if (c.has_input(3)) {
    std::vector<double> t = c.floats_input(3, "iou_threshold");
    if (t.size() != 1) c.fail("iou_threshold must hold one value, got {}", t.size());
    if (!(t[0] >= 0 && t[0] <= 1)) c.fail("iou_threshold must be in [0, 1], got {}", t[0]);
    iou = float(t[0]);
  }
  bool has_score = c.has_input(4);
  float score_threshold = 0;
  if (has_score) {
    std::vector<double> t = c.floats_input(4, "score_threshold");
    if (t.size() != 1) c.fail("score_threshold must hold one value, got {}", t.size());
    score_threshold = float(t[0]);
  }
  const int64_t cpb = c.attr_int("center_point_box", 0);
  if (cpb != 0 && cpb != 1) c.fail("center_point_box must be 0 or 1, got {}", cpb);
  if (boxes.dim() != 3 || boxes.size(2) != 4)
    c.fail("boxes must be [batch, boxes, 4], got {}", to_string(boxes.sizes()));
  if (scores.dim() != 3 || scores.size(0) != boxes.size(0) || scores.size(2) != boxes.size(1))
    c.fail("scores must be [batch, classes, boxes] = [{}, C, {}], got {}", boxes.size(0),
           boxes.size(1), to_string(scores.sizes()));
  if (!is_floating(boxes.dtype()) || !is_floating(scores.dtype()))
    c.fail("boxes and scores must be floating point, got {} and {}", dtype_name(boxes.dtype()),
           dtype_name(scores.dtype()));
  const int64_t nb = boxes.size(0), nbox = boxes.size(1), ncls = scores.size(1);
  // The largest output (every box of every class kept) within the tensor limit.
  if (nb > 0 && nbox > 0 && ncls > 0 &&
      std::min(max_out, nbox) > c.options().max_tensor_bytes / 24 / nb / ncls)
    c.fail("{} batches x {} classes x {} boxes could select more than the {}-byte tensor limit "
           "holds (ImportOptions::max_tensor_bytes)", nb, ncls, std::min(max_out, nbox),
           c.options().max_tensor_bytes);
  const std::vector<float> bv = boxes.to_vector<float>(), sv = scores.to_vector<float>();
  std::vector<Box> all(size_t(nb * nbox));
  for (int64_t i = 0; i < nb * nbox; ++i) all[size_t(i)] = box_at(&bv[size_t(4 * i)], cpb == 1);
  std::vector<int64_t> out;
  std::vector<int64_t> order;
  std::vector<Box> kept;
  KeptBoxes buckets;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t k = 0; k < ncls && max_out > 0; ++k) {
      const float* s = &sv[size_t((b * ncls + k) * nbox)];
      order.clear();
      for (int64_t i = 0; i < nbox; ++i)
        if (!has_score || s[i] > score_threshold) order.push_back(i);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      const bool bucketed = buckets.reset(all.data() + b * nbox, order);
      kept.clear();
      for (int64_t i : order) {
        if (int64_t(kept.size()) >= max_out) break;
        const Box& cand = all[size_t(b * nbox + i)];
        bool drop = false;
        if (bucketed) {
          drop = buckets.any_suppresses(kept, cand, iou);
        } else {
          for (const Box& q : kept)
            if (suppresses(cand, q, iou)) {
              drop = true;
              break;
            }
        }
        if (drop) continue;
        if (bucketed) buckets.add(int32_t(kept.size()), cand);
        kept.push_back(cand);
        out.insert(out.end(), {b, k, i});
      }
    }
  c.out(0, c.constant(Tensor::from_vector(out, Dims{int64_t(out.size() / 3), 3})));
}

// ---- If --------------------------------------------------------------------------------------------

// The branch the condition takes is imported in place: its nodes read the enclosing scope's
// values and its outputs become the node's.
void conv_if(NodeCtx& c) {
  const pb::GraphProto* then_branch = c.attr_graph("then_branch");
  const pb::GraphProto* else_branch = c.attr_graph("else_branch");
  if (!then_branch || !else_branch) c.fail("needs both then_branch and else_branch");
  Tensor cond = c.known_input(0, "the condition, which picks the branch");
  if (cond.numel() != 1) c.fail("the condition must hold one value, got {}", cond.numel());
  const bool take_then = cond.to_vector<double>()[0] != 0;
  std::vector<V> outs = import_branch(c, take_then ? *then_branch : *else_branch,
                                      take_then ? "then_branch" : "else_branch");
  if (outs.size() != c.num_outputs())
    c.fail("the {} has {} outputs, the node {}", take_then ? "then_branch" : "else_branch",
           outs.size(), c.num_outputs());
  for (size_t k = 0; k < outs.size(); ++k) c.out(k, outs[k]);
}

}  // namespace

void add_dynamic_converters(std::vector<OnnxOpEntry>& t) {
  t.push_back({"NonZero", conv_nonzero, {},
               "input known: at import, or at run time in a data-dependent tail"});
  t.push_back({"NonMaxSuppression", conv_nms, {},
               "inputs known: at import, or at run time in a data-dependent tail"});
  t.push_back({"If", conv_if, {},
               "condition known: at import, or at run time in a data-dependent tail; the branch "
               "taken is imported in place"});
}

}  // namespace kiln::onnx
