// Convolution graphs on cuDNN's backend API (Note [cuDNN backend API] in cudnn_backend.cc).
//
// The graph: conv (forward, or backward-data for conv_transpose2d) -> [add bias] -> [add
// residual] -> [relu], every intermediate a virtual float32 tensor, the last op writing y in
// the I/O dtype. Tensors are described with logical NCHW dims and the strides of the chosen
// layout; filters likewise (KCRS or KRSC). Groups are implicit: cuDNN derives them from the
// filter's channel count (c_in / groups for forward, c_out / groups for transpose).
//
// conv_transpose2d = the gradient of a convolution with respect to its input: with filter
// [c_in, c_out/g, kh, kw], "dy" = x [n, c_in, h, w] and "dx" = y [n, c_out, oh, ow], where
// oh = (h - 1) * stride - pad_pre - pad_post + dilation * (kh - 1) + 1 + output_padding. The
// forward relation oh -> h rounds down, so output_padding (< stride) needs no extra attribute.
#include "kernels/cuda/cudnn_conv.h"

#include <cudnn_graph.h>

#include <deque>
#include <mutex>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/cudnn_backend.h"

namespace kiln::cuda {

using cudnn::Descriptor;

namespace {

enum Uid : int64_t { kX = 1, kW = 2, kY = 3, kBias = 4, kResidual = 5, kVirtual = 100 };

// Strides of a logical [d0, d1, d2, d3] = [N, C, H, W] tensor stored in `layout`.
std::vector<int64_t> strides_of(const std::array<int64_t, 4>& d, ConvLayout layout) {
  if (layout == ConvLayout::NCHW) return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
  return {d[2] * d[3] * d[1], 1, d[3] * d[1], d[1]};  // NHWC
}

Descriptor tensor(const std::string& what, int64_t uid, int type,
                  const std::array<int64_t, 4>& dims, const std::vector<int64_t>& strides,
                  int64_t alignment, bool is_virtual) {
  return cudnn::make_tensor(what, uid, type, {dims.begin(), dims.end()}, strides, alignment,
                            is_virtual);
}

Descriptor pointwise_op(const std::string& what, cudnnPointwiseMode_t mode, const Descriptor& x,
                        const Descriptor* b, const Descriptor& y) {
  return cudnn::make_pointwise(what, mode, CUDNN_DATA_FLOAT, x, b, y);
}

void validate(const ConvDesc& d, const std::string& what) {
  if (d.dtype != DType::Float32 && d.dtype != DType::Float16 && d.dtype != DType::BFloat16)
    fail_kind(ErrorKind::NotSupported,
              "{}: dtype {} is not supported by the cuDNN path (float32, float16, bfloat16)", what,
              dtype_name(d.dtype));
  if (d.n <= 0 || d.c_in <= 0 || d.h <= 0 || d.w <= 0 || d.c_out <= 0 || d.kh <= 0 || d.kw <= 0)
    fail("{}: every size must be positive", what);
  if (d.groups <= 0 || d.c_in % d.groups != 0 || d.c_out % d.groups != 0)
    fail("{}: groups {} must divide both c_in {} and c_out {}", what, d.groups, d.c_in, d.c_out);
  for (int i = 0; i < 2; ++i) {
    if (d.stride[i] <= 0 || d.dilation[i] <= 0)
      fail("{}: stride and dilation must be positive", what);
    if (d.pad_pre[i] < 0 || d.pad_post[i] < 0) fail("{}: padding must be non-negative", what);
    if (d.output_padding[i] < 0 ||
        (d.output_padding[i] > 0 && d.kind != ConvKind::Transpose) ||
        (d.output_padding[i] >= d.stride[i] && d.output_padding[i] >= d.dilation[i]))
      fail("{}: output_padding {} must be smaller than the stride or the dilation (transpose "
           "only)",
           what, d.output_padding[i]);
  }
  if (d.allow_tf32 && d.dtype != DType::Float32)
    fail("{}: allow_tf32 applies to float32 only", what);
  const int64_t elem = dtype_size(d.dtype);
  if (d.alignment_bytes < elem || (d.alignment_bytes & (d.alignment_bytes - 1)) != 0)
    fail("{}: alignment_bytes must be a power of two of at least the element size ({}), got {}",
         what, elem, d.alignment_bytes);
}

}  // namespace

std::string describe(const ConvDesc& d) {
  // " tf32" is part of the description, which keys the tuning store: a TF32 convolution's
  // timed engine is not an exact one's.
  return fmt::format("{} {}{} {} {}x{}x{}x{} -> {} k{}x{} s{}x{} p{},{}/{},{} d{}x{} g{}{}{}{}",
                     d.kind == ConvKind::Forward ? "conv2d" : "conv_transpose2d",
                     info(d.dtype).short_name, d.allow_tf32 ? " tf32" : "", d.layout == ConvLayout::NCHW ? "NCHW" : "NHWC",
                     d.n, d.c_in, d.h, d.w, d.c_out, d.kh, d.kw, d.stride[0], d.stride[1],
                     d.pad_pre[0], d.pad_pre[1], d.pad_post[0], d.pad_post[1], d.dilation[0],
                     d.dilation[1], d.groups, d.bias ? " +bias" : "",
                     d.residual ? " +residual" : "", d.relu ? " +relu" : "");
}

std::array<int64_t, 4> conv_output_dims(const ConvDesc& d) {
  const std::string what = describe(d);
  validate(d, what);
  std::array<int64_t, 4> out = {d.n, d.c_out, 0, 0};
  const int64_t in[2] = {d.h, d.w}, k[2] = {d.kh, d.kw};
  for (int i = 0; i < 2; ++i) {
    const int64_t extent = d.dilation[i] * (k[i] - 1) + 1;
    if (d.kind == ConvKind::Forward) {
      const int64_t padded = in[i] + d.pad_pre[i] + d.pad_post[i];
      if (padded < extent)
        fail("{}: the kernel extent {} is larger than the padded input {}", what, extent, padded);
      out[2 + i] = (padded - extent) / d.stride[i] + 1;
    } else {
      out[2 + i] = (in[i] - 1) * d.stride[i] - d.pad_pre[i] - d.pad_post[i] + extent +
                   d.output_padding[i];
      if (out[2 + i] <= 0) fail("{}: the padding leaves an empty output", what);
    }
  }
  return out;
}

struct ConvPlan::Impl {
  std::deque<Descriptor> tensors;  // kept alive with the graph; references stay valid
  std::deque<Descriptor> ops;
  cudnn::GraphPlans graph;
  // Note [cuDNN plan cache]: false while the graph is not built (a plan restored from the
  // cache is the one candidate); ensure_built builds it when more candidates are asked for.
  bool graph_built = false;
  std::string key;  // the plan cache's description of the plan (cache_key)
  std::mutex mu;    // guards turning a restored plan into a built one
};

namespace {

// What a convolution's plan depends on besides the machine: the descriptor (describe() names
// dtype, TF32, layout, shapes, stride, padding, dilation, groups and the epilogue) and the
// pointers' alignment.
std::string cache_key(const ConvDesc& d) {
  return fmt::format("{} | align {} | output_padding {},{}", describe(d), d.alignment_bytes,
                     d.output_padding[0], d.output_padding[1]);
}

// Builds the cuDNN graph of `d` (output dims `y_dims`) into `im` and finalizes its first plan;
// false with *why_not when cuDNN has no engine.
bool build_graph(ConvPlan::Impl& im, const ConvDesc& d, const std::array<int64_t, 4>& y_dims,
                 std::string* why_not) {
  const std::string what = describe(d);
  im.graph.reset();
  im.tensors.clear();
  im.ops.clear();
  const int io = cudnn::data_type(d.dtype);
  const int64_t align = d.alignment_bytes;
  const bool transpose = d.kind == ConvKind::Transpose;
  const std::array<int64_t, 4> x_dims = {d.n, d.c_in, d.h, d.w};
  // Filter dims [K, C/g, R, S]: forward K = c_out; backward-data K = c_in ("dy"'s channels).
  const std::array<int64_t, 4> w_dims =
      transpose ? std::array<int64_t, 4>{d.c_in, d.c_out / d.groups, d.kh, d.kw}
                : std::array<int64_t, 4>{d.c_out, d.c_in / d.groups, d.kh, d.kw};
  const Descriptor& x = im.tensors.emplace_back(
      tensor(what, kX, io, x_dims, strides_of(x_dims, d.layout), align, false));
  const Descriptor& w = im.tensors.emplace_back(
      tensor(what, kW, io, w_dims, strides_of(w_dims, d.layout), align, false));
  const Descriptor& y = im.tensors.emplace_back(
      tensor(what, kY, io, y_dims, strides_of(y_dims, d.layout), align, false));
  int64_t next_virtual = kVirtual;
  const bool has_epilogue = d.bias || d.residual || d.relu;
  auto virtual_out = [&]() -> const Descriptor& {
    return im.tensors.emplace_back(tensor(what, next_virtual++, CUDNN_DATA_FLOAT, y_dims,
                                          strides_of(y_dims, d.layout), align, true));
  };
  const Descriptor* last = has_epilogue ? &virtual_out() : &y;

  Descriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, what);
  conv.set_enum(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
      .set_enum(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE,
                CUDNN_CROSS_CORRELATION)
      .set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2)
      .set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, {d.dilation[0], d.dilation[1]})
      .set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {d.stride[0], d.stride[1]})
      .set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {d.pad_pre[0], d.pad_pre[1]})
      .set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {d.pad_post[0], d.pad_post[1]});
  conv.finalize();
  {
    Descriptor op(transpose ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                            : CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                  what);
    // Float, as for every non-double data type: with double alpha/beta, cuDNN 9.14 on the H200
    // wrote +-0 for every element of a plain convolution (the low 4 bytes of 1.0 read as a
    // float are 0), on every engine but the runtime-fusion ones; float passes (measured
    // 2026-12-02 with tests/cuda/cuda_libs_test.cc, both ways, on the same machine).
    const float alpha = 1.0f, beta = 0.0f;
    if (transpose) {
      op.set_float(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, alpha)
          .set_float(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, beta)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, *last);
    } else {
      op.set_float(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, alpha)
          .set_float(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, beta)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *last);
    }
    if (const int s = op.try_finalize(); s != CUDNN_STATUS_SUCCESS) {
      *why_not = fmt::format("cuDNN {} rejects the convolution: {}", cudnn::version(),
                             cudnn::status_text(s));
      return false;
    }
    im.ops.push_back(std::move(op));
  }
  // Epilogue: each step reads `last` and writes a new virtual tensor, the final one y.
  const int steps = int(d.bias) + int(d.residual) + int(d.relu);
  int done = 0;
  auto step_out = [&]() -> const Descriptor& { return ++done == steps ? y : virtual_out(); };
  if (d.bias) {
    const std::array<int64_t, 4> b_dims = {1, d.c_out, 1, 1};
    const Descriptor& b = im.tensors.emplace_back(
        tensor(what, kBias, io, b_dims, {d.c_out, 1, 1, 1}, align, false));
    const Descriptor& out = step_out();
    im.ops.push_back(pointwise_op(what, CUDNN_POINTWISE_ADD, *last, &b, out));
    last = &out;
  }
  if (d.residual) {
    const Descriptor& r = im.tensors.emplace_back(
        tensor(what, kResidual, io, y_dims, strides_of(y_dims, d.layout), align, false));
    const Descriptor& out = step_out();
    im.ops.push_back(pointwise_op(what, CUDNN_POINTWISE_ADD, *last, &r, out));
    last = &out;
  }
  if (d.relu) {
    const Descriptor& out = step_out();
    im.ops.push_back(pointwise_op(what, CUDNN_POINTWISE_RELU_FWD, *last, nullptr, out));
    last = &out;
  }

  std::vector<const Descriptor*> ops;
  for (const Descriptor& op : im.ops) ops.push_back(&op);
  cudnn::EngineFilter filter;
  filter.allow_tensor_cores = d.dtype != DType::Float32 || d.allow_tf32;
  if (!im.graph.build(d.device, ops, filter, what, why_not)) return false;
  im.graph_built = true;
  return true;
}

// The plan of the cache's entry (key, tag) restored into `im`; false on a miss (`im` as it was)
// or a refusal (`im` then holds no plan and no graph: ensure_built builds them).
bool restore_cached(ConvPlan::Impl& im, const ConvDesc& d, const std::string& tag,
                    cudnn::CachedPlan* hit) {
  if (!cudnn::plan_cache_get(d.device, im.key, tag, hit)) return false;
  std::string why;
  im.tensors.clear();
  im.ops.clear();
  im.graph_built = false;
  return im.graph.restore(d.device, hit->bytes, hit->tag, describe(d), &why);
}

}  // namespace

std::unique_ptr<ConvPlan> ConvPlan::try_create(const ConvDesc& desc, std::string* why_not) {
  std::unique_ptr<ConvPlan> plan(new ConvPlan());
  plan->desc_ = desc;
  plan->out_ = conv_output_dims(desc);  // validates
  cudnn::version();  // NotSupported with the install hint when cuDNN is missing
  require_cuda_device(desc.device, describe(desc).c_str());
  plan->impl_ = std::make_unique<Impl>();
  Impl& im = *plan->impl_;
  im.key = cache_key(desc);
  cudnn::CachedPlan hit;
  if (restore_cached(im, desc, "", &hit)) {
    plan->selected_ = {hit.tag, im.graph.first().workspace_bytes, hit.tensor_cores, 0};
    return plan;
  }
  if (!build_graph(im, desc, plan->out_, why_not)) return nullptr;
  const cudnn::PlanCandidate& first = im.graph.first();
  plan->selected_ = {first.tag, first.workspace_bytes, first.tensor_cores, 0};
  const cudnn::CachedPlan made{first.tag, first.tensor_cores, im.graph.serialize(0)};
  cudnn::plan_cache_put(desc.device, im.key, "", made);
  cudnn::plan_cache_put(desc.device, im.key, first.tag, made);
  return plan;
}

void ConvPlan::ensure_built() const {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  if (im.graph_built) return;
  std::string why;
  if (!build_graph(im, desc_, out_, &why))
    fail_kind(ErrorKind::Runtime, "{}: the cached plan restored, but the graph does not build: {}",
              describe(desc_), why);
  selected_.index = im.graph.index_of_restored(selected_.tag);  // the same engine, re-indexed
}

std::unique_ptr<ConvPlan> ConvPlan::create(const ConvDesc& desc) {
  std::string why;
  auto plan = try_create(desc, &why);
  if (!plan)
    fail_kind(ErrorKind::NotSupported,
              "{}: {}; run the convolution without the fused epilogue and a separate epilogue "
              "kernel, or on the CPU",
              describe(desc), why);
  return plan;
}

std::unique_ptr<ConvPlan> ConvPlan::try_restore(const ConvDesc& desc, const std::string& tag,
                                                const std::string& bytes,
                                                std::string* why_not) {
  std::unique_ptr<ConvPlan> plan(new ConvPlan());
  plan->desc_ = desc;
  plan->out_ = conv_output_dims(desc);  // validates
  cudnn::version();
  plan->impl_ = std::make_unique<Impl>();
  plan->impl_->key = cache_key(desc);
  if (!plan->impl_->graph.restore(desc.device, bytes, tag, describe(desc), why_not))
    return nullptr;
  const cudnn::PlanCandidate& c = plan->impl_->graph.first();
  plan->selected_ = {c.tag, c.workspace_bytes, c.tensor_cores, 0};
  return plan;
}

std::string ConvPlan::serialize() const {
  return impl_->graph.serialize(size_t(selected_.index));
}

ConvPlan::~ConvPlan() = default;

std::vector<ConvEngine> ConvPlan::candidates() const {
  ensure_built();
  std::vector<ConvEngine> out;
  for (const cudnn::PlanCandidate& c : impl_->graph.candidates())
    out.push_back({c.tag, c.workspace_bytes, c.tensor_cores, int(out.size())});
  return out;
}

void ConvPlan::select(int index) {
  ensure_built();
  const auto& cs = impl_->graph.candidates();
  if (index < 0 || size_t(index) >= cs.size())
    fail("{}: engine index {} out of range ({} candidates)", describe(desc_), index, cs.size());
  const cudnn::PlanCandidate& c = cs[size_t(index)];
  selected_ = {c.tag, c.workspace_bytes, c.tensor_cores, index};
}

bool ConvPlan::select_tag(const std::string& tag) {
  if (tag == selected_.tag) return true;
  Impl& im = *impl_;
  {
    // Another engine than the one at hand (a tuned package's). A plan restored from the cache
    // looks for that engine's own entry; a built graph keeps its candidates (and their
    // indices); else the graph's candidates are finalized, and the choice remembered.
    std::lock_guard<std::mutex> lock(im.mu);
    cudnn::CachedPlan hit;
    if (!im.graph_built && restore_cached(im, desc_, tag, &hit) && hit.tag == tag) {
      selected_ = {hit.tag, im.graph.first().workspace_bytes, hit.tensor_cores, 0};
      return true;
    }
  }
  ensure_built();
  int i = 0;
  const cudnn::PlanCandidate* c = im.graph.find_tag(tag, &i);
  if (!c) return false;
  selected_ = {c->tag, c->workspace_bytes, c->tensor_cores, i};
  keep();
  return true;
}

void ConvPlan::keep() const {
  const cudnn::PlanCandidate* c = nullptr;
  int i = 0;
  if (!(c = impl_->graph.find_tag(selected_.tag, &i))) return;
  std::string bytes = impl_->graph.serialize(size_t(i));
  if (!bytes.empty())
    cudnn::plan_cache_put(desc_.device, impl_->key, selected_.tag,
                          {c->tag, c->tensor_cores, std::move(bytes)});
}

size_t ConvPlan::plans_finalized() const { return impl_->graph.finalized(); }

void ConvPlan::run(const ConvArgs& a) const {
  const ConvDesc& d = desc_;
  auto check_ptr = [&](const void* p, const char* name) {
    if (!p) fail("{}: the {} pointer is null", describe(d), name);
    if (reinterpret_cast<uintptr_t>(p) % uintptr_t(d.alignment_bytes) != 0)
      fail("{}: the {} pointer {} is not {}-byte aligned as the plan was built for", describe(d),
           name, p, d.alignment_bytes);
  };
  check_ptr(a.x, "x");
  check_ptr(a.w, "w");
  check_ptr(a.y, "y");
  // Fixed arrays: a steady-state run allocates nothing (GraphPlans reuses its variant pack).
  std::array<int64_t, 5> uids = {kX, kW, kY};
  std::array<void*, 5> ptrs = {const_cast<void*>(a.x), const_cast<void*>(a.w), a.y};
  size_t n = 3;
  if (d.bias) {
    check_ptr(a.bias, "bias");
    uids[n] = kBias;
    ptrs[n++] = const_cast<void*>(a.bias);
  }
  if (d.residual) {
    check_ptr(a.residual, "residual");
    uids[n] = kResidual;
    ptrs[n++] = const_cast<void*>(a.residual);
  }
  impl_->graph.execute(size_t(selected_.index), uids.data(), ptrs.data(), n, a.workspace,
                       a.workspace_bytes, a.stream);
}

bool conv_fused_supported(const ConvDesc& desc, std::string* why_not) {
  std::string why;
  bool ok = false;
  try {
    ok = ConvPlan::try_create(desc, &why) != nullptr;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotSupported) throw;
    why = e.message();  // no GPU, no cuDNN: the caller falls back all the same
  }
  if (why_not) *why_not = why;
  return ok;
}

void cudnn_warm_up(int device) { cudnn::warm_up(device); }

}  // namespace kiln::cuda
