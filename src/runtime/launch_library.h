// The runtime's kernel library: launches made from plain data. The CPU compiler makes its loop
// and oneDNN launches here, and a package's loader rebuilds them here from their records, so a
// loaded package runs the same code over the same state as the compiled Executable did. See
// Note [Launch records] in launch_library.cc.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/executable.h"

namespace kiln::kernels {
class OnednnNode;
class OnednnLayouts;
}  // namespace kiln::kernels
namespace kiln::cuda {
class CudaKernel;
class CudaModule;
class GemmPlan;
class ConvPlan;
class SdpaPlan;
struct GemmDesc;
struct ConvDesc;
struct SdpaDesc;
}  // namespace kiln::cuda

namespace kiln {

// A generated loop kernel: `fn(slots, threads)`, the extern "C" function `symbol` of the
// kernels' shared object. `threads` (0 = all OpenMP threads, 1 = the calling thread) lives in
// the launch's state: *threads may be changed (autotuning) and the record says the value then.
struct LoopLaunch {
  Executable::Launch launch;
  int* threads = nullptr;
};
LoopLaunch make_loop_launch(void (*fn)(char* const*, int), const std::string& symbol,
                            int threads);
// A loop kernel with index checks (Note [Indexed loads] in lower/loop_ir.h) is
// `fn(slots, threads, err)`: it sets err[0] to the number of the check that failed and err[1]
// to the bad value, and the launch then throws an InvalidArgument error
// `checks[err[0]].first + value + checks[err[0]].second`.
using IndexCheckText = std::pair<std::string, std::string>;
LoopLaunch make_checked_loop_launch(void (*fn)(char* const*, int, int64_t*),
                                    const std::string& symbol, int threads,
                                    std::vector<IndexCheckText> checks);

// A oneDNN node over the slot table: inputs (slot -1 for absent or constant inputs), output 0
// and the scratch region. Each execution context gets its own instance of the node.
Executable::Launch make_onednn_launch(std::shared_ptr<const kernels::OnednnNode> node,
                                      const std::string& desc_json,
                                      const std::vector<MemRef>& inputs, MemRef output,
                                      MemRef scratch);

// Embedding rows: out[i, :] = table[idx[i], :] for `count` indices (int64 or int32; negative
// ones wrap; one out of [-rows, rows) throws naming `node`). Byte copies, so bitwise what the
// eager kernel computes. Lets models with embeddings (bert) be packaged.
Executable::Launch make_gather_rows_launch(MemRef table, int64_t rows, int64_t row_bytes,
                                           MemRef indices, bool int32_indices, int64_t count,
                                           MemRef out, const std::string& node);

// Concatenation along one dim, as byte copies (bitwise what the eager concat computes). A
// contiguous part copies, for each of `outer` blocks, its `chunk_bytes` to the output block at
// `dst_offset` (`out_chunk_bytes` per block). A strided part (a view: `sizes` non-empty) copies
// element by element: element idx of the view, at src + (elem_offset + sum idx*strides) *
// elem_bytes, goes to out (or the part's own dst) + dst_offset + sum idx*dst_strides *
// elem_bytes. Split is the same launch with one strided part per output.
struct ConcatPart {
  MemRef src;
  int64_t chunk_bytes = 0;
  int64_t dst_offset = 0;
  std::vector<int64_t> sizes, strides, dst_strides;  // strided parts only (elements)
  int64_t elem_offset = 0, elem_bytes = 0;
  MemRef dst;  // strided parts: a destination of its own (split's outputs); slot -1: `out`
};
// A part copied as one contiguous chunk per outer index (no strided geometry).
inline ConcatPart contiguous_part(MemRef src, int64_t chunk_bytes, int64_t dst_offset) {
  ConcatPart p;
  p.src = src;
  p.chunk_bytes = chunk_bytes;
  p.dst_offset = dst_offset;
  return p;
}
Executable::Launch make_concat_launch(std::vector<ConcatPart> parts, int64_t outer,
                                      int64_t out_chunk_bytes, MemRef out);

// Upsample (Note [Resample coordinates] in ops/resample.cc) of `planes` contiguous [h, w] planes
// of x into [ho, wo] planes of y: nearest (moves elements of any dtype) or bilinear (float32
// separably, other floating dtypes in float64 as the reference), with the eager kernels' tables
// and loops (core/resample.h), so bitwise what the eager kernel computes; planes split between
// OpenMP threads. Lets FPN and segmentation heads be compiled without an eager launch, and
// packaged.
struct UpsampleSpec {
  bool bilinear = false, align_corners = false;
  std::vector<double> scales;  // none, or (H, W): as the op's attribute
  int64_t planes = 0, h = 0, w = 0, ho = 0, wo = 0;
  DType dtype = DType::Float32;
};
Executable::Launch make_upsample_launch(const UpsampleSpec& spec, MemRef x, MemRef y);

// ---- CUDA launches (Note [CUDA launch records] in launch_cuda.cc) ------------------------------
// One kernel of one of the executable's CUDA modules (Executable::device_modules, by name): a
// generated loop kernel (every argument a slot's base, offset 0) or a direct kernel (inputs,
// outputs, then the status record), launched on the execution context's stream.
struct CudaKernelSpec {
  std::string module;  // the module's name
  std::string kernel;  // the extern "C" __global__ function
  unsigned grid = 0;   // blocks (x); 0: nothing to do
  unsigned block = 1;  // threads per block (x)
  unsigned shared = 0; // dynamic shared memory per block, bytes
  std::vector<MemRef> args;  // one pointer parameter each: slots[slot] + byte_offset
  // Launched programmatically (Note [CUDA programmatic launch] in targets/cuda/target.cc): set
  // only for generated kernels, whose first statement waits for the previous kernel.
  bool programmatic = false;
};
Executable::Launch make_cuda_kernel_launch(const cuda::CudaKernel& kernel, CudaKernelSpec spec);

// A cuBLASLt GEMM, D = op(A) op(B) (+ bias), with the plan made by the compiler (or the loader).
// `plan` null: a launch for a package only (a cross-build without a GPU), which fails if run;
// its record leaves the algorithm to the loader. With a plan, the record pins the plan's
// algorithm (the loader refuses a cuBLASLt that does not offer the same one).
struct CublasltBuffers {
  MemRef a, b, bias, d, workspace;
  int64_t workspace_bytes = 0;  // the scratch region's size (>= the algorithm's workspace)
};
Executable::Launch make_cublaslt_launch(const cuda::GemmDesc& desc,
                                        std::shared_ptr<const cuda::GemmPlan> plan,
                                        CublasltBuffers buffers);

// A cuDNN convolution (graph plan with its selected engine) between direct kernels of the
// executable's library module: `pre` kernels run before it (layout changes of x and the
// residual into the scratch region), `post` kernels after it (the epilogue no engine fused, the
// layout change of y out of the scratch region). x, y and residual are the buffers cuDNN reads
// and writes, in the plan's layout. `w_krsc`: the w buffer holds a KCRS filter (a weight as the
// model stores it) and the plan reads KRSC: each execution context is made with a KRSC copy
// (made once per source buffer on the device, shared by the contexts). `plan` null: a launch
// for a package only, as above; the record then leaves the engine to the loader. See Note
// [CUDA convolution layouts] in targets/cuda/target.cc.
struct CudnnConvBuffers {
  MemRef x, w, bias, y, residual, workspace;
  int64_t workspace_bytes = 0;
};
struct CudnnConvKernels {
  std::vector<CudaKernelSpec> pre, post;
  std::vector<const cuda::CudaKernel*> pre_loaded, post_loaded;  // empty: not loaded (cross-build)
};
// `w_stored_krsc` (with w_krsc): the w buffer holds the filter as KRSC already (a package's
// filter permuted at load: Note [Filters stored KRSC at load] in launch_cuda.cc), so no copy is
// made; the record still says w_krsc (the package's weights are KCRS).
Executable::Launch make_cudnn_conv_launch(const cuda::ConvDesc& desc,
                                          std::shared_ptr<const cuda::ConvPlan> plan,
                                          CudnnConvBuffers buffers, const CudnnConvKernels& kernels,
                                          bool w_krsc, bool w_stored_krsc = false);

// Note [Filters stored KRSC at load] (launch_cuda.cc): the constants of a CUDA package that only
// channels-last convolutions read, as their filter, whole; by slot, the filter's shape. A load
// stores them KRSC on the device (KrscFilter::permute) instead of making KRSC copies beside
// them. `constant_slots`: slot -> constant bytes (0: not a constant's slot); `output_slots`:
// the slots the outputs read. Unparseable records are skipped (the launches' own checks report
// them later); any other reference to a slot, or a doubt, keeps it KCRS.
struct KrscFilter {
  int64_t k = 0, c = 0, rs = 0, elem_bytes = 0;
  int64_t bytes() const { return k * c * rs * elem_bytes; }
  // 1x1, or one channel per group (depthwise): KRSC is KCRS, byte for byte.
  bool identity() const { return rs == 1 || c == 1; }
  // KCRS `from` -> KRSC `to` (host memory, bytes() each; a copy where identity()).
  void permute(const void* from, void* to) const;
  // KRSC `from` -> KCRS `to`: permute undone (a package written from an executable that stores
  // its filters KRSC: Note [Filters stored KRSC in process] in targets/cuda/target.cc).
  void restore(const void* from, void* to) const;
  bool operator==(const KrscFilter&) const = default;
};
// The filter shape of a convolution's descriptor (K: the filter's first dim).
KrscFilter krsc_filter_of(const cuda::ConvDesc& d);
std::map<int32_t, KrscFilter> filters_to_store_krsc(const std::vector<LaunchRecord>& records,
                                                    const std::vector<int64_t>& constant_slots,
                                                    const std::vector<int32_t>& output_slots);

// cuDNN's fused attention (flash attention graph plan with its selected engine), o = softmax(q k^T
// scale [+ causal]) v over contiguous [B, H, S, D] buffers. Always made with a plan (cross-builds
// run attention as a direct kernel instead); the record pins the engine by its tag.
struct CudnnSdpaBuffers {
  MemRef q, k, v, o, workspace;
  int64_t workspace_bytes = 0;
  MemRef mask;  // when the descriptor has one: contiguous [mask_batch, mask_heads, Sq, Skv]
};
Executable::Launch make_cudnn_sdpa_launch(std::shared_ptr<const cuda::SdpaPlan> plan,
                                          CudnnSdpaBuffers buffers);

// A cuDNN descriptor as its package record writes it (complete: a load rebuilds the plan from
// it). Equal texts, equal plans: the CUDA target builds one plan per distinct descriptor of a
// compile and the loader one per distinct record (LaunchPrebuildKeyFn), each plan then serving
// several launches (Note [Variant packs of a shared plan] in kernels/cuda/cudnn_backend.cc).
std::string cudnn_desc_key(const cuda::ConvDesc& desc);
std::string cudnn_desc_key(const cuda::SdpaDesc& desc);
// False when KILN_SHARED_PLANS=0 (read once): every launch then builds its own library plan, at
// compile time and at load (the A/B switch for the sharing above).
bool library_plans_shared();

// What rebuilding a launch needs from the package being loaded.
struct LaunchEnv {
  std::function<void*(const std::string& symbol)> symbol;  // in the kernels' shared object; null if absent
  std::function<Tensor(const std::string& name)> constant;  // weights by name
  kernels::OnednnLayouts* onednn_layouts = nullptr;         // shared by the package's nodes
  // Note [oneDNN threads at load] (launch_library.cc): a CPU package's oneDNN nodes are rebuilt
  // for this OpenMP thread count (the loading thread's, when it is below the count the package
  // was written for, which is current during the rebuilds) wherever that gives each node as it
  // was written; 0: the current count. A node that comes out differently is built for the current
  // count instead, and counted in onednn_nodes_at_written_threads.
  int onednn_load_threads = 0;
  int onednn_nodes = 0, onednn_nodes_at_written_threads = 0;  // rebuilt so far
  // Bytes available from the start of each slot's buffer (the arena, an input, a constant):
  // every buffer a rebuilt launch reads or writes through the slot table is checked against it,
  // so an edited manifest cannot make a launch reach outside its buffers. Null: not checked.
  std::function<int64_t(int32_t slot)> slot_bytes;
  // The slot table's size: a buffer in a slot at or past it is refused (-1: not checked). A slot
  // of 0 bytes exists (an empty input); a slot past the table would index outside it at run time.
  int32_t num_slots = -1;
  // CUDA packages: the package's loaded module of this name (null when it has none).
  std::function<std::shared_ptr<const cuda::CudaModule>(const std::string& name)> cuda_module;
  // CUDA packages run on a GPU of another architecture than they were built for (their PTX,
  // Note [PTX in CUDA packages] in package.cc): the library kernels recorded for the build's GPU
  // are not this GPU's, so cuBLASLt's and cuDNN's choices are made here, as for a cross-build.
  bool library_choices_at_load = false;
  // The result of this record's prebuild (prebuild_launches), or null: rebuild does the work.
  std::shared_ptr<void> prebuilt;
  // CUDA packages: the constant slots whose filters the load stored KRSC (filters_to_store_krsc).
  std::map<int32_t, KrscFilter> krsc_slots;
};

// Rebuilds a launch from its record; `where` names it in errors ("launch 3 'k2_add'"). Throws
// kiln::Error naming `where` for an unknown kind or malformed parameters.
using LaunchRebuildFn =
    std::function<Executable::Launch(const LaunchRecord&, LaunchEnv&, const std::string& where)>;
Executable::Launch rebuild_launch(const LaunchRecord& record, LaunchEnv& env,
                                  const std::string& where);
// A launch kind's parse-only check of a record: everything rebuild checks that needs no device
// and no kernels (descriptor ranges, every buffer inside its slot per env.slot_bytes, the form of
// recorded choices). Throws as rebuild does.
using LaunchValidateFn =
    std::function<void(const LaunchRecord&, LaunchEnv&, const std::string& where)>;
// A launch kind's slow part of a rebuild that depends on its record alone (a cuDNN plan, whose
// engine builds its kernels when it is finalized), which prebuild_launches runs ahead of the
// launch loop on several threads; rebuild then finds the result in LaunchEnv::prebuilt. It must
// be safe to run beside other records' prebuilds, and returns null (rebuild then does the work
// and reports the errors) when it cannot do it.
using LaunchPrebuildFn = std::function<std::shared_ptr<void>(
    const LaunchRecord&, const LaunchEnv&, const std::string& where)>;
// The part of a record its prebuild depends on, as a string (a cuDNN descriptor, engine and
// workspace; not its buffers): records with equal keys share one prebuilt result, built once
// (ResNet-50 has 53 convolutions of 23 descriptors; ViT-B/16 12 attentions of one). Empty: the
// record shares with none. The result must then serve every such launch (and every execution
// context) with its own buffers.
using LaunchPrebuildKeyFn = std::function<std::string(const LaunchRecord&)>;
// Registers a launch kind, the device whose memory its buffers are in and, optionally, its
// parse-only check (the runtime registers the host kinds "loop", "onednn", "gather_rows" and
// "concat" itself, without one), its prebuild and the prebuild's key.
void register_launch_kind(const std::string& kind, Device device, LaunchRebuildFn fn,
                          LaunchValidateFn validate = {}, LaunchPrebuildFn prebuild = {},
                          LaunchPrebuildKeyFn prebuild_key = {});
// Runs the prebuild of every record whose kind has one on up to `max_threads` threads, once per
// distinct key; result i belongs to records[i] (null where there is none; records of one key
// share theirs). Never throws for a record: a failed prebuild is a null result.
std::vector<std::shared_ptr<void>> prebuild_launches(const std::vector<LaunchRecord>& records,
                                                     const LaunchEnv& env,
                                                     const std::vector<std::string>& where,
                                                     int max_threads);
// Runs the kind's parse-only check of `record` (the CUDA kinds have one, so a CUDA package's
// records can be checked, and fuzzed, on a machine without a GPU). False when the kind has no
// such check; throws kiln::Error (ParseError, naming `where`) for an unknown kind or a record
// the check rejects.
bool validate_launch_record(const LaunchRecord& record, LaunchEnv& env, const std::string& where);
// The device of a registered launch kind; nullopt for a kind this runtime does not know.
std::optional<Device> launch_kind_device(const std::string& kind);

}  // namespace kiln
