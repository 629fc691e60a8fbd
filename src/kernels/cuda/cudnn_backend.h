// Internal to src/targets/cuda: cuDNN 9's backend (graph) API as cudnn_conv.cc and
// cudnn_sdpa.cc use it (Note [cuDNN backend API] in cudnn_backend.cc). No cuDNN header here:
// descriptors are void* (cudnnBackendDescriptor_t), attribute names, types and enum values are
// the cuDNN enumerators passed as integers by the .cc files, which include cudnn_graph.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda::cudnn {

// cudnnGetVersion() of the loaded library (e.g. 91400 for 9.14.0); loads cuDNN on first use.
// Throws NotSupported ("cuDNN 9 (libcudnn.so.9) is needed for ...") when it cannot be loaded
// or is not version 9.
size_t version();
bool available(std::string* why);
// Loads cuDNN and makes device `device`'s handle: the first-use costs, paid ahead (Note [CUDA
// libraries opened ahead] in kernels/cuda/library_warm_up.h). Never throws.
void warm_up(int device);

// "CUDNN_STATUS_NOT_SUPPORTED (cuDNN's last error message)".
std::string status_text(int status);

// A cudnnBackendDescriptor_t, destroyed with the object. `what` names the op for messages.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(int descriptor_type, std::string what);
  ~Descriptor();
  Descriptor(Descriptor&& o) noexcept;
  Descriptor& operator=(Descriptor&& o) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  void* get() const { return desc_; }
  const std::string& what() const { return what_; }

  // cudnnBackendSetAttribute; throws Runtime naming `what` and the attribute on failure.
  Descriptor& set(int attribute, int attribute_type, int64_t count, const void* values);
  Descriptor& set_int64(int attribute, int64_t v);
  Descriptor& set_int64s(int attribute, const std::vector<int64_t>& v);
  Descriptor& set_double(int attribute, double v);
  Descriptor& set_float(int attribute, float v);
  Descriptor& set_bool(int attribute, bool v);
  // An enum-typed attribute (cudnnDataType_t, cudnnPointwiseMode_t, ...): `type` is its
  // CUDNN_TYPE_*; the value is stored as the 4-byte enum.
  Descriptor& set_enum(int attribute, int type, int value);
  Descriptor& set_desc(int attribute, const Descriptor& d);
  Descriptor& set_descs(int attribute, const std::vector<const Descriptor*>& ds);
  Descriptor& set_handle(int attribute, void* handle);
  // Finalizes; returns the cudnnStatus_t (0 = success) without throwing.
  int try_finalize();
  Descriptor& finalize();  // throws Runtime naming `what`

  int64_t get_int64(int attribute) const;
  // Descriptor-typed array attribute: fills up to `max_count` descriptors of `element_type`.
  std::vector<Descriptor> get_descs(int attribute, int element_type, int64_t max_count) const;
  // Enum-typed array attribute (numerical notes, knob types ...), up to `max_count` values.
  std::vector<int> get_enums(int attribute, int type, int64_t max_count) const;

 private:
  void* desc_ = nullptr;
  std::string what_;
};

// CUDNN_DATA_FLOAT / HALF / BFLOAT16 for float32 / float16 / bfloat16 (other dtypes: a Kiln bug).
int data_type(DType d);

// A finalized tensor descriptor (CUDNN_ATTR_TENSOR_*). `data_type` is a cudnnDataType_t.
Descriptor make_tensor(const std::string& what, int64_t uid, int data_type,
                       const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                       int64_t alignment, bool is_virtual, bool by_value = false);
// A finalized pointwise operation y = mode(x[, b[, t]]) computed in `math_precision`
// (cudnnDataType_t); `axis` >= 0 sets CUDNN_ATTR_POINTWISE_AXIS (GEN_INDEX).
Descriptor make_pointwise(const std::string& what, int mode, int math_precision,
                          const Descriptor& x, const Descriptor* b, const Descriptor& y,
                          const Descriptor* t = nullptr, int64_t axis = -1);

// The process-wide cudnnHandle_t of `device` (created on first use) and the mutex that guards
// its stream between cudnnSetStream and the enqueue of an execution.
struct Handle {
  void* handle = nullptr;  // cudnnHandle_t
  std::mutex mu;
};
Handle& handle_for(int device, const std::string& what);

// Note [cuDNN plan cache]: serialized execution plans on disk, by what determines them.
// `plan_key`: the plan's full description (the op's descriptor, alignment, engine filter);
// `tag`: an engine's tag, or "" for "the plan build() picks first". The key adds cuDNN's
// version, the GPU (name, compute capability, SM count) and the driver's version. Off when
// KILN_CUDNN_PLAN_CACHE is 0 or off; lookups fail and writes are skipped quietly where the
// cache directory cannot be read or written. Thread-safe.
struct CachedPlan {
  std::string tag;
  bool tensor_cores = false;
  std::string bytes;  // GraphPlans::serialize()'s
};
bool plan_cache_enabled();
bool plan_cache_get(int device, const std::string& plan_key, const std::string& tag,
                    CachedPlan* out);
void plan_cache_put(int device, const std::string& plan_key, const std::string& tag,
                    const CachedPlan& plan);

// Which engines an op accepts (from the engines' numerical notes).
struct EngineFilter {
  bool allow_tensor_cores = true;     // false: float32 without TF32 (TENSOR_CORE note rejected)
  bool allow_down_convert = false;    // DOWN_CONVERT_INPUTS: e.g. f32 inputs computed in f16
  bool allow_reduced_precision_reduction = false;  // f16 accumulation
  bool allow_nondeterministic = false;  // Design decision 10: same inputs, same bits
  // FFT and Winograd engines trade accuracy for speed (errors well above a direct convolution's
  // in float32); an autotuner with an accuracy gate may enable them.
  bool allow_fft_winograd = false;
};

// One execution plan of an operation graph.
struct PlanCandidate {
  Descriptor plan;
  int64_t engine = -1;        // CUDNN_ATTR_ENGINE_GLOBAL_INDEX
  std::string tag;            // "eng<engine> k<type>=<value>...": stable for one cuDNN version
  size_t workspace_bytes = 0;
  bool tensor_cores = false;  // the engine carries the TENSOR_CORE note
};

// An operation graph and its execution plans: the engine configurations that heuristics (mode
// A, then the fallback list) propose and `filter` accepts, in heuristic order. build() finalizes
// plans only until the first one builds (finalizing a runtime-fusion engine compiles kernels and
// can take a second); candidates() finalizes the rest on first use, for autotuning.
class GraphPlans {
 public:
  // Returns false with *why_not filled when the graph does not finalize or no engine builds.
  bool build(int device, const std::vector<const Descriptor*>& ops, const EngineFilter& filter,
             const std::string& what, std::string* why_not);
  // The configuration build() found (heuristics' first that builds).
  const PlanCandidate& first() const;
  // Every configuration that builds; [0] is first().
  const std::vector<PlanCandidate>& candidates() const;
  // The configuration with this tag (and its index in candidates() in *index), or null. Only
  // that configuration is finalized, if it was not yet (Note [One engine finalized by tag]): a
  // package loader pays for the engine it pins, not for the others.
  const PlanCandidate* find_tag(const std::string& tag, int* index) const;
  // How many execution plans are finalized (restored ones included).
  size_t finalized() const;
  // find_tag's index, or a Runtime error naming the plan: a graph built for a plan restored
  // from the cache must offer the restored engine (Note [cuDNN plan cache]).
  int index_of_restored(const std::string& tag) const;
  // Drops the graph, its plans and the kept variant pack (before the descriptors that build()
  // referenced are destroyed).
  void reset();
  // Note [Serialized cuDNN plans]: the bytes cuDNN serializes candidate `index`'s execution
  // plan to (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION), or "" where cuDNN cannot serialize
  // it (only runtime-fusion engines serialize) or the plan is a restored one.
  std::string serialize(size_t index) const;
  // Holds one plan, restored from serialize()'s bytes for the same cuDNN and GPU, as its only
  // candidate, under `tag` (no operation graph is built: no heuristics, no kernel compile).
  // false with *why_not (cuDNN's status and message) when cuDNN refuses them; the caller
  // then builds the plan.
  bool restore(int device, const std::string& bytes, const std::string& tag,
               const std::string& what, std::string* why_not);
  // Executes candidate `index` (of candidates(); 0 needs no call to it) with the variant pack
  // (uids[i] -> pointers[i]) on `stream`. The last variant pack is kept and reused while the
  // pointers stay the same (the steady state of an executable, whose arena addresses are fixed),
  // so such calls allocate nothing.
  // `count` pairs uids[i] -> pointers[i]; no heap allocation when the pack is reused.
  void execute(size_t index, const int64_t* uids, void* const* pointers, size_t count,
               void* workspace, size_t workspace_bytes, void* stream) const;

 private:
  struct Pending {
    Descriptor config;  // ENGINECFG
    int64_t engine = -1;
    std::string tag;
    bool tensor_cores = false;
  };
  // Finalizes `p` into candidates_ (false, with the reason in *rejected, when it does not
  // build). plans_mu_ held, or the object not yet shared.
  bool finalize_one(Pending& p, std::vector<std::string>* rejected) const;
  // Finalizes pending configurations until one builds (all of them when `all`).
  void finalize_pending(bool all, std::vector<std::string>* rejected) const;

  int device_ = 0;
  std::string what_;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::unique_ptr<Descriptor> graph_;
  mutable std::mutex plans_mu_;
  mutable std::vector<Pending> pending_;  // not yet finalized, heuristic order
  mutable std::vector<PlanCandidate> candidates_;
  // Variant packs by their pointers (Note [Variant packs of a shared plan]).
  struct Pack {
    Descriptor desc;
    std::vector<void*> pointers;
    std::vector<int64_t> uids;
    void* workspace = nullptr;
  };
  static constexpr size_t kMaxPacks = 32;
  mutable std::mutex pack_mu_;
  mutable std::vector<Pack> packs_;
  mutable size_t next_victim_ = 0;
};

}  // namespace kiln::cuda::cudnn
