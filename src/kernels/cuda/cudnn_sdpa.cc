// Note [cuDNN SDPA graph]
// cuDNN 9.0-9.20 have no single attention operation for these options (the SDPA_FWD descriptor
// of newer headers is not in 9.14); they recognise attention as a graph and run it with their
// fused flash-attention engine. The graph built here, in the form those releases match (the
// shape cudnn-frontend's composite SDPA node lowers to for cuDNN < 9.21):
//
//   S  = matmul(Q [B,H,Sq,D], K^T [B,H,D,Skv])      float32, virtual   (K^T = K with the last
//   S  = S * scale                                   (by-value scalar)   two dims' strides swapped)
//   S  = S + mask                                    (optional, I/O dtype, [B|1, H|1, Sq, Skv])
//   S  = select(S, -inf, row >= col)                 (optional causal: GEN_INDEX axes 2 and 3,
//                                                     CMP_GE, BINARY_SELECT)
//   M  = reduce_max(S) [B,H,Sq,1];  E = exp(S - M);  L = reduce_sum(E) [B,H,Sq,1]
//   P  = E / L                                       I/O dtype, virtual
//   O  = matmul(P, V [B,H,Skv,Dv])                   I/O dtype
//
// Two forms are tried, in order: inference (as above), then training-style with the softmax
// statistics M + log(L) written to a [B,H,Sq,1] float32 output that lives in the plan's
// workspace (some engine versions only match the form with statistics). The first form that
// has an engine is used; sdpa_supported() reports both failures otherwise.
#include "kernels/cuda/cudnn_sdpa.h"

#include <cudnn_graph.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <deque>
#include <limits>
#include <mutex>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/cudnn_backend.h"

namespace kiln::cuda {

using cudnn::Descriptor;

namespace {

enum Uid : int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kMask = 5, kScale = 6, kNegInf = 7, kStats = 8, kVirtual = 100
};

constexpr size_t kStatsAlignment = 256;

std::array<int64_t, 4> contiguous(int64_t b, int64_t h, int64_t s, int64_t d) {
  (void)b;
  return {h * s * d, s * d, d, 1};
}

std::array<int64_t, 4> or_contiguous(const std::array<int64_t, 4>& st, int64_t b, int64_t h,
                                     int64_t s, int64_t d) {
  if (st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0) return contiguous(b, h, s, d);
  return st;
}

// The checks that need no GPU; "" when they pass. Throws for inconsistent requests.
std::string static_reason(const SdpaDesc& d, const std::string& what) {
  if (d.batch <= 0 || d.heads <= 0 || d.seq_q <= 0 || d.seq_kv <= 0 || d.head_dim <= 0 ||
      d.head_dim_v < 0)
    fail("{}: batch, heads, sequence lengths and head dims must be positive", what);
  if (d.causal && d.mask)
    fail("{}: an explicit mask cannot be combined with causal (fold the causal pattern into the "
         "mask)",
         what);
  if (d.mask && !((d.mask_batch == 1 || d.mask_batch == d.batch) &&
                  (d.mask_heads == 1 || d.mask_heads == d.heads)))
    fail("{}: the mask's batch {} and heads {} must be 1 or the batch {} and heads {}", what,
         d.mask_batch, d.mask_heads, d.batch, d.heads);
  if (d.dtype != DType::Float16 && d.dtype != DType::BFloat16)
    return fmt::format("dtype {}: cuDNN's fused attention takes float16 and bfloat16 only",
                       dtype_name(d.dtype));
  const int64_t dv = d.head_dim_v ? d.head_dim_v : d.head_dim;
  if (d.head_dim % 8 != 0 || dv % 8 != 0)
    return fmt::format("head dims {} and {} must be multiples of 8 for cuDNN's fused attention",
                       d.head_dim, dv);
  if (d.head_dim > 256 || dv > 256)
    return fmt::format("head dims {} and {} exceed 256, the most cuDNN's fused attention takes",
                       d.head_dim, dv);
  for (const auto* st : {&d.q_stride, &d.k_stride, &d.v_stride, &d.o_stride})
    if (!((*st)[0] == 0 && (*st)[1] == 0 && (*st)[2] == 0 && (*st)[3] == 0) && (*st)[3] != 1)
      return "the head dim of q, k, v and o must be contiguous (stride 1)";
  if (d.alignment_bytes < 2 || (d.alignment_bytes & (d.alignment_bytes - 1)) != 0)
    fail("{}: alignment_bytes must be a power of two of at least 2, got {}", what,
         d.alignment_bytes);
  return "";
}

}  // namespace

std::string describe(const SdpaDesc& d) {
  return fmt::format("scaled_dot_product_attention {} B{} H{} Sq{} Skv{} D{}{}{}{}",
                     info(d.dtype).short_name, d.batch, d.heads, d.seq_q, d.seq_kv, d.head_dim,
                     d.head_dim_v && d.head_dim_v != d.head_dim
                         ? fmt::format(" Dv{}", d.head_dim_v)
                         : "",
                     d.causal ? " causal" : "",
                     d.mask ? fmt::format(" mask[{},{},Sq,Skv]", d.mask_batch, d.mask_heads) : "");
}

bool sdpa_fully_masked_row_is_nan() { return false; }

struct SdpaPlan::Impl {
  std::deque<Descriptor> tensors;
  std::deque<Descriptor> ops;
  cudnn::GraphPlans graph;
  bool with_stats = false;
  size_t stats_bytes = 0;
  // By-value operands: the variant pack points at these (stable addresses, see GraphPlans).
  float scale = 0;
  float neg_inf = -std::numeric_limits<float>::infinity();
  // Note [cuDNN plan cache]: false while the graph is not built (a plan restored from the cache
  // is the one candidate); ensure_built builds it when more candidates are asked for.
  bool graph_built = false;
  std::string key;  // the plan cache's description of the plan
  std::mutex mu;    // guards turning a restored plan into a built one

  // Builds one form of the graph (Note [cuDNN SDPA graph]); false + *why when no engine.
  bool build(const SdpaDesc& d, bool stats, const std::string& what, std::string* why);
};

bool SdpaPlan::Impl::build(const SdpaDesc& d, bool stats, const std::string& what,
                           std::string* why) {
  graph.reset();
  tensors.clear();
  ops.clear();
  with_stats = stats;
  const int io = cudnn::data_type(d.dtype);
  const int f32 = CUDNN_DATA_FLOAT;
  const int64_t B = d.batch, H = d.heads, Sq = d.seq_q, Skv = d.seq_kv, D = d.head_dim;
  const int64_t Dv = d.head_dim_v ? d.head_dim_v : d.head_dim;
  const int64_t align = d.alignment_bytes;
  int64_t next_virtual = kVirtual;
  auto real = [&](int64_t uid, int type, std::vector<int64_t> dims,
                  std::vector<int64_t> strides) -> const Descriptor& {
    return tensors.emplace_back(cudnn::make_tensor(what, uid, type, dims, strides, align, false));
  };
  auto virt = [&](int type, std::vector<int64_t> dims) -> const Descriptor& {
    std::vector<int64_t> strides(4, 1);
    for (int i = 2; i >= 0; --i) strides[size_t(i)] = strides[size_t(i) + 1] * dims[size_t(i) + 1];
    return tensors.emplace_back(
        cudnn::make_tensor(what, next_virtual++, type, dims, strides, align, true));
  };
  auto scalar = [&](int64_t uid) -> const Descriptor& {
    return tensors.emplace_back(
        cudnn::make_tensor(what, uid, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, align, false, true));
  };
  auto matmul = [&](const Descriptor& a, const Descriptor& b, const Descriptor& c) {
    Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    mm.set_enum(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    mm.finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    op.finalize();
    ops.push_back(std::move(op));
  };
  auto reduce = [&](int op_type, const Descriptor& x, const Descriptor& y) {
    Descriptor r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    r.set_enum(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, op_type)
        .set_enum(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    r.finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    op.finalize();
    ops.push_back(std::move(op));
  };
  auto pointwise = [&](int mode, int math, const Descriptor& x, const Descriptor* b,
                       const Descriptor& y, const Descriptor* t = nullptr, int64_t axis = -1) {
    ops.push_back(cudnn::make_pointwise(what, mode, math, x, b, y, t, axis));
  };

  const auto qs = or_contiguous(d.q_stride, B, H, Sq, D);
  const auto ks = or_contiguous(d.k_stride, B, H, Skv, D);
  const auto vs = or_contiguous(d.v_stride, B, H, Skv, Dv);
  const auto os = or_contiguous(d.o_stride, B, H, Sq, Dv);
  const Descriptor& q = real(kQ, io, {B, H, Sq, D}, {qs[0], qs[1], qs[2], qs[3]});
  const Descriptor& kt = real(kK, io, {B, H, D, Skv}, {ks[0], ks[1], ks[3], ks[2]});
  const Descriptor& v = real(kV, io, {B, H, Skv, Dv}, {vs[0], vs[1], vs[2], vs[3]});
  const Descriptor& o = real(kO, io, {B, H, Sq, Dv}, {os[0], os[1], os[2], os[3]});
  const std::vector<int64_t> scores = {B, H, Sq, Skv}, rows = {B, H, Sq, 1};

  const Descriptor* s = &virt(f32, scores);
  matmul(q, kt, *s);
  {
    const Descriptor& scaled = virt(f32, scores);
    pointwise(CUDNN_POINTWISE_MUL, f32, *s, &scalar(kScale), scaled);
    s = &scaled;
  }
  if (d.mask) {
    const int64_t mb = d.mask_batch, mh = d.mask_heads;
    const Descriptor& m = real(kMask, io, {mb, mh, Sq, Skv},
                               {mh * Sq * Skv, Sq * Skv, Skv, 1});
    const Descriptor& masked = virt(f32, scores);
    pointwise(CUDNN_POINTWISE_ADD, f32, *s, &m, masked);
    s = &masked;
  }
  if (d.causal) {
    const Descriptor& row = virt(CUDNN_DATA_INT32, scores);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, *s, nullptr, row, nullptr, 2);
    const Descriptor& col = virt(CUDNN_DATA_INT32, scores);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, *s, nullptr, col, nullptr, 3);
    const Descriptor& keep = virt(CUDNN_DATA_BOOLEAN, scores);
    pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, keep);
    const Descriptor& masked = virt(f32, scores);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, *s, &scalar(kNegInf), masked, &keep);
    s = &masked;
  }
  const Descriptor& max = virt(f32, rows);
  reduce(CUDNN_REDUCE_TENSOR_MAX, *s, max);
  const Descriptor& shifted = virt(f32, scores);
  pointwise(CUDNN_POINTWISE_SUB, f32, *s, &max, shifted);
  const Descriptor& e = virt(f32, scores);
  pointwise(CUDNN_POINTWISE_EXP, f32, shifted, nullptr, e);
  const Descriptor& sum = virt(f32, rows);
  reduce(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  if (stats) {
    const Descriptor& log_sum = virt(f32, rows);
    pointwise(CUDNN_POINTWISE_LOG, f32, sum, nullptr, log_sum);
    const Descriptor& st = real(kStats, f32, rows, {H * Sq, Sq, 1, 1});
    pointwise(CUDNN_POINTWISE_ADD, f32, max, &log_sum, st);
  }
  const Descriptor& p = virt(io, scores);
  pointwise(CUDNN_POINTWISE_DIV, f32, e, &sum, p);
  matmul(p, v, o);

  std::vector<const Descriptor*> list;
  for (const Descriptor& op : ops) list.push_back(&op);
  cudnn::EngineFilter filter;  // f16/bf16: tensor cores with f32 accumulation
  graph_built = graph.build(d.device, list, filter, what, why);
  return graph_built;
}

namespace {

// What an attention plan depends on besides the machine: describe()'s shapes, the operands'
// strides, the scale and the pointers' alignment.
std::string cache_key(const SdpaDesc& d) {
  auto st = [](const std::array<int64_t, 4>& a) {
    return fmt::format("{},{},{},{}", a[0], a[1], a[2], a[3]);
  };
  return fmt::format("{} | q {} k {} v {} o {} | scale {} | align {}", describe(d),
                     st(d.q_stride), st(d.k_stride), st(d.v_stride), st(d.o_stride), d.scale,
                     d.alignment_bytes);
}

size_t stats_bytes_of(const SdpaDesc& d) {
  return (size_t(d.batch * d.heads * d.seq_q) * sizeof(float) + kStatsAlignment - 1) /
         kStatsAlignment * kStatsAlignment;
}

// Restores serialize()'s bytes (a form byte, then cuDNN's) into `im`; false (with `im` holding
// no plan and no graph) when they are malformed or cuDNN refuses them.
bool restore_into(SdpaPlan::Impl& im, const SdpaDesc& d, const std::string& tag,
                  const std::string& bytes, std::string* why_not) {
  im.tensors.clear();
  im.ops.clear();
  im.graph_built = false;
  if (bytes.size() < 2 || (bytes[0] != 's' && bytes[0] != 'i')) {
    im.graph.reset();
    *why_not = "the serialized attention plan has no form byte";
    return false;
  }
  im.with_stats = bytes[0] == 's';
  im.stats_bytes = im.with_stats ? stats_bytes_of(d) : 0;
  return im.graph.restore(d.device, bytes.substr(1), tag, describe(d), why_not);
}

// The cache's entry (key, tag) restored into `im`; false on a miss (`im` as it was) or a
// refusal (as restore_into).
bool restore_cached(SdpaPlan::Impl& im, const SdpaDesc& d, const std::string& tag,
                    cudnn::CachedPlan* hit) {
  if (!cudnn::plan_cache_get(d.device, im.key, tag, hit)) return false;
  std::string why;
  return restore_into(im, d, hit->tag, hit->bytes, &why);
}

}  // namespace

std::unique_ptr<SdpaPlan> SdpaPlan::blank(const SdpaDesc& desc) {
  std::unique_ptr<SdpaPlan> plan(new SdpaPlan());
  plan->desc_ = desc;
  plan->impl_ = std::make_unique<Impl>();
  plan->impl_->scale =
      float(desc.scale != 0 ? desc.scale : 1.0 / std::sqrt(double(desc.head_dim)));
  plan->impl_->key = cache_key(desc);
  return plan;
}

std::unique_ptr<SdpaPlan> SdpaPlan::try_create(const SdpaDesc& desc, std::string* why_not) {
  const std::string what = describe(desc);
  if (std::string r = static_reason(desc, what); !r.empty()) {
    *why_not = r;
    return nullptr;
  }
  require_cuda_device(desc.device, what.c_str());
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, desc.device),
             what.c_str());
  if (major < 8) {
    *why_not = fmt::format("cuDNN's fused attention needs sm_80 or newer (cuda:{} is sm_{}x)",
                           desc.device, major);
    return nullptr;
  }
  std::string why_available;
  if (!cudnn::available(&why_available)) {
    *why_not = why_available;
    return nullptr;
  }
  std::unique_ptr<SdpaPlan> plan = blank(desc);
  Impl& im = *plan->impl_;
  cudnn::CachedPlan hit;
  if (restore_cached(im, desc, "", &hit)) {
    plan->selected_ = {hit.tag, im.graph.first().workspace_bytes + im.stats_bytes, 0};
    return plan;
  }
  std::string why_inference, why_stats;
  if (!im.build(desc, /*stats=*/false, what, &why_inference) &&
      !im.build(desc, /*stats=*/true, what, &why_stats)) {
    *why_not = fmt::format("{} (inference form); {} (with statistics)", why_inference, why_stats);
    return nullptr;
  }
  im.stats_bytes = im.with_stats ? stats_bytes_of(desc) : 0;  // not a refused restore's
  const cudnn::PlanCandidate& first = im.graph.first();
  plan->selected_ = {first.tag, first.workspace_bytes + im.stats_bytes, 0};
  std::string bytes = im.graph.serialize(0);
  if (!bytes.empty()) {
    const cudnn::CachedPlan made{first.tag, first.tensor_cores,
                                 (im.with_stats ? "s" : "i") + bytes};
    cudnn::plan_cache_put(desc.device, im.key, "", made);
    cudnn::plan_cache_put(desc.device, im.key, first.tag, made);
  }
  return plan;
}

std::unique_ptr<SdpaPlan> SdpaPlan::create(const SdpaDesc& desc) {
  std::string why;
  auto plan = try_create(desc, &why);
  if (!plan)
    fail_kind(ErrorKind::NotSupported,
              "{}: not supported by cuDNN: {}; run it with the generated attention kernels or "
              "its decomposition",
              describe(desc), why);
  return plan;
}

SdpaSupport sdpa_supported(const SdpaDesc& desc) {
  SdpaSupport s;
  try {
    s.supported = SdpaPlan::try_create(desc, &s.reason) != nullptr;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotSupported) throw;
    s.reason = e.message();  // no GPU, no cuDNN: the caller falls back all the same
  }
  if (s.supported) s.reason.clear();
  return s;
}

// The serialized form: one byte for the graph's form ('s': with statistics, 'i': inference),
// then cuDNN's bytes.
std::unique_ptr<SdpaPlan> SdpaPlan::try_restore(const SdpaDesc& desc, const std::string& tag,
                                                const std::string& bytes,
                                                std::string* why_not) {
  if (std::string r = static_reason(desc, describe(desc)); !r.empty()) {
    *why_not = r;
    return nullptr;
  }
  cudnn::version();
  std::unique_ptr<SdpaPlan> plan = blank(desc);
  Impl& im = *plan->impl_;
  if (!restore_into(im, desc, tag, bytes, why_not)) return nullptr;
  plan->selected_ = {tag, im.graph.first().workspace_bytes + im.stats_bytes, 0};
  return plan;
}

void SdpaPlan::ensure_built() const {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  if (im.graph_built) return;
  std::string why;
  if (!im.build(desc_, im.with_stats, describe(desc_), &why))
    fail_kind(ErrorKind::Runtime, "{}: the cached plan restored, but the graph does not build: {}",
              describe(desc_), why);
  selected_.index = im.graph.index_of_restored(selected_.tag);  // the same engine, re-indexed
}

std::string SdpaPlan::serialize() const {
  std::string bytes = impl_->graph.serialize(size_t(selected_.index));
  return bytes.empty() ? bytes : (impl_->with_stats ? "s" : "i") + bytes;
}

SdpaPlan::~SdpaPlan() = default;

std::vector<SdpaEngine> SdpaPlan::candidates() const {
  ensure_built();
  std::vector<SdpaEngine> out;
  for (const cudnn::PlanCandidate& c : impl_->graph.candidates())
    out.push_back({c.tag, c.workspace_bytes + impl_->stats_bytes, int(out.size())});
  return out;
}

bool SdpaPlan::select_tag(const std::string& tag) {
  if (tag == selected_.tag) return true;
  Impl& im = *impl_;
  {
    // Another engine than the one at hand: as ConvPlan::select_tag (the cache's entry for a
    // restored plan, a built graph's candidates, then remembered).
    std::lock_guard<std::mutex> lock(im.mu);
    cudnn::CachedPlan hit;
    if (!im.graph_built && restore_cached(im, desc_, tag, &hit) && hit.tag == tag) {
      selected_ = {hit.tag, im.graph.first().workspace_bytes + im.stats_bytes, 0};
      return true;
    }
  }
  ensure_built();
  int i = 0;
  const cudnn::PlanCandidate* c = im.graph.find_tag(tag, &i);
  if (!c) return false;
  selected_ = {c->tag, c->workspace_bytes + im.stats_bytes, i};
  keep();
  return true;
}

void SdpaPlan::keep() const {
  const Impl& im = *impl_;
  const cudnn::PlanCandidate* c = nullptr;
  int i = 0;
  if (!(c = im.graph.find_tag(selected_.tag, &i))) return;
  const std::string bytes = im.graph.serialize(size_t(i));
  if (!bytes.empty())
    cudnn::plan_cache_put(desc_.device, im.key, selected_.tag,
                          {c->tag, c->tensor_cores, (im.with_stats ? "s" : "i") + bytes});
}

size_t SdpaPlan::plans_finalized() const { return impl_->graph.finalized(); }

void SdpaPlan::select(int index) {
  ensure_built();
  const auto& cs = impl_->graph.candidates();
  if (index < 0 || size_t(index) >= cs.size())
    fail("{}: engine index {} out of range ({} candidates)", describe(desc_), index, cs.size());
  selected_ = {cs[size_t(index)].tag, cs[size_t(index)].workspace_bytes + impl_->stats_bytes,
               index};
}

void SdpaPlan::run(const SdpaArgs& a) const {
  const SdpaDesc& d = desc_;
  const Impl& im = *impl_;
  auto check_ptr = [&](const void* p, const char* name) {
    if (!p) fail("{}: the {} pointer is null", describe(d), name);
    if (reinterpret_cast<uintptr_t>(p) % uintptr_t(d.alignment_bytes) != 0)
      fail("{}: the {} pointer {} is not {}-byte aligned as the plan was built for", describe(d),
           name, p, d.alignment_bytes);
  };
  check_ptr(a.q, "q");
  check_ptr(a.k, "k");
  check_ptr(a.v, "v");
  check_ptr(a.o, "o");
  if (a.workspace_bytes < selected_.workspace_bytes)
    fail("{}: the plan needs {} bytes of workspace, {} given", describe(d),
         selected_.workspace_bytes, a.workspace_bytes);
  if (selected_.workspace_bytes > 0 && !a.workspace)
    fail("{}: the workspace pointer is null ({} bytes needed)", describe(d),
         selected_.workspace_bytes);
  // Fixed arrays: a steady-state run allocates nothing (GraphPlans reuses its variant pack).
  std::array<int64_t, 8> uids = {kQ, kK, kV, kO, kScale};
  std::array<void*, 8> ptrs = {const_cast<void*>(a.q), const_cast<void*>(a.k),
                               const_cast<void*>(a.v), a.o, const_cast<float*>(&im.scale)};
  size_t n = 5;
  if (d.mask) {
    check_ptr(a.mask, "mask");
    uids[n] = kMask;
    ptrs[n++] = const_cast<void*>(a.mask);
  }
  if (d.causal) {
    uids[n] = kNegInf;
    ptrs[n++] = const_cast<float*>(&im.neg_inf);
  }
  // Layout of the workspace: [statistics (stats_bytes), cuDNN's workspace].
  void* engine_ws = a.workspace;
  size_t engine_ws_bytes = a.workspace_bytes;
  if (im.with_stats) {
    uids[n] = kStats;
    ptrs[n++] = a.workspace;
    engine_ws = static_cast<char*>(a.workspace) + im.stats_bytes;
    engine_ws_bytes -= im.stats_bytes;
  }
  im.graph.execute(size_t(selected_.index), uids.data(), ptrs.data(), n, engine_ws,
                   engine_ws_bytes, a.stream);
}

}  // namespace kiln::cuda
