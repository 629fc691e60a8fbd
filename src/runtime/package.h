// Deployment packages (.kiln): one file holding a compiled Executable — manifest, weights,
// kernels — that the runtime loads and runs without the compiler. The format is docs/package.md
// (Note [Package format] in package.cc).
//
//   write_package(exe, info, "model.kiln");              // compiler side (atomic)
//   LoadedPackage p = load_package("model.kiln");         // runtime side
//   p.exe->run(inputs, n_in, outputs, n_out);
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/executable.h"
#include "runtime/safetensors.h"

namespace kiln {

// The newest version this Kiln reads and writes, and the oldest it reads (docs/package.md,
// "Version policy"): version 2 added the optional `source` section and the manifest's
// `precision`; version 3 CUDA packages (the `kernels.cuda` section); version 4 CUDA convolution
// records with a residual, kernels around the convolution and KRSC filters (a version-3 runtime
// would ignore those keys and compute something else); version 5 cuDNN attention records
// with strided q, k, v (views read in place; a version-4 runtime would read them contiguous);
// version 6 oneDNN concat nodes in CPU packages (Note [oneDNN concat] in kernels/onednn_node.cc;
// a version-5 runtime has no such node); version 7 channels-last activations in CPU packages'
// oneDNN nodes (Note [channels-last values] in targets/cpu/onednn_lowering.cc; a version-6
// runtime would ignore the operand key and read them as NCHW) and the runtime's upsample
// launch; version 8 prepacked oneDNN weights in CPU packages (Note [prepacked weights] in
// kernels/onednn_node.cc; a version-7 runtime would not find the constants they replace) and
// the weights section's chunked hash (Note [chunked weights hash] in package.cc; a version-7
// runtime would compute another hash and call the package corrupt). A package is written with
// the lowest version that holds it: CPU packages are version 2, 6 with a oneDNN concat, 7 with a
// channels-last operand or an upsample, 8 with prepacked weights (the default); CUDA packages
// are 8 (their weights hashed in chunks; 3 to 7 still load), 9 with a cuDNN attention that writes
// its output through strides (`o_stride`: Note [attention writes heads last] in
// passes/attention_heads_last.h; a version-8 runtime would ignore the key and write the output
// contiguous, in the wrong order); version 10 CPU packages whose oneDNN node runs Kiln's grouped
// convolution kernel (conv_layout "kiln-direct": Note [Kiln grouped convolution] in
// kernels/grouped_conv.cc; a version-9 runtime would call the record malformed); version 11
// CPU packages where that kernel ends in silu (EfficientNet's stems; a version-10 runtime
// would refuse the record as a convolution its kernel does not take); version 12 CUDA packages
// whose cuDNN attention reads a mask (`mask`: Note [guarded attention masks] in
// passes/attention_mask_guard.h; a version-11 runtime would run the attention unmasked).
inline constexpr uint32_t kPackageFormatVersion = 12;
inline constexpr uint32_t kCudaPackageFormatVersion = 8;
inline constexpr uint32_t kCpuPackageFormatVersion = 2;
inline constexpr uint32_t kOnednnConcatFormatVersion = 6;
inline constexpr uint32_t kChannelsLastFormatVersion = 7;
inline constexpr uint32_t kUpsampleFormatVersion = 7;
inline constexpr uint32_t kPrepackedFormatVersion = 8;
inline constexpr uint32_t kAttentionOutputFormatVersion = 9;
inline constexpr uint32_t kKilnGroupedConvFormatVersion = 10;
inline constexpr uint32_t kKilnConvSiluFormatVersion = 11;
inline constexpr uint32_t kAttentionMaskFormatVersion = 12;
inline constexpr uint32_t kOldestPackageFormatVersion = 1;

// ---- the container: header, section table, sections -------------------------------------------
struct PackageSection {
  std::string name;   // "manifest" | "weights" | "kernels.cpu" | "kernels.cuda" | "source"
  std::string bytes;
};
// The file's bytes for these sections, in this order (hashes computed here), as format version
// `version`.
std::string package_container(const std::vector<PackageSection>& sections,
                              uint32_t version = kCpuPackageFormatVersion);
// Verifies header, format version, section table, order and every section's SHA-256; throws
// kiln::Error (ParseError) naming `source` and the section at fault. `version`, when given,
// receives the header's format version.
std::vector<PackageSection> parse_package_container(std::string_view bytes,
                                                    const std::string& source,
                                                    uint32_t* version = nullptr);
// parse_package_container over the whole file at `path` (an unreadable file is an
// InvalidArgument error naming it); `file_bytes`, when given, receives the file's size.
std::vector<PackageSection> read_package_sections(const std::string& path,
                                                  uint32_t* version = nullptr,
                                                  size_t* file_bytes = nullptr);

// The device a package was built for ("cpu" or "cuda"), from its header and manifest (both
// checked, their hashes included); the weights are neither read nor hashed. Errors as
// load_package's.
std::string package_target_device(const std::string& path);

// ---- writing ------------------------------------------------------------------------------------
// An input's or output's name in the source model, and its dims' symbolic names there ("" for a
// fixed dim): ONNX's dim_param ("batch_size"), "batch" for a zoo model's first dim. A package is
// specialized to one value of each (docs/package.md, "Signature, symbols and guards").
struct SignatureName {
  std::string name;
  std::vector<std::string> dims;
};

// What the manifest records besides the Executable: where it came from and how it was built.
struct PackageInfo {
  std::string model;     // "resnet18", "model.onnx"
  std::string mode = "default";
  std::string knobs;     // the target's configuration ("conv=auto,gemv=generated")
  // max-autotune's choice, "chose <configuration>" ("" otherwise; Note [Packages record the
  // choice, not the timings] in compiler/package.cc)
  std::string autotune;
  std::string precision = "float32";  // the compile option (autocast to bfloat16/float16)
  int64_t batch = 1;
  // The `source` section's bytes (the graph before the compiler's passes, for `kiln package
  // --replace-weights`: compiler/replace_weights.h); empty: no such section.
  std::string source;
  // The source model's names for the executable's inputs and outputs, in order (empty: the
  // executable's own names, input<k> and the graph's value names). Each must match the
  // executable's count and ranks, else package_bytes throws (Internal).
  std::vector<SignatureName> inputs, outputs;
  // CPU packages: hold oneDNN nodes' weights in their primitives' layouts rather than plain, so
  // that the load copies them instead of reordering (Note [prepacked weights] in
  // kernels/onednn_node.cc); the knob prepack=off clears it.
  bool prepack = true;
};
// The package bytes of `exe` (a CPU or CUDA Executable whose every launch has a record). Throws
// kiln::Error naming the launch and its graph nodes when one cannot be serialized (an eager
// kernel), so no package that would run differently is ever written.
std::string package_bytes(const Executable& exe, const PackageInfo& info);
// The same, written atomically to `path`.
void write_package(const Executable& exe, const PackageInfo& info, const std::string& path);

// The weights section's tensors of a package with this manifest, given every constant's plain
// data by name: the constants the manifest does not mark prepacked, in its order, then each
// oneDNN launch's prepacked entries (Note [prepacked weights] in kernels/onednn_node.cc), made
// here from the plain data by the launch's node, built as the loader builds it (every oneDNN
// launch in order, for the manifest's thread count). `kiln package --replace-weights` writes
// what this returns. Throws (InvalidArgument) naming the launch where a node here prepacks a
// constant in another layout than the manifest records (another CPU or oneDNN).
NamedTensors package_weights(std::string_view manifest,
                             const std::function<Tensor(const std::string&)>& constant,
                             const std::string& package);

// ---- loading ------------------------------------------------------------------------------------
struct LoadedPackage {
  std::shared_ptr<Executable> exe;
  std::string manifest;  // the manifest's JSON text
  std::string model, mode, kiln_version, isa;
  std::string device = "cpu";  // "cpu" | "cuda"
  std::string arch;            // CUDA: the architecture its kernels were built for ("sm_90")
  // CUDA: what was loaded: "cubin", or "ptx" (compiled for this GPU by the driver, library
  // choices made at load: Note [PTX in CUDA packages] in package.cc).
  std::string cuda_code;
  uint32_t format_version = 0;
  int threads = 0;       // the OpenMP thread count it was built with
  // CPU: the OpenMP thread count its oneDNN nodes were rebuilt for: the loading thread's where
  // lower than `threads` (Note [oneDNN threads at load] in launch_library.cc), except for the
  // onednn_nodes_at_written_threads of its onednn_nodes that came out differently with it and
  // were built for `threads` (all of them: onednn_threads is `threads`).
  int onednn_threads = 0;
  int onednn_nodes = 0, onednn_nodes_at_written_threads = 0;
  int64_t file_bytes = 0, weights_bytes = 0, kernels_bytes = 0, source_bytes = 0;  // kernels: cpu or cuda
  // Where the load's wall time went, in seconds, in load order: "verify" (container and section
  // hashes), "device" (CUDA: the device and its context), "weights" (parsed, and uploaded for
  // CUDA), "kernels" (the signature, the CPU shared object or the CUDA modules), "manifest" (the
  // launch records parsed and checked), "launches <kind>" (each launch kind's rebuilds: oneDNN
  // primitives, cuBLASLt and cuDNN plans, ...), "prepare" (the first execution context: arena,
  // stream, staging).
  std::vector<std::pair<std::string, double>> load_phases;
};
// Reads, verifies and loads a package: the format version, every section's hash, this CPU's
// features against the package's requirement, then the kernels' shared object (from a memfd)
// and every launch rebuilt. Throws kiln::Error naming the file and the section on bad input.
LoadedPackage load_package(const std::string& path);
LoadedPackage load_package_bytes(std::string_view bytes, const std::string& source);

// What is inside, for `kiln explain model.kiln`: signature, target, launches, sizes. Verifies
// the container but loads nothing.
std::string explain_package(const std::string& path);

}  // namespace kiln
