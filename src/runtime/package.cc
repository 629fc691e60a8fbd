// Deployment packages. See package.h and docs/package.md.
//
// Note [Package format]
// A package is one file, little-endian throughout:
//   header, 64 bytes:  magic "KILNPKG\0" | u32 format version | u32 section count |
//                      u64 file size | SHA-256 of the section table (32 bytes) | u64 zero
//   section table:     per section 80 bytes: name (32 bytes, NUL-padded) | u64 offset |
//                      u64 size | SHA-256 of the section's bytes (32 bytes)
//   sections:          each starting at a multiple of 64, zero padding between them.
// Sections, in this order: "manifest" (JSON), "weights" (safetensors, runtime/safetensors.h),
// "kernels.cpu" (the loop kernels' shared object) when there are loop kernels, and, from format
// version 2, "source" (safetensors: the graph before the compiler's passes, for `kiln package
// --replace-weights`; the runtime verifies its hash and never reads it). Everything is
// checked before anything is used: the header, the file size (truncation), the table's hash,
// each section's bounds, order and hash, and that padding is zero, so a flipped bit anywhere is
// an error naming the part it hit. The manifest is then checked for meaning (slots, offsets and
// sizes in range, dtypes known) and the CPU's features against the manifest's requirement,
// which a hash cannot protect (a manifest can be edited and re-hashed).
//
// Determinism: every byte comes from the Executable and the graph (JSON objects with sorted
// keys, weights in value order, the shared object from the kernel cache, which g++ builds
// reproducibly); nothing records a time, a path or a host name. Compiling the same model twice
// gives the same bytes (tests/e2e/package_test.cc checks it).
//
// load_package maps the file (MAP_PRIVATE, read-only) and verifies it in place; packages are
// replaced by rename (write_package is atomic), never rewritten in place, so a mapped file does
// not change under the loader. Only the weights (into tensors) and the kernels are copied.
//
// The kernels are loaded from a memfd (memfd_create + dlopen of /proc/self/fd/N), or from a
// private temporary file unlinked right after dlopen where memfd is unavailable: nothing is
// left on disk either way.
//
// Note [One name per loaded kernel library]
// dlopen looks a path up among the objects already loaded by name before it opens anything.
// The memfd used to be closed right after dlopen, so the next package's memfd took the same
// number, its path /proc/self/fd/N named the library already loaded, and dlopen handed that
// library back: a second package whose kernels share names with the first's (the same model at
// another batch: k0_..., other loop bounds) ran the first package's kernels, silently wrong
// (found in the thirty-sixth session; Package.PackagesLoadedTogetherEachRunTheirOwnKernels).
// Now the memfd stays open as long as its library is loaded, so no other memfd can take its
// number; it is closed after dlclose, unless the library stayed loaded (an object the loader
// may not unload), whose fd is then kept for the process's life so that its name is never
// reused. Every handle a load gets must be one no live package holds (checked; a temporary
// file's name, random and unlinked after dlopen, is tried again on a clash), so a reuse is an
// error, never another package's code. The price: each loaded CPU package with loop kernels
// holds one file descriptor (a process at its descriptor limit gets the memfd's error, naming
// the package).
#include "runtime/package.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/cuda_driver.h"
#include "kernels/cuda/library_warm_up.h"
#include "kernels/json_numbers.h"
#include "kernels/onednn_node.h"
#include "runtime/launch_library.h"
#include "runtime/launch_records.h"
#include "runtime/safetensors.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/host_isa.h"

namespace kiln {

namespace {

using json = nlohmann::json;

// Whether a oneDNN node's descriptor (OnednnNodeDesc's JSON) has a channels-last operand.
bool onednn_channels_last(const json& desc) {
  auto cl = [](const json& o) { return o.is_object() && o.value("channels_last", false); };
  if (desc.contains("inputs"))
    for (const json& o : desc.at("inputs"))
      if (cl(o)) return true;
  return desc.contains("output") && cl(desc.at("output"));
}

// Whether a oneDNN node's descriptor runs Kiln's grouped convolution kernel (format version
// 10: Note [Kiln grouped convolution] in kernels/grouped_conv.cc).
bool onednn_kiln_conv(const json& desc) {
  const auto it = desc.find("conv_layout");
  return it != desc.end() && it->is_string() && *it == kernels::kKilnDirectLayout;
}

// Whether that kernel's epilogue ends in silu (format version 11).
bool onednn_kiln_conv_silu(const json& desc) {
  const auto it = desc.find("activation");
  return onednn_kiln_conv(desc) && it != desc.end() && it->is_string() && *it == "silu";
}

// A constant the executable holds in a kernel's own layout, on the host, back in the layout
// the model has it (what the package's weights hold): Note [Filters stored KRSC in process] in
// targets/cuda/target.cc.
Tensor weight_as_the_model_has_it(const Executable::ConstantSpec& c, Tensor host) {
  if (c.layout != "krsc" || host.dim() != 4 || !host.is_contiguous())
    fail_kind(ErrorKind::Internal, "package: constant '{}' is held in layout '{}', which the "
              "writer cannot restore", c.name, c.layout);
  const Dims& d = host.sizes();
  const KrscFilter f{d[0], d[1], d[2] * d[3], dtype_size(host.dtype())};
  Tensor out = Tensor::empty(d, host.dtype(), Device::cpu());
  f.restore(host.raw_data(), out.raw_data());
  return out;
}

// Note [Filters stored KRSC at load] (runtime/launch_cuda.cc): the constants, by name, with
// their slot and filter shape, that a CUDA package's load stores KRSC. Read from the manifest
// before it is checked: anything malformed leaves the constant out (the checks that follow
// report it).
std::map<std::string, std::pair<int32_t, KrscFilter>> krsc_constants(const json& m) {
  std::map<std::string, std::pair<int32_t, KrscFilter>> out;
  try {
    constexpr int64_t kMaxSlot = int64_t(1) << 20;
    std::map<int32_t, std::string> name_of;
    std::vector<int64_t> slot_bytes;
    for (const json& c : m.at("constants")) {
      const int64_t slot = c.at("slot").get<int64_t>();
      if (slot <= 0 || slot >= kMaxSlot || name_of.count(int32_t(slot))) continue;
      int64_t bytes = dtype_size(records::dtype_from(c.at("dtype"), "constant"));
      for (const json& d : c.at("shape")) bytes *= d.get<int64_t>();
      if (bytes <= 0) continue;
      name_of[int32_t(slot)] = c.at("name").get<std::string>();
      if (slot_bytes.size() <= size_t(slot)) slot_bytes.resize(size_t(slot) + 1, 0);
      slot_bytes[size_t(slot)] = bytes;
    }
    std::vector<int32_t> outputs;
    for (const json& o : m.at("outputs")) outputs.push_back(o.at("slot").get<int32_t>());
    std::vector<LaunchRecord> records;
    for (const json& l : m.at("launches"))
      records.push_back({l.at("kind").get<std::string>(), l.at("params").dump()});
    for (const auto& [slot, f] : filters_to_store_krsc(records, slot_bytes, outputs))
      out[name_of.at(slot)] = {slot, f};
  } catch (const std::exception&) {
    out.clear();  // a malformed manifest: the load's checks report it
  }
  return out;
}

// A CUDA package's library launches say which libraries its plans open: cuDNN for convolutions
// and attention, cuBLASLt for GEMMs of these data types. Started while the load verifies and
// uploads the weights and loads the cubins (Note [CUDA libraries opened ahead]); joined before
// the plans are built. A malformed manifest starts nothing: its checks report it.
void start_library_warm_up(cuda::LibraryWarmUp& warm, const json& manifest) {
  std::vector<DType> gemm;
  bool dnn = false;
  try {
    for (const json& l : manifest.at("launches")) {
      const std::string kind = l.at("kind").get<std::string>();
      if (kind == "cudnn_conv" || kind == "cudnn_sdpa") dnn = true;
      if (kind != "cublaslt") continue;
      const DType d = records::dtype_from(l.at("params").at("desc").at("dtype"), "gemm");
      if (std::find(gemm.begin(), gemm.end(), d) == gemm.end()) gemm.push_back(d);
    }
  } catch (const std::exception&) {
    return;
  }
  warm.start(0, dnn, std::move(gemm));
}

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'P', 'K', 'G', '\0'};
constexpr size_t kHeaderBytes = 64, kEntryBytes = 80, kNameBytes = 32, kAlign = 64;
constexpr uint32_t kMaxSections = 16;
// The sections in the format's order, and the format version that introduced each.
struct SectionKind {
  const char* name;
  uint32_t since;
};
constexpr SectionKind kSectionOrder[] = {
    {"manifest", 1}, {"weights", 1}, {"kernels.cpu", 1}, {"kernels.cuda", 3}, {"source", 2}};

void put_u32(std::string& s, size_t at, uint32_t v) { std::memcpy(&s[at], &v, 4); }
void put_u64(std::string& s, size_t at, uint64_t v) { std::memcpy(&s[at], &v, 8); }
uint32_t get_u32(std::string_view s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
uint64_t get_u64(std::string_view s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
std::string sha256_raw(std::string_view data) {
  std::string hex = sha256_hex(data), raw(32, '\0');
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < 32; ++i) raw[i] = char(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return raw;
}

// Note [chunked weights hash]
// From format version 8 the weights section (nearly all of a package's bytes) is hashed in
// chunks of 4 MiB: its entry in the section table holds the SHA-256 of the chunks' SHA-256
// digests, in order (no chunks for an empty section: the SHA-256 of nothing). Every other
// section, and the weights of older versions, hash as a whole. It is still one SHA-256 value
// per section that any changed, added or removed byte changes, but the chunks are independent:
// the loader verifies them on every core while it builds the launches, and copies the
// prepacked weights (Note [prepacked weights]) out of each chunk while the chunk is in cache
// (WeightsPass below). One SHA-256 stream runs at ~2 GB/s on this machine's cores, so a serial
// hash alone put a floor under a load: resnet50's 128 MB 65 ms, bert_base's 437 MB 0.23 s.
constexpr size_t kWeightsHashChunk = size_t(4) << 20;
constexpr uint32_t kChunkedHashFormatVersion = 8;

bool hashed_in_chunks(std::string_view section, uint32_t version) {
  return section == "weights" && version >= kChunkedHashFormatVersion;
}
std::string section_sha256(std::string_view section, std::string_view bytes, uint32_t version) {
  if (!hashed_in_chunks(section, version)) return sha256_raw(bytes);
  std::string digests;
  for (size_t at = 0; at < bytes.size(); at += kWeightsHashChunk)
    digests += sha256_raw(bytes.substr(at, kWeightsHashChunk));
  return sha256_raw(digests);
}
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  fail_kind(ErrorKind::ParseError, "package '{}': {}", source, what);
}

json dims_json(const Dims& d) {
  json a = json::array();
  for (int64_t x : d) a.push_back(x);
  return a;
}

// Note [Package signature]: the checks the runtime makes before each call, from the manifest's
// inputs: their count, then each one's dtype and shape (Executable::check_inputs). The writer
// records them; the loader requires a package's `guards` (if any) to be exactly these.
json guards_of(const json& inputs) {
  json g = json::array();
  g.push_back({{"check", "input_count"}, {"value", inputs.size()}});
  for (const json& in : inputs) {
    g.push_back({{"check", "dtype"}, {"input", in.at("name")}, {"value", in.at("dtype")}});
    g.push_back({{"check", "shape"}, {"input", in.at("name")}, {"value", in.at("shape")}});
  }
  return g;
}

}  // namespace

// ---- container ----------------------------------------------------------------------------------
std::string package_container(const std::vector<PackageSection>& sections, uint32_t version) {
  KILN_CHECK(version >= kOldestPackageFormatVersion && version <= kPackageFormatVersion,
             "package: format version {} ({}..{})", version, kOldestPackageFormatVersion,
             kPackageFormatVersion);
  KILN_CHECK(!sections.empty() && sections.size() <= kMaxSections,
             "package: {} sections (1..{})", sections.size(), kMaxSections);
  size_t table_end = kHeaderBytes + kEntryBytes * sections.size();
  std::vector<size_t> offsets;
  size_t at = align_up(table_end);
  for (const PackageSection& s : sections) {
    KILN_CHECK(!s.name.empty() && s.name.size() < kNameBytes, "package: bad section name '{}'",
               s.name);
    offsets.push_back(at);
    at = align_up(at + s.bytes.size());
  }
  size_t file_size = offsets.back() + sections.back().bytes.size();
  std::string out(file_size, '\0');
  std::memcpy(&out[0], kMagic, 8);
  put_u32(out, 8, version);
  put_u32(out, 12, uint32_t(sections.size()));
  put_u64(out, 16, file_size);
  for (size_t i = 0; i < sections.size(); ++i) {
    size_t e = kHeaderBytes + kEntryBytes * i;
    std::memcpy(&out[e], sections[i].name.data(), sections[i].name.size());
    put_u64(out, e + 32, offsets[i]);
    put_u64(out, e + 40, sections[i].bytes.size());
    std::string h = section_sha256(sections[i].name, sections[i].bytes, version);
    std::memcpy(&out[e + 48], h.data(), 32);
    std::memcpy(&out[offsets[i]], sections[i].bytes.data(), sections[i].bytes.size());
  }
  std::string th = sha256_raw(std::string_view(out).substr(kHeaderBytes, table_end - kHeaderBytes));
  std::memcpy(&out[24], th.data(), 32);
  return out;
}

namespace {
struct SectionView {
  std::string name;
  std::string_view bytes;
};
// `defer`: a section whose hash is not checked here but returned in *deferred_hash.
std::vector<SectionView> parse_sections(std::string_view b, const std::string& source,
                                        uint32_t* version_out, std::string_view defer = {},
                                        std::string_view* deferred_hash = nullptr);
const std::string_view* find_section(const std::vector<SectionView>& sections, std::string_view name) {
  for (const SectionView& s : sections)
    if (s.name == name) return &s.bytes;
  return nullptr;
}
}  // namespace

std::vector<PackageSection> parse_package_container(std::string_view b, const std::string& source,
                                                    uint32_t* version) {
  std::vector<PackageSection> out;
  for (const SectionView& v : parse_sections(b, source, version))
    out.push_back({v.name, std::string(v.bytes)});
  return out;
}

namespace {
// The container's checks (Note [Package format]); the sections as views of `b`.
std::vector<SectionView> parse_sections(std::string_view b, const std::string& source,
                                        uint32_t* version_out, std::string_view defer,
                                        std::string_view* deferred_hash) {
  if (b.size() < kHeaderBytes)
    bad(source, fmt::format("header: truncated ({} bytes; a package starts with a {}-byte header)",
                            b.size(), kHeaderBytes));
  if (std::memcmp(b.data(), kMagic, 8) != 0) bad(source, "header: not a Kiln package (bad magic)");
  uint32_t version = get_u32(b, 8);
  if (version < kOldestPackageFormatVersion || version > kPackageFormatVersion)
    bad(source, fmt::format("header: format version {}; this runtime reads versions {} to {} "
                            "(rebuild the package with this Kiln's `kiln compile`)",
                            version, kOldestPackageFormatVersion, kPackageFormatVersion));
  if (version_out) *version_out = version;
  uint64_t file_size = get_u64(b, 16);
  if (file_size != b.size())
    bad(source, fmt::format("header: the package is {} bytes, its header says {} (truncated or "
                            "extended)", b.size(), file_size));
  if (get_u64(b, 56) != 0) bad(source, "header: reserved bytes are not zero");
  uint32_t n = get_u32(b, 12);
  if (n == 0 || n > kMaxSections)
    bad(source, fmt::format("header: {} sections (1..{})", n, kMaxSections));
  size_t table_end = kHeaderBytes + kEntryBytes * n;
  if (table_end > b.size()) bad(source, "section table: truncated");
  if (sha256_raw(b.substr(kHeaderBytes, table_end - kHeaderBytes)) != b.substr(24, 32))
    bad(source, "section table: SHA-256 mismatch (the table is corrupt)");
  std::vector<SectionView> out;
  size_t prev_end = table_end;
  for (uint32_t i = 0; i < n; ++i) {
    size_t e = kHeaderBytes + kEntryBytes * i;
    std::string_view raw_name = b.substr(e, kNameBytes);
    size_t len = raw_name.find('\0');
    if (len == std::string_view::npos || len == 0) bad(source, fmt::format("section {}: bad name", i));
    for (size_t k = len; k < kNameBytes; ++k)
      if (raw_name[k] != '\0') bad(source, fmt::format("section {}: bad name padding", i));
    std::string name(raw_name.substr(0, len));
    uint64_t off = get_u64(b, e + 32), size = get_u64(b, e + 40);
    if (off % kAlign != 0 || off < prev_end || off > b.size() || size > b.size() - off)
      bad(source, fmt::format("section '{}': offset {} size {} out of range or out of order",
                              name, off, size));
    for (size_t k = prev_end; k < off; ++k)
      if (b[k] != '\0') bad(source, fmt::format("padding before section '{}' is not zero", name));
    out.push_back({name, b.substr(off, size)});
    prev_end = off + size;
  }
  if (prev_end != b.size()) bad(source, "bytes after the last section");
  // The sections, in the format's order, each once.
  size_t next = 0;
  for (const SectionView& s : out) {
    size_t k = 0;
    while (k < std::size(kSectionOrder) && s.name != kSectionOrder[k].name) ++k;
    if (k == std::size(kSectionOrder) || kSectionOrder[k].since > version)
      bad(source, fmt::format("section '{}': unknown to format version {}", s.name, version));
    if (k < next)
      bad(source, fmt::format("section '{}': out of order (the format's order is manifest, "
                              "weights, kernels.cpu, kernels.cuda, source)", s.name));
    next = k + 1;
  }
  if (out.size() < 2 || out[0].name != "manifest" || out[1].name != "weights")
    bad(source, "sections 'manifest' and 'weights' are required");
  // The hashes last: how a section is hashed depends on its name (Note [chunked weights hash]).
  for (size_t i = 0; i < out.size(); ++i) {
    std::string_view stored = b.substr(kHeaderBytes + kEntryBytes * i + 48, 32);
    if (!defer.empty() && out[i].name == defer && deferred_hash) {
      *deferred_hash = stored;  // the caller checks it (load_package_bytes)
    } else if (section_sha256(out[i].name, out[i].bytes, version) != stored) {
      bad(source, fmt::format("section '{}': SHA-256 mismatch (the section is corrupt)", out[i].name));
    }
  }
  return out;
}
}  // namespace

// ---- writing --------------------------------------------------------------------------------------
std::string package_bytes(const Executable& exe, const PackageInfo& info) {
  const bool cuda = exe.device().is_cuda();
  KILN_CHECK(exe.device().is_cpu() || cuda, "package: executables for {} cannot be packaged",
             exe.device().str());
  uint32_t version = cuda ? kCudaPackageFormatVersion : kCpuPackageFormatVersion;
  json m;
  m["kiln_version"] = KILN_VERSION;
  m["model"] = info.model;
  m["mode"] = info.mode;
  m["batch"] = info.batch;
  m["knobs"] = info.knobs;
  m["autotune"] = info.autotune;
  m["precision"] = info.precision;
  std::string cuda_kernels;
  if (cuda) {
    // Note [CUDA packages]: the modules' cubins one after another (64-byte aligned) in the
    // kernels.cuda section, listed by name in the manifest; the target is their architecture.
    // The modules' architecture (all alike), else (library calls only) the device's.
    std::string arch;
    if (!exe.device_modules.empty()) {
      arch = exe.device_modules[0].arch;
    } else {
      CudaDeviceInfo dev = cuda_device_info(exe.device().index);
      if (dev.error.empty()) arch = fmt::format("sm_{}{}", dev.sm_major, dev.sm_minor);
    }
    json mods = json::array();
    for (const Executable::DeviceModule& dm : exe.device_modules) {
      KILN_CHECK(dm.image && !dm.image->empty(), "package: CUDA module '{}' has no image", dm.name);
      if (dm.arch != arch)
        fail_kind(ErrorKind::Internal, "package: CUDA modules for two architectures ({}, {})",
                  arch, dm.arch);
      cuda_kernels.resize(align_up(cuda_kernels.size()), '\0');
      json mod = {{"name", dm.name}, {"arch", dm.arch}, {"offset", cuda_kernels.size()},
                  {"size", dm.image->size()}};
      cuda_kernels += *dm.image;
      if (dm.ptx && !dm.ptx->empty()) {  // Note [PTX in CUDA packages]
        KILN_CHECK(dm.ptx->back() == '\0', "package: the PTX of CUDA module '{}' is not "
                   "NUL-terminated", dm.name);
        cuda_kernels.resize(align_up(cuda_kernels.size()), '\0');
        mod["ptx_offset"] = cuda_kernels.size();
        mod["ptx_size"] = dm.ptx->size();
        cuda_kernels += *dm.ptx;
      }
      mods.push_back(std::move(mod));
    }
    KILN_CHECK(!arch.empty(), "package: no CUDA architecture is known for this executable");
    m["target"] = {{"device", "cuda"}, {"arch", arch}};
    m["cuda_modules"] = mods;
    m["cuda_graph"] = exe.graph_mode();
    json status = nullptr;
    if (exe.device_status_slot() >= 0) {
      json checks = json::array();
      for (const Executable::DeviceCheck& c : exe.device_checks())
        checks.push_back({{"code", c.code}, {"prefix", c.prefix}, {"suffix", c.suffix}});
      status = {{"slot", exe.device_status_slot()}, {"checks", checks}};
    }
    m["status"] = status;
  } else {
    m["target"] = {{"device", "cpu"}, {"isa", host_isa()}, {"threads", kernels::cpu_threads()}};
  }
  m["arena_bytes"] = exe.arena_bytes();
  m["num_slots"] = exe.num_slots();
  json ins = json::array(), outs = json::array(), consts = json::array(), launches = json::array();
  // Note [Package signature]: inputs and outputs by the source model's names; a dim that was
  // symbolic there carries its name (`dim_names`), `symbols` the value the package is
  // specialized to, and `guards` what the runtime checks before each call.
  json symbols = json::object();
  auto signature = [&](const std::vector<SignatureName>& names, size_t i, const std::string& own,
                       const Dims& sizes, json& rec) {
    if (names.empty()) {  // (else the counts were checked equal below)
      rec["name"] = own;
      return;
    }
    const SignatureName& n = names[i];
    rec["name"] = n.name;
    // Dim names are what the source declared: a declaration of another rank names nothing, and
    // a name already bound to another size is not recorded for this dim.
    if (n.dims.size() != sizes.size()) return;
    json dn = json::array();
    bool any = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const std::string& sym = n.dims[d];
      if (sym.empty() || (symbols.contains(sym) && symbols[sym] != sizes[d])) {
        dn.push_back(nullptr);
        continue;
      }
      any = true;
      dn.push_back(sym);
      symbols[sym] = sizes[d];
    }
    if (any) rec["dim_names"] = dn;
  };
  if (!info.inputs.empty())
    KILN_CHECK(info.inputs.size() == exe.inputs.size(), "package: {} input names for {} inputs",
               info.inputs.size(), exe.inputs.size());
  if (!info.outputs.empty())
    KILN_CHECK(info.outputs.size() == exe.outputs.size(), "package: {} output names for {} outputs",
               info.outputs.size(), exe.outputs.size());
  for (size_t i = 0; i < exe.inputs.size(); ++i) {
    const Executable::InputSpec& in = exe.inputs[i];
    json rec = {{"dtype", dtype_name(in.dtype)}, {"shape", dims_json(in.sizes)}, {"slot", in.slot}};
    // Note [Input staging in the arena] (lower/memory_planner.cc); absent: a block of its own
    // (packages before it, CPU packages).
    if (in.staging_offset >= 0) rec["staging_offset"] = in.staging_offset;
    signature(info.inputs, i, in.name, in.sizes, rec);
    ins.push_back(std::move(rec));
  }
  for (size_t i = 0; i < exe.outputs.size(); ++i) {
    const Executable::OutputSpec& o = exe.outputs[i];
    json rec = {{"dtype", dtype_name(o.dtype)}, {"shape", dims_json(o.sizes)},
                {"slot", o.slot}, {"byte_offset", o.byte_offset},
                {"strides", dims_json(o.strides)}, {"view_offset", o.view_offset},
                {"base_shape", dims_json(o.base_sizes)}};
    signature(info.outputs, i, o.name, o.sizes, rec);
    outs.push_back(std::move(rec));
  }
  m["symbols"] = symbols;
  m["guards"] = guards_of(ins);
  // Note [prepacked weights] (kernels/onednn_node.cc): a oneDNN launch's prepacked weights go
  // into the weights section as 1-D uint8 entries "<constant>@onednn<launch index>", after the
  // constants, and its record lists them; a constant that no launch reads otherwise (no slot, no
  // other oneDNN operand) is then held prepacked only: the manifest marks it and the weights
  // section has no plain copy of it.
  NamedTensors packed_entries;
  std::vector<LaunchRecord> records;  // keep the prepacked bytes alive until they are written
  std::map<std::string, int> plain_uses, packed_uses;
  for (size_t i = 0; i < exe.launches.size(); ++i) {
    const Executable::Launch& l = exe.launches[i];
    if (!l.record)
      fail_kind(ErrorKind::NotSupported,
                "package: launch {} ('{}', {} kernel of {}) cannot be written into a package: "
                "it runs an eager kernel bound in this process, which the runtime cannot rebuild. "
                "Compile so that it becomes a generated or library kernel (a supported dtype or "
                "op), or run the model with kiln::compile instead of a package",
                i, l.name, l.kind, l.nodes);
    LaunchRecord r = l.record();
    json params = json::parse(r.params);
    if (r.kind == "onednn") {
      std::set<std::string> packed_here;
      if (info.prepack && !cuda && !r.prepacked.empty()) {
        json list = json::array();
        for (const LaunchRecord::Prepacked& w : r.prepacked) {
          if (!packed_here.insert(w.constant).second) continue;
          std::string entry = fmt::format("{}@onednn{}", w.constant, i);
          packed_entries.emplace_back(
              entry, Tensor::from_blob(const_cast<void*>(w.data), {int64_t(w.bytes)},
                                       DType::UInt8, Device::cpu()));
          list.push_back({{"constant", w.constant}, {"entry", entry}, {"layout", w.layout}});
        }
        params["prepacked"] = std::move(list);
        version = std::max(version, kPrepackedFormatVersion);
      }
      for (const json& in : params.at("desc").at("inputs"))
        if (in.contains("constant"))
          ++(packed_here.count(in.at("constant").get<std::string>()) ? packed_uses : plain_uses)
              [in.at("constant").get<std::string>()];
    }
    if (r.kind == "onednn" && params.at("desc").at("op") == "concat")
      version = std::max(version, kOnednnConcatFormatVersion);
    if (r.kind == "onednn" && onednn_channels_last(params.at("desc")))
      version = std::max(version, kChannelsLastFormatVersion);
    if (r.kind == "upsample") version = std::max(version, kUpsampleFormatVersion);
    if (r.kind == "onednn" && onednn_kiln_conv(params.at("desc")))
      version = std::max(version, kKilnGroupedConvFormatVersion);
    if (r.kind == "onednn" && onednn_kiln_conv_silu(params.at("desc")))
      version = std::max(version, kKilnConvSiluFormatVersion);
    if (r.kind == "cudnn_sdpa" && params.at("desc").contains("o_stride"))
      version = std::max(version, kAttentionOutputFormatVersion);
    if (r.kind == "cudnn_sdpa" && params.at("desc").contains("mask"))
      version = std::max(version, kAttentionMaskFormatVersion);
    launches.push_back({{"name", l.name}, {"kind", r.kind}, {"nodes", l.nodes},
                        {"params", std::move(params)}});
    records.push_back(std::move(r));
  }
  NamedTensors weights;
  std::set<std::string> names;
  for (const Executable::ConstantSpec& c : exe.constants) {
    if (!names.insert(c.name).second)
      fail_kind(ErrorKind::NotSupported, "package: two constants are named '{}'; a package names "
                "its weights uniquely", c.name);
    json rec = {{"name", c.name}, {"slot", c.slot}, {"dtype", dtype_name(c.data.dtype())},
                {"shape", dims_json(c.data.sizes())}};
    if (c.slot == -1 && packed_uses.count(c.name) && !plain_uses.count(c.name)) {
      rec["prepacked"] = true;  // its data: the launches' entries only
    } else {
      Tensor host = c.data.device().is_cpu() ? c.data : c.data.to(Device::cpu());
      if (!c.layout.empty()) host = weight_as_the_model_has_it(c, std::move(host));
      weights.emplace_back(c.name, std::move(host));
    }
    consts.push_back(std::move(rec));
  }
  for (auto& [entry, t] : packed_entries) {
    if (!names.insert(entry).second)
      fail_kind(ErrorKind::Internal, "package: the prepacked weights' entry '{}' is also a "
                "constant's name", entry);
    weights.emplace_back(entry, t);
  }
  m["format_version"] = version;
  m["inputs"] = ins;
  m["outputs"] = outs;
  m["constants"] = consts;
  m["launches"] = launches;
  std::string kernels;
  if (!exe.kernel_library_path.empty()) {
    if (!read_whole_file(exe.kernel_library_path, &kernels))
      fail_kind(ErrorKind::Runtime, "package: cannot read the kernels' shared object '{}'",
                exe.kernel_library_path);
  }
  m["kernels"] = kernels.empty() ? json(nullptr) : json("kernels.cpu");
  if (cuda) m["kernels"] = cuda_kernels.empty() ? json(nullptr) : json("kernels.cuda");
  std::vector<uint8_t> w = safetensors_bytes(weights);
  std::vector<PackageSection> sections = {
      {"manifest", m.dump(1)}, {"weights", std::string(w.begin(), w.end())}};
  if (!kernels.empty()) sections.push_back({"kernels.cpu", std::move(kernels)});
  if (!cuda_kernels.empty()) sections.push_back({"kernels.cuda", std::move(cuda_kernels)});
  if (!info.source.empty()) sections.push_back({"source", info.source});
  return package_container(sections, version);
}

NamedTensors package_weights(std::string_view manifest,
                             const std::function<Tensor(const std::string&)>& constant,
                             const std::string& package) {
  json m = kernels::parse_untrusted_json(manifest);
  NamedTensors out;
  for (const json& c : m.at("constants"))
    if (!c.value("prepacked", false)) {
      std::string name = c.at("name").get<std::string>();
      out.emplace_back(name, constant(name));
    }
  bool any = false;
  for (const json& l : m.at("launches")) any = any || l.at("params").contains("prepacked");
  if (!any) return out;
  // Built as the loader builds them (load_sections): every oneDNN launch in order (their
  // layouts flow to their consumers), for the thread count the package was written with.
  kernels::ScopedCpuThreads threads(m.at("target").at("threads").get<int>());
  kernels::OnednnLayouts layouts;
  const json& launches = m.at("launches");
  for (size_t i = 0; i < launches.size(); ++i) {
    const json& l = launches[i];
    if (l.at("kind") != "onednn") continue;
    const json& p = l.at("params");
    std::string where = fmt::format("package '{}': launch {} ('{}')", package, i,
                                    l.at("name").get<std::string>());
    kernels::OnednnNodeDesc desc = kernels::OnednnNodeDesc::from_json(p.at("desc").dump(), where);
    auto node = kernels::OnednnNode::build(desc, layouts, constant);
    if (!p.contains("prepacked")) continue;
    std::vector<kernels::PrepackedWeights> made = node->prepacked();
    for (const json& e : p.at("prepacked")) {
      std::string name = e.at("constant").get<std::string>();
      std::string layout = e.at("layout").get<std::string>();
      auto it = std::find_if(made.begin(), made.end(),
                             [&](const kernels::PrepackedWeights& w) { return w.constant == name; });
      if (it == made.end())
        fail_kind(ErrorKind::InvalidArgument, "{}: node '{}' here does not prepack '{}', which "
                  "the package holds prepacked", where, desc.node, name);
      if (it->layout != layout)
        fail_kind(ErrorKind::InvalidArgument,
                  "{}: node '{}' here prepacks '{}' as [{}], the package holds it as [{}]: replace "
                  "the weights on a machine like the one the package was built on, or compile the "
                  "package again with these weights", where, desc.node, name, it->layout, layout);
      Tensor t = Tensor::empty({int64_t(it->bytes)}, DType::UInt8);
      std::memcpy(t.raw_data(), it->data, it->bytes);
      out.emplace_back(e.at("entry").get<std::string>(), std::move(t));
    }
  }
  return out;
}

void write_package(const Executable& exe, const PackageInfo& info, const std::string& path) {
  std::string bytes = package_bytes(exe, info);
  AtomicFile f(path, "write_package");
  f.write(bytes);
  f.commit();
}

// ---- loading ----------------------------------------------------------------------------------
namespace {

// Handles held by live KernelLibrary objects (Note [One name per loaded kernel library]).
std::mutex g_kernel_libraries_mu;
std::set<void*> g_kernel_libraries;

// The kernels' shared object, loaded from memory; dlclose when the last launch is gone.
struct KernelLibrary {
  void* handle = nullptr;
  int fd = -1;       // the memfd it was loaded from, open while it is loaded
  std::string path;  // /proc/self/fd/N
  ~KernelLibrary() {
    if (!handle) return;
    {
      std::lock_guard<std::mutex> lock(g_kernel_libraries_mu);
      g_kernel_libraries.erase(handle);
    }
    dlclose(handle);
    if (fd < 0) return;
    if (void* still = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      dlclose(still);  // not unloaded: its name stays taken, so its fd stays open
      return;
    }
    ::close(fd);
  }
};

std::shared_ptr<KernelLibrary> load_kernels(std::string_view bytes, const std::string& source) {
  auto write_all = [&](int fd, const std::string& tmp) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int err = errno;
        ::close(fd);
        if (!tmp.empty()) ::unlink(tmp.c_str());
        fail_kind(ErrorKind::Runtime, "package '{}': writing the kernels failed: {}", source,
                  errno_text(err));
      }
      done += size_t(w);
    }
  };
  auto lib = std::make_shared<KernelLibrary>();
  for (int attempt = 0; attempt < 4; ++attempt) {
    int fd = attempt == 0 ? memfd_create("kiln-kernels", MFD_CLOEXEC) : -1;
    std::string path, tmp;
    if (fd >= 0) {
      path = fmt::format("/proc/self/fd/{}", fd);
    } else {
      const char* dir = std::getenv("TMPDIR");
      tmp = fmt::format("{}/kiln-kernels-XXXXXX", dir && *dir ? dir : "/tmp");
      fd = mkostemp(tmp.data(), O_CLOEXEC);
      if (fd < 0)
        fail_kind(ErrorKind::Runtime, "package '{}': cannot create a memfd or a temporary file "
                  "for the kernels: {}", source, errno_text(errno));
      path = tmp;
    }
    write_all(fd, tmp);
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* err = handle ? nullptr : dlerror();
    if (!tmp.empty()) {
      ::close(fd);
      ::unlink(tmp.c_str());
      fd = -1;
    }
    if (!handle) {
      if (fd >= 0) ::close(fd);
      fail_kind(ErrorKind::Runtime, "package '{}': section 'kernels.cpu': the shared object does "
                "not load: {}", source, err ? err : "dlopen failed");
    }
    std::lock_guard<std::mutex> lock(g_kernel_libraries_mu);
    if (g_kernel_libraries.insert(handle).second) {
      lib->handle = handle;
      lib->fd = fd;
      lib->path = path;
      return lib;
    }
    // Another live package's library came back by this name: drop the extra reference, never
    // run its code; try a fresh temporary file's name.
    dlclose(handle);
    if (fd >= 0) ::close(fd);
  }
  fail_kind(ErrorKind::Runtime, "package '{}': section 'kernels.cpu': dlopen returned another "
            "loaded package's kernels for every name tried (Note [One name per loaded kernel "
            "library])", source);
}

Dims dims_of(const json& j) {
  Dims d;
  auto v = j.get<std::vector<int64_t>>();
  if (v.size() > 8) throw std::out_of_range("rank above 8");
  for (int64_t x : v) {
    if (x < 0 || x > (int64_t(1) << 40)) throw std::out_of_range("dimension out of range");
    d.push_back(x);
  }
  return d;
}

// The optional `dim_names` of an input or output record: one per dim, null or a symbol of
// `symbols` whose value is that dim's size (Note [Package signature]).
std::vector<std::string> dim_names_of(const json& j, const Dims& sizes,
                                      const std::map<std::string, int64_t>& symbols) {
  if (!j.contains("dim_names")) return {};
  const json& names = j.at("dim_names");
  if (!names.is_array() || names.size() != sizes.size())
    throw std::out_of_range("dim_names must name each dim of the shape (null: fixed)");
  std::vector<std::string> out;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (names[d].is_null()) {
      out.emplace_back();
      continue;
    }
    std::string n = names[d].get<std::string>();
    auto it = symbols.find(n);
    if (it == symbols.end()) throw std::out_of_range(fmt::format("dim {} names '{}', which symbols lacks", d, n));
    if (it->second != sizes[d])
      throw std::out_of_range(fmt::format("dim {} is {}, its symbol '{}' is {}", d, sizes[d], n, it->second));
    out.push_back(std::move(n));
  }
  return out;
}

int64_t nbytes_of(const Dims& d, DType t) {
  int64_t n = dtype_size(t);
  for (int64_t x : d) {
    if (x != 0 && n > (int64_t(1) << 50) / x) throw std::out_of_range("size overflows");
    n *= x;
  }
  return n;
}

}  // namespace

namespace {
// Note [CUDA packages]: a cubin built for sm_XY runs on a GPU of the same major version and a
// minor version >= Y (CUDA's binary compatibility); anything else is refused here, with how to
// rebuild, rather than by the driver's "no kernel image" at the first launch.
//
// Note [PTX in CUDA packages]: each module's PTX (NVRTC's, from the same compile) follows its
// cubin in kernels.cuda (manifest `ptx_offset`, `ptx_size`). On a GPU of a newer architecture
// than the cubins' (a higher compute capability that the cubins cannot run on: sm_90 cubins on
// sm_100 or sm_120), the loader hands the driver the PTX, which it compiles for that GPU (JIT,
// at load; the driver caches the result). The package's library choices (cuBLASLt algorithms,
// cuDNN engines) were made for the build's GPU: on another architecture they are made at load,
// as for a cross-build, so the results are the same computation within the library kernels'
// rounding, not bitwise those of the build's GPU. An older GPU than the package's is refused
// (PTX compiles forward only). KILN_PACKAGE_CUDA_CODE=ptx takes the PTX path on any GPU the
// PTX can run on (to test it on the build's own GPU); unset or `auto`: cubins where they run.
enum class CudaCode { Cubin, Ptx };

CudaCode choose_cuda_code(const std::string& arch, const std::string& model,
                          const std::string& source) {
  require_cuda_device(0, "loading a CUDA package");
  CudaDeviceInfo dev = cuda_device_info(0);
  std::string digits = arch.substr(3);
  const int major = std::stoi(digits.substr(0, digits.size() - 1));
  const int minor = digits.back() - '0';
  bool force_ptx = false;
  if (const char* v = std::getenv("KILN_PACKAGE_CUDA_CODE"); v && *v) {
    std::string_view code(v);
    if (code == "ptx") force_ptx = true;
    else if (code != "auto")
      fail_kind(ErrorKind::InvalidArgument, "KILN_PACKAGE_CUDA_CODE='{}': expected 'auto' (cubins "
                "where they run, else PTX) or 'ptx'", code);
  }
  const bool cubin_runs = dev.sm_major == major && dev.sm_minor >= minor;
  const bool newer = dev.sm_major > major || (dev.sm_major == major && dev.sm_minor >= minor);
  if (cubin_runs && !force_ptx) return CudaCode::Cubin;
  if (newer) return CudaCode::Ptx;
  fail_kind(ErrorKind::NotSupported,
            "package '{}': its CUDA kernels are built for {} and this GPU ({}) is sm_{}{}, an "
            "older architecture: neither its cubins nor its PTX run there. Rebuild the package "
            "for this GPU with `kiln compile {} -o {} --device cuda` (on this machine) or "
            "`--arch sm_{}{}` (anywhere)",
            source, arch, dev.name, dev.sm_major, dev.sm_minor,
            model.empty() ? "MODEL" : model, source, dev.sm_major, dev.sm_minor);
}
}  // namespace

namespace {
// The weights section's verification, with the prepacked weights' copies out of it, on several
// threads beside the load (Note [chunked weights hash], Note [weights verified beside the
// load]). A section hashed whole is one piece of work; a chunked one, one per 4 MiB chunk.
class WeightsPass {
 public:
  WeightsPass(std::string_view data, std::string_view expected, bool chunked)
      : data_(data), expected_(expected), chunked_(chunked) {
    pieces_ = chunked_ ? (data_.size() + kWeightsHashChunk - 1) / kWeightsHashChunk : 1;
    digests_.resize(pieces_);
    setup_groups();
  }
  ~WeightsPass() { join(); }
  WeightsPass(const WeightsPass&) = delete;
  WeightsPass& operator=(const WeightsPass&) = delete;

  // A block of `n` bytes that the pass may copy into; the caller keeps `owner` as long as it
  // reads the block. Before start(). The pass provides the block's pages a chunk at a time
  // (MADV_POPULATE_WRITE: the kernel maps a range in one call) rather than a page fault at a
  // time: resnet50's 128 MB took ~33,000 faults, most of the copy's time; populated on the
  // loading thread up front (MAP_POPULATE), they took 30 ms of it. (Transparent huge pages
  // were tried: a load could stall 0.2-1.2 s while the kernel compacted memory.)
  char* block(size_t n, std::shared_ptr<void>* owner) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      fail_kind(ErrorKind::Runtime, "cannot map {} bytes for the prepacked weights: {}", n,
                errno_text(errno));
    block_ = std::shared_ptr<void>(p, [n](void* b) { ::munmap(b, n); });
    *owner = block_;
    return static_cast<char*>(p);
  }
  // Bytes [offset, offset + n) of the section go to `dst` as the pass reaches them. Before
  // start(); copies do not overlap.
  void copy(size_t offset, char* dst, size_t n) { copies_.push_back({offset, dst, n}); }
  // Starts `threads` threads beside the caller (at most one per piece).
  void start(int threads) {
    if (started_) return;
    started_ = true;
    std::sort(copies_.begin(), copies_.end(),
              [](const Copy& a, const Copy& b) { return a.offset < b.offset; });
    threads = int(std::min<size_t>(size_t(std::max(threads, 0)), pieces_));
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  // Does what is left on the caller's thread too; true when the hash matched.
  bool finish() {
    start(0);
    run();
    join();
    if (!chunked_) return digests_[0] == expected_;
    std::string all;
    for (const std::string& d : digests_) all += d;
    return sha256_raw(all) == expected_;
  }

 private:
  struct Copy {
    size_t offset;
    char* dst;
    size_t n;
  };
  // The copies of section bytes [a, b).
  void copy_range(size_t a, size_t b) {
    auto it = std::partition_point(copies_.begin(), copies_.end(),
                                   [a](const Copy& c) { return c.offset + c.n <= a; });
    for (; it != copies_.end() && it->offset < b; ++it) {
      size_t from = std::max(a, it->offset), to = std::min(b, it->offset + it->n);
      char* dst = it->dst + (from - it->offset);
      // Advice: where the kernel lacks MADV_POPULATE_WRITE (before Linux 5.14), the copy
      // faults the pages in.
      uintptr_t page_lo = reinterpret_cast<uintptr_t>(dst) & ~uintptr_t(4095);
      uintptr_t page_hi = (reinterpret_cast<uintptr_t>(dst) + (to - from) + 4095) & ~uintptr_t(4095);
      ::madvise(reinterpret_cast<void*>(page_lo), page_hi - page_lo, MADV_POPULATE_WRITE);
      std::memcpy(dst, data_.data() + from, to - from);
    }
  }
  // Note [SHA-256 of sixteen messages at once] (support/sha256_x16.cc): where the CPU has
  // AVX-512, the whole chunks go sixteen at a time (a last group of 9-15 chunks too, its spare
  // lanes hashing one of its chunks again: still faster than hashing them one by one), each
  // group a strip of every chunk at a time, the strip's copies made while it is in cache.
  void setup_groups() {
    if (!chunked_ || !Sha256x16::available()) return;
    const size_t whole = data_.size() / kWeightsHashChunk;
    groups_ = whole / 16 + (whole % 16 >= 9 ? 1 : 0);
    next_ = std::min(whole, groups_ * 16);  // the single chunks start after the groups'
  }
  void hash_group(size_t g) {
    constexpr size_t kStrip = size_t(128) << 10;
    static_assert(kWeightsHashChunk % kStrip == 0 && kStrip % 64 == 0);
    const size_t whole = data_.size() / kWeightsHashChunk, first = 16 * g;
    const size_t k = std::min<size_t>(16, whole - first);
    Sha256x16 sha;
    for (size_t at = 0; at < kWeightsHashChunk; at += kStrip) {
      const char* lanes[16];
      for (size_t l = 0; l < 16; ++l)
        lanes[l] = data_.data() + (first + std::min(l, k - 1)) * kWeightsHashChunk + at;
      sha.update(lanes, kStrip / 64);
      for (size_t l = 0; l < k; ++l) {
        const size_t a = (first + l) * kWeightsHashChunk + at;
        copy_range(a, a + kStrip);
      }
    }
    unsigned char d[16][32];
    sha.finish(kWeightsHashChunk, d);
    for (size_t l = 0; l < k; ++l) digests_[first + l].assign(reinterpret_cast<const char*>(d[l]), 32);
  }
  void run() {
    for (size_t g = next_group_.fetch_add(1); g < groups_; g = next_group_.fetch_add(1)) hash_group(g);
    for (size_t i = next_.fetch_add(1); i < pieces_; i = next_.fetch_add(1)) {
      size_t a = chunked_ ? i * kWeightsHashChunk : 0;
      size_t b = chunked_ ? std::min(data_.size(), a + kWeightsHashChunk) : data_.size();
      copy_range(a, b);
      digests_[i] = sha256_raw(data_.substr(a, b - a));
    }
  }
  void join() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  std::string_view data_;
  std::string expected_;
  bool chunked_;
  size_t pieces_ = 1;
  std::vector<std::string> digests_;
  std::vector<Copy> copies_;
  std::shared_ptr<void> block_;
  std::atomic<size_t> next_{0};
  size_t groups_ = 0;  // groups of sixteen chunks (setup_groups)
  std::atomic<size_t> next_group_{0};
  std::vector<std::thread> threads_;
  bool started_ = false;
};

// Threads a load verifies the weights on beside its own (it joins them when it is done).
int weights_pass_threads() {
  return int(std::clamp(std::thread::hardware_concurrency(), 2u, 8u)) - 1;
}

// load_package_bytes once the container is checked: `sections` as parse_sections returned them.
LoadedPackage load_sections(std::string_view bytes, const std::string& source,
                            const std::vector<SectionView>& sections, uint32_t out_version,
                            WeightsPass& pass) {
  LoadedPackage out;
  auto lap = std::chrono::steady_clock::now();
  auto phase = [&](const std::string& name) {  // adds the time since the last phase to `name`
    auto now = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(now - lap).count();
    lap = now;
    for (auto& [n, t] : out.load_phases)
      if (n == name) {
        t += s;
        return;
      }
    out.load_phases.emplace_back(name, s);
  };
  out.format_version = out_version;
  out.file_bytes = int64_t(bytes.size());
  out.manifest = std::string(sections[0].bytes);
  std::string_view weights_bytes = sections[1].bytes;
  out.weights_bytes = int64_t(weights_bytes.size());
  const std::string_view* kernels = find_section(sections, "kernels.cpu");
  const std::string_view* cuda_kernels = find_section(sections, "kernels.cuda");
  out.kernels_bytes = kernels ? int64_t(kernels->size()) : cuda_kernels ? int64_t(cuda_kernels->size()) : 0;
  const std::string_view* source_section = find_section(sections, "source");
  out.source_bytes = source_section ? int64_t(source_section->size()) : 0;

  json m;
  std::string where = "manifest";
  try {
    m = kernels::parse_untrusted_json(out.manifest);
    if (m.at("format_version").get<uint32_t>() != out.format_version)
      throw std::out_of_range("format_version differs from the header's");
    out.kiln_version = m.at("kiln_version").get<std::string>();
    out.model = m.at("model").get<std::string>();
    out.mode = m.at("mode").get<std::string>();
    const json& t = m.at("target");
    out.device = t.at("device").get<std::string>();
    if (out.device == "cpu") {
      out.isa = t.at("isa").get<std::string>();
      out.threads = t.at("threads").get<int>();
      if (out.threads < 1 || out.threads > 65536)
        throw std::out_of_range(fmt::format("target.threads: {} is not a thread count", out.threads));
      if (cuda_kernels) throw std::out_of_range("a cpu package with a kernels.cuda section");
      if (kernels && m.at("kernels") != "kernels.cpu")
        throw std::out_of_range("kernels: a kernels.cpu section is present but not named");
      if (!kernels && !m.at("kernels").is_null())
        throw std::out_of_range("kernels: names a kernels.cpu section the package lacks");
    } else if (out.device == "cuda") {
      out.arch = t.at("arch").get<std::string>();
      if (out.arch.size() < 5 || out.arch.size() > 8 || out.arch.compare(0, 3, "sm_") != 0 ||
          out.arch.find_first_not_of("0123456789", 3) != std::string::npos)
        throw std::out_of_range(fmt::format("target.arch: '{}' is not an architecture (sm_90)", out.arch));
      if (kernels) throw std::out_of_range("a cuda package with a kernels.cpu section");
      if (cuda_kernels && m.at("kernels") != "kernels.cuda")
        throw std::out_of_range("kernels: a kernels.cuda section is present but not named");
      if (!cuda_kernels && !m.at("kernels").is_null())
        throw std::out_of_range("kernels: names a kernels.cuda section the package lacks");
    } else {
      throw std::out_of_range("target.device: this runtime loads cpu and cuda packages");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad(source, fmt::format("section 'manifest': {}", e.what()));
  }

  const bool cuda = out.device == "cuda";
  CudaCode cuda_code = CudaCode::Cubin;
  phase("manifest");
  if (cuda) {
    cuda_code = choose_cuda_code(out.arch, out.model, source);
    out.cuda_code = cuda_code == CudaCode::Ptx ? "ptx" : "cubin";
    phase("device");
  }
  cuda::LibraryWarmUp libraries;  // joined before the launches are built, or when the load fails
  if (cuda) start_library_warm_up(libraries, m);
  // The CPU check: the kernels were compiled with -march=native on a machine with these features.
  std::vector<std::string> missing = cuda ? std::vector<std::string>{}
                                          : missing_isa_features(out.isa, host_isa());
  if (!missing.empty()) {
    std::string list;
    for (const std::string& f : missing) list += (list.empty() ? "" : ", ") + f;
    fail_kind(ErrorKind::NotSupported,
              "package '{}': built for a CPU with features this CPU lacks ({}); its kernels would "
              "fault here. Rebuild the package on this machine (or one like it) with `kiln "
              "compile {} -o {}`. Required: {}; this CPU: {}",
              source, list, out.model.empty() ? "MODEL" : out.model, source, out.isa, host_isa());
  }

  auto exe = std::make_shared<Executable>();
  std::map<std::string, Tensor> weights;
  std::map<int32_t, KrscFilter> krsc_slots;  // CUDA: Note [Filters stored KRSC at load]
  try {
    const std::span<const uint8_t> wbytes(reinterpret_cast<const uint8_t*>(weights_bytes.data()),
                                          weights_bytes.size());
    if (!cuda) {
      // Note [CPU package weights]: the weights are views of the bytes being loaded (the mapped
      // file), not copies. oneDNN's nodes reorder most of them into prepacked copies of their
      // own at build time and never read them again; what the kernels read at run time (a
      // constant with a slot, a oneDNN node's constant operand) is copied below and in the
      // node, so nothing refers to the file once the load returns: a package overwritten in
      // place after its load cannot change what a loaded model computes. resnet50: 100 MB less
      // resident memory (peak RSS of `kiln bench` 327 -> 229 MiB); the load takes about as
      // long as before (0.17-0.25 s on the 2-core dev machine), as the reorders now read the
      // file pages while the weights' hash (~55 ms of one core, OpenSSL's SHA-256) reads them.
      // Note [prepacked weights] (kernels/onednn_node.cc): the entries the launches list as
      // prepacked weights are copied into one block that their nodes then read in place (a
      // copy, so that nothing refers to the file once the load returns), by the weights pass,
      // chunk by chunk as it verifies them, beside the launches' build (WeightsPass::block).
      std::set<std::string> packed_names;
      for (const json& l : m.at("launches"))
        if (l.contains("params") && l.at("params").is_object() && l.at("params").contains("prepacked"))
          for (const json& e : l.at("params").at("prepacked"))
            if (e.is_object() && e.contains("entry") && e.at("entry").is_string())
              packed_names.insert(e.at("entry").get<std::string>());
      std::vector<SafetensorsEntry> entries =
          parse_safetensors_entries(wbytes, source + ": section 'weights'");
      constexpr size_t kPage = 4096;
      size_t block_bytes = 0;
      for (const SafetensorsEntry& e : entries)
        if (packed_names.count(e.name) && e.dtype == DType::UInt8 && e.nbytes > 0)
          block_bytes += (size_t(e.nbytes) + kPage - 1) / kPage * kPage;
      char* block = nullptr;
      if (block_bytes > 0) {
        std::shared_ptr<void> owner;
        block = pass.block(block_bytes, &owner);
        exe->keep_alive.push_back(std::move(owner));
      }
      size_t block_used = 0;
      for (const SafetensorsEntry& e : entries) {
        const uint8_t* at = wbytes.data() + e.offset;
        if (block && packed_names.count(e.name) && e.dtype == DType::UInt8 && e.nbytes > 0) {
          char* dst = block + block_used;
          block_used += (size_t(e.nbytes) + kPage - 1) / kPage * kPage;
          pass.copy(size_t(e.offset), dst, size_t(e.nbytes));
          weights.emplace(e.name, Tensor::from_blob(dst, e.sizes, e.dtype, Device::cpu()));
          continue;
        }
        bool in_place = e.dtype != DType::Bool && e.nbytes > 0 &&
                        reinterpret_cast<uintptr_t>(at) % size_t(dtype_size(e.dtype)) == 0;
        weights.emplace(e.name, in_place ? Tensor::from_blob(const_cast<uint8_t*>(at), e.sizes,
                                                             e.dtype, Device::cpu())
                                         : safetensors_entry_tensor(wbytes, e));
      }
      pass.start(weights_pass_threads());
    } else {
      pass.start(weights_pass_threads());
      // Note [CUDA package weights]: one device block holds every weight, each at a 256-byte
      // aligned offset (the alignment a tensor of its own has, which the library plans were
      // made for), filled by one host-to-device copy per tensor straight from the mapped file:
      // no host copy, one allocation (through the caching allocator, so the bench's peak counts
      // it). The tensors view the block; the Executable keeps it alive.
      std::vector<SafetensorsEntry> entries =
          parse_safetensors_entries(wbytes, source + ": section 'weights'");
      std::vector<int64_t> at(entries.size());
      int64_t total = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        at[i] = total;
        total += (int64_t(entries[i].nbytes) + 255) / 256 * 256;
      }
      Tensor block = Tensor::empty({std::max<int64_t>(total, 1)}, DType::UInt8, Device::cuda(0));
      char* base = static_cast<char*>(block.raw_data());
      // Note [Filters stored KRSC at load] (launch_cuda.cc): filters that only channels-last
      // convolutions read go to the device permuted to KRSC.
      std::map<std::string, std::pair<int32_t, KrscFilter>> krsc_by_name = krsc_constants(m);
      std::vector<char> staging;
      for (size_t i = 0; i < entries.size(); ++i) {
        const SafetensorsEntry& e = entries[i];
        char* dst = base + at[i];
        auto krsc = krsc_by_name.find(e.name);
        if (krsc != krsc_by_name.end() && e.nbytes > 0 && e.dtype != DType::Bool &&
            dtype_size(e.dtype) == krsc->second.second.elem_bytes &&
            int64_t(e.nbytes) == krsc->second.second.bytes()) {
          const KrscFilter& f = krsc->second.second;
          staging.resize(size_t(e.nbytes));
          f.permute(wbytes.data() + e.offset, staging.data());
          cuda_memcpy(dst, staging.data(), size_t(e.nbytes), CopyKind::HostToDevice);
          krsc_slots[krsc->second.first] = f;
        } else if (e.dtype == DType::Bool && e.nbytes > 0) {  // normalized to 0 and 1 on the host
          Tensor t = safetensors_entry_tensor(wbytes, e);
          cuda_memcpy(dst, t.raw_data(), size_t(e.nbytes), CopyKind::HostToDevice);
        } else if (e.nbytes > 0) {
          cuda_memcpy(dst, wbytes.data() + e.offset, size_t(e.nbytes), CopyKind::HostToDevice);
        }
        weights.emplace(e.name, Tensor::from_blob(dst, e.sizes, e.dtype, Device::cuda(0)));
      }
      exe->keep_alive.push_back(std::make_shared<Tensor>(std::move(block)));
    }
  } catch (const Error& e) {
    bad(source, fmt::format("section 'weights': {}", e.what()));
  }
  pass.start(weights_pass_threads());
  phase("weights");
  std::shared_ptr<KernelLibrary> lib;
  try {
    int64_t arena = m.at("arena_bytes").get<int64_t>();
    int num_slots = m.at("num_slots").get<int>();
    if (arena < 0 || arena > (int64_t(1) << 44) || num_slots < 1 || num_slots > (1 << 20))
      throw std::out_of_range("arena_bytes or num_slots out of range");
    exe->init(arena, num_slots, cuda ? Device::cuda(0) : Device::cpu());
    std::vector<bool> slot_used(size_t(num_slots), false);
    auto check_slot = [&](int64_t slot, const std::string& what) {
      if (slot < 0 || slot >= num_slots) throw std::out_of_range(what + ": slot out of range");
    };
    std::set<std::string> held_prepacked;  // the constants launches hold prepacked
    for (const json& c : m.at("constants")) {
      where = "manifest: constant";
      std::string name = c.at("name").get<std::string>();
      where = "manifest: constant '" + name + "'";
      if (c.contains("prepacked")) {  // held by the launches' prepacked entries only
        if (out.format_version < kPrepackedFormatVersion)
          throw std::out_of_range(fmt::format("a prepacked constant is unknown to format version {}",
                                              out.format_version));
        if (cuda || !c.at("prepacked").get<bool>() || c.at("slot").get<int>() != -1)
          throw std::out_of_range("'prepacked' is only for a CPU constant without a slot");
        if (held_prepacked.empty())
          for (const json& l : m.at("launches"))
            if (l.at("params").contains("prepacked"))
              for (const json& e : l.at("params").at("prepacked"))
                held_prepacked.insert(e.at("constant").get<std::string>());
        if (!held_prepacked.count(name))
          throw std::out_of_range("marked prepacked, but no launch holds it prepacked");
        (void)records::dtype_from(c.at("dtype"), where);
        (void)dims_of(c.at("shape"));
        continue;
      }
      auto it = weights.find(name);
      if (it == weights.end()) throw std::out_of_range("absent from the weights section");
      DType dt = records::dtype_from(c.at("dtype"), where);
      Dims shape = dims_of(c.at("shape"));
      if (it->second.dtype() != dt || it->second.sizes() != shape)
        throw std::out_of_range("the weights section holds a tensor of another dtype or shape");
      int slot = c.at("slot").get<int>();
      if (slot != -1) {
        check_slot(slot, where);
        if (slot == 0 || slot_used[size_t(slot)]) throw std::out_of_range("slot taken");
        slot_used[size_t(slot)] = true;
        // Read at run time: a copy of its own (Note [CPU package weights]).
        if (!cuda) it->second = it->second.clone();
        exe->set_slot(slot, static_cast<char*>(it->second.raw_data()));
        exe->keep_alive.push_back(std::make_shared<Tensor>(it->second));
      } else if (cuda) {
        exe->keep_alive.push_back(std::make_shared<Tensor>(it->second));
      }
      // A CPU constant without a slot is read only while its library node is built: the view
      // is dropped once the launches are (Note [CPU package weights]).
      // Note [Filters stored KRSC at load]: those filters' data is KRSC.
      exe->constants.push_back({name, slot, it->second, krsc_slots.count(slot) ? "krsc" : ""});
    }
    phase("constants");  // (CPU: the copies of those with a slot)
    // Note [Package signature]: `symbols` (absent in packages before it: none) gives each named
    // dim's value; every named dim must be its symbol's value.
    std::map<std::string, int64_t> symbols;
    if (m.contains("symbols")) {
      where = "manifest: symbols";
      for (const auto& [name, v] : m.at("symbols").items()) {
        if (name.empty() || name.size() > 256) throw std::out_of_range("a symbol's name is empty or too long");
        int64_t x = v.get<int64_t>();
        if (x < 0 || x > (int64_t(1) << 40)) throw std::out_of_range("a symbol's value is out of range");
        symbols[name] = x;
      }
    }
    for (const json& j : m.at("inputs")) {
      Executable::InputSpec in;
      in.name = j.at("name").get<std::string>();
      where = "manifest: input '" + in.name + "'";
      in.dtype = records::dtype_from(j.at("dtype"), where);
      in.sizes = dims_of(j.at("shape"));
      in.dim_names = dim_names_of(j, in.sizes, symbols);
      in.slot = j.at("slot").get<int32_t>();
      check_slot(in.slot, where);
      if (j.contains("staging_offset")) {
        // Note [Input staging in the arena]: inside the arena, 256-byte aligned, CUDA only.
        in.staging_offset = j.at("staging_offset").get<int64_t>();
        const int64_t bytes = nbytes_of(in.sizes, in.dtype);
        if (!cuda)
          throw std::out_of_range("staging_offset in a CPU package (a CPU package stages no input)");
        if (in.staging_offset < 0 || in.staging_offset % 256 != 0 || in.staging_offset > arena - bytes)
          throw std::out_of_range(fmt::format(
              "staging_offset {} for {} bytes is outside the {}-byte arena or not 256-byte aligned",
              in.staging_offset, bytes, arena));
      }
      if (in.slot == 0 || slot_used[size_t(in.slot)]) throw std::out_of_range("slot taken");
      slot_used[size_t(in.slot)] = true;
      exe->inputs.push_back(std::move(in));
    }
    if (m.contains("guards") && m.at("guards") != guards_of(m.at("inputs"))) {
      where = "manifest: guards";
      throw std::out_of_range("they differ from the checks of the inputs' dtypes and shapes");
    }
    for (const json& j : m.at("outputs")) {
      Executable::OutputSpec o;
      o.name = j.at("name").get<std::string>();
      where = "manifest: output '" + o.name + "'";
      o.dtype = records::dtype_from(j.at("dtype"), where);
      o.sizes = dims_of(j.at("shape"));
      o.dim_names = dim_names_of(j, o.sizes, symbols);
      o.slot = j.at("slot").get<int32_t>();
      check_slot(o.slot, where);
      o.byte_offset = j.at("byte_offset").get<int64_t>();
      o.strides = dims_of(j.at("strides"));
      o.view_offset = j.at("view_offset").get<int64_t>();
      o.base_sizes = dims_of(j.at("base_shape"));
      if (!o.strides.empty() && o.strides.size() != o.sizes.size())
        throw std::out_of_range("strides and shape differ in rank");
      // The bytes it reads must lie inside the arena (other slots are checked by their owners).
      int64_t span = nbytes_of(o.strides.empty() ? o.sizes : o.base_sizes, o.dtype);
      if (o.slot == 0 && (o.byte_offset < 0 || o.byte_offset > arena - span))
        throw std::out_of_range("reads past the arena");
      if (!o.strides.empty()) {
        int64_t last = o.view_offset, base = nbytes_of(o.base_sizes, o.dtype) / dtype_size(o.dtype);
        for (size_t d = 0; d < o.sizes.size(); ++d)
          if (o.sizes[d] > 0) last += (o.sizes[d] - 1) * o.strides[d];
        if (o.view_offset < 0 || last >= std::max<int64_t>(base, 1))
          throw std::out_of_range("the view reads past its base");
      }
      exe->outputs.push_back(std::move(o));
    }
    // Note [Device status]: the record's slot and what its codes mean (CUDA packages).
    int status_slot = -1;
    if (cuda && !m.at("status").is_null()) {
      where = "manifest: status";
      const json& st = m.at("status");
      status_slot = st.at("slot").get<int>();
      check_slot(status_slot, where);
      if (status_slot == 0 || slot_used[size_t(status_slot)]) throw std::out_of_range("slot taken");
      slot_used[size_t(status_slot)] = true;
      std::vector<Executable::DeviceCheck> checks;
      for (const json& c : st.at("checks")) {
        Executable::DeviceCheck dc{c.at("code").get<int64_t>(), c.at("prefix").get<std::string>(),
                                   c.at("suffix").get<std::string>()};
        if (dc.code <= 0) throw std::out_of_range("status codes are positive");
        checks.push_back(std::move(dc));
      }
      if (checks.empty()) throw std::out_of_range("a status record without checks");
      exe->set_device_status(status_slot, std::move(checks));
    }
    // The CUDA modules, loaded on the device (the driver checks each cubin).
    std::map<std::string, std::shared_ptr<const cuda::CudaModule>> modules;
    if (cuda && cuda_kernels) {
      where = "manifest: cuda_modules";
      size_t prev_end = 0;
      for (const json& d : m.at("cuda_modules")) {
        std::string name = d.at("name").get<std::string>();
        where = "manifest: cuda module '" + name + "'";
        if (d.at("arch").get<std::string>() != out.arch)
          throw std::out_of_range("its architecture differs from target.arch");
        uint64_t off = d.at("offset").get<uint64_t>(), size = d.at("size").get<uint64_t>();
        if (off < prev_end || off % kAlign != 0 || off > cuda_kernels->size() ||
            size > cuda_kernels->size() - off || size == 0)
          throw std::out_of_range("offset and size lie outside section 'kernels.cuda' or overlap");
        prev_end = off + size;
        if (modules.count(name)) throw std::out_of_range("two modules have this name");
        std::string_view image = cuda_kernels->substr(off, size);
        if (d.contains("ptx_offset") || d.contains("ptx_size")) {  // Note [PTX in CUDA packages]
          uint64_t poff = d.at("ptx_offset").get<uint64_t>(), psize = d.at("ptx_size").get<uint64_t>();
          if (poff < prev_end || poff % kAlign != 0 || poff > cuda_kernels->size() ||
              psize > cuda_kernels->size() - poff || psize < 2)
            throw std::out_of_range("ptx_offset and ptx_size lie outside section 'kernels.cuda' "
                                    "or overlap");
          prev_end = poff + psize;
          std::string_view ptx = cuda_kernels->substr(poff, psize);
          // The driver reads PTX up to its NUL: one at the end and none before it.
          if (ptx.back() != '\0' || ptx.find('\0') != ptx.size() - 1)
            throw std::out_of_range("its PTX is not one NUL-terminated text");
          if (cuda_code == CudaCode::Ptx) image = ptx;
        } else if (cuda_code == CudaCode::Ptx) {
          fail_kind(ErrorKind::NotSupported,
                    "package '{}': its CUDA kernels are built for {}, which this GPU ({}) cannot "
                    "run, and module '{}' carries no PTX for newer GPUs (a package of Kiln before "
                    "PTX). Rebuild the package for this GPU with `kiln compile {} -o {} --device "
                    "cuda` (on this machine) or `--arch {}` (anywhere)",
                    source, out.arch, cuda::device_arch(0), name, out.model.empty() ? "MODEL" : out.model,
                    source, cuda::device_arch(0));
        }
        modules[name] = cuda::CudaModule::load(image, 0, source + ":" + name);
      }
    }
    where = "manifest: launches";
    if (kernels) lib = load_kernels(*kernels, source);
    if (lib) exe->keep_alive.push_back(lib);
    phase("kernels");
    kernels::OnednnLayouts layouts;
    LaunchEnv env;
    if (lib)
      env.symbol = [&lib](const std::string& name) -> void* {
        return dlsym(lib->handle, name.c_str());
      };
    env.constant = [&weights](const std::string& name) -> Tensor {
      auto it = weights.find(name);
      if (it == weights.end())
        fail_kind(ErrorKind::ParseError, "no weight '{}' in section 'weights'", name);
      return it->second;
    };
    env.onednn_layouts = &layouts;
    env.library_choices_at_load = cuda_code == CudaCode::Ptx;
    env.krsc_slots = krsc_slots;
    if (cuda)
      env.cuda_module = [&modules](const std::string& name) -> std::shared_ptr<const cuda::CudaModule> {
        auto it = modules.find(name);
        return it == modules.end() ? nullptr : it->second;
      };
    std::vector<int64_t> slot_bytes(size_t(num_slots), 0);
    slot_bytes[0] = arena;
    for (const Executable::InputSpec& in : exe->inputs)
      slot_bytes[size_t(in.slot)] = nbytes_of(in.sizes, in.dtype);
    for (const Executable::ConstantSpec& c : exe->constants)
      if (c.slot > 0) slot_bytes[size_t(c.slot)] = c.data.nbytes();
    if (status_slot > 0) slot_bytes[size_t(status_slot)] = 16;  // {code, value}
    env.slot_bytes = [&slot_bytes](int32_t slot) -> int64_t {
      return slot >= 0 && size_t(slot) < slot_bytes.size() ? slot_bytes[size_t(slot)] : 0;
    };
    env.num_slots = int32_t(num_slots);
    // oneDNN nodes are rebuilt for the thread count the writer planned their scratch for (Note
    // [oneDNN thread count] in kernels/onednn_node.cc: a call with more threads is capped), or
    // for the loading thread's where that is lower and gives the same node (Note [oneDNN threads
    // at load] in launch_library.cc).
    if (!cuda) env.onednn_load_threads = std::min(out.threads, kernels::cpu_threads());
    kernels::ScopedCpuThreads writer_threads(out.threads);
    std::vector<const json*> launches;
    std::vector<LaunchRecord> records;
    std::vector<std::string> wheres;  // each launch's name in errors
    for (const json& j : m.at("launches")) {
      launches.push_back(&j);
      wheres.push_back(fmt::format("package '{}': section 'manifest': launch {} ('{}')", source,
                                   records.size(), j.at("name").get<std::string>()));
      records.push_back({j.at("kind").get<std::string>(), j.at("params").dump()});
    }
    // Note [cuDNN plans built beside each other] (launch_cuda.cc): the slow, independent part of
    // some launches (cuDNN convolution plans) is built first, on several threads.
    std::vector<std::shared_ptr<void>> prebuilt;
    if (cuda) {
      // More than 8 did not help on the H200's 16 cores (resnet50: 1 thread 1.53-1.58 s, 4 threads
      // 0.82-0.85 s, 8 threads 0.70-0.78 s, 16 threads 0.77-0.84 s).
      const int threads = int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
      libraries.join();
      phase("libraries (waited)");
      prebuilt = prebuild_launches(records, env, wheres, threads);
      phase("launches prebuilt");
    }
    for (size_t i = 0; i < records.size(); ++i) {
      const json& j = *launches[i];
      const LaunchRecord& r = records[i];
      const std::string& lw = wheres[i];
      // A launch runs where its device's memory is: host kernels on a CUDA package's device
      // pointers (or the reverse) would fault.
      // (An unknown kind is left to rebuild_launch, whose error lists the kinds it knows.)
      const std::optional<Device> kind_device = launch_kind_device(r.kind);
      if (kind_device && kind_device->is_cuda() != cuda)
        throw std::out_of_range(fmt::format("{}: a {} launch in a {} package", lw, r.kind, out.device));
      if (r.kind == "upsample" && out.format_version < kUpsampleFormatVersion)
        throw std::out_of_range(fmt::format("{}: an upsample launch is unknown to format version {}",
                                            lw, out.format_version));
      if (r.kind == "cudnn_sdpa" && out.format_version < kAttentionOutputFormatVersion &&
          j.at("params").at("desc").contains("o_stride"))
        throw std::out_of_range(fmt::format("{}: an attention output stride (o_stride) is unknown "
                                            "to format version {}", lw, out.format_version));
      if (r.kind == "cudnn_sdpa" && out.format_version < kAttentionMaskFormatVersion &&
          j.at("params").at("desc").contains("mask"))
        throw std::out_of_range(fmt::format("{}: an attention mask is unknown to format version {}",
                                            lw, out.format_version));
      if (r.kind == "onednn") {  // its buffers must lie in the slot table and the arena
        const json& p = j.at("params");
        if (out.format_version < kOnednnConcatFormatVersion && p.at("desc").at("op") == "concat")
          throw std::out_of_range(fmt::format("{}: a oneDNN concat node is unknown to format "
                                              "version {}", lw, out.format_version));
        if (out.format_version < kChannelsLastFormatVersion && onednn_channels_last(p.at("desc")))
          throw std::out_of_range(fmt::format("{}: a channels-last operand is unknown to format "
                                              "version {}", lw, out.format_version));
        if (out.format_version < kPrepackedFormatVersion && p.contains("prepacked"))
          throw std::out_of_range(fmt::format("{}: prepacked weights are unknown to format "
                                              "version {}", lw, out.format_version));
        if (out.format_version < kKilnGroupedConvFormatVersion && onednn_kiln_conv(p.at("desc")))
          throw std::out_of_range(fmt::format("{}: Kiln's grouped convolution kernel (conv_layout "
                                              "kiln-direct) is unknown to format version {}", lw,
                                              out.format_version));
        if (out.format_version < kKilnConvSiluFormatVersion && onednn_kiln_conv_silu(p.at("desc")))
          throw std::out_of_range(fmt::format("{}: Kiln's grouped convolution kernel with a silu "
                                              "epilogue is unknown to format version {}", lw,
                                              out.format_version));
        // An entry is named after its constant and launch (package_bytes), so that one launch's
        // record cannot point at another's bytes.
        if (p.contains("prepacked"))
          for (const json& e : p.at("prepacked"))
            if (e.at("entry").get<std::string>() !=
                fmt::format("{}@onednn{}", e.at("constant").get<std::string>(), i))
              throw std::out_of_range(fmt::format("{}: prepacked entry '{}' is not this launch's "
                                                  "entry for its constant", lw,
                                                  e.at("entry").get<std::string>()));
        std::vector<json> refs(p.at("inputs").begin(), p.at("inputs").end());
        refs.push_back(p.at("output"));
        refs.push_back(p.at("scratch"));
        for (const json& ref : refs) {
          auto v = ref.get<std::vector<int64_t>>();
          if (v.size() != 2 || v[0] < -1 || v[0] >= num_slots || v[1] < 0 ||
              (v[0] == 0 && v[1] > arena))
            throw std::out_of_range(lw + ": a buffer reference is out of range");
        }
      }
      phase("manifest");
      env.prebuilt = i < prebuilt.size() ? prebuilt[i] : nullptr;
      Executable::Launch l = rebuild_launch(r, env, lw);
      env.prebuilt = nullptr;
      phase("launches " + r.kind);
      l.name = j.at("name").get<std::string>();
      l.nodes = j.at("nodes").get<std::string>();
      exe->launches.push_back(std::move(l));
    }
    if (!cuda) {
      out.onednn_nodes = env.onednn_nodes;
      out.onednn_nodes_at_written_threads = env.onednn_nodes_at_written_threads;
      out.onednn_threads = env.onednn_nodes_at_written_threads == env.onednn_nodes
                               ? out.threads : env.onednn_load_threads;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad(source, fmt::format("section 'manifest': {}: {}", where, e.what()));
  }
  if (cuda && m.contains("cuda_graph") && m.at("cuda_graph").is_boolean() &&
      m.at("cuda_graph").get<bool>()) {
    std::string why;
    if (!exe->use_cuda_graph(&why))
      bad(source, fmt::format("section 'manifest': cuda_graph: {}", why));
  }
  phase("manifest");
  if (cuda && !exe->graph_mode()) exe->warm_cuda_modules_at_prepare();
  if (!cuda)  // the views of the loaded bytes go (Note [CPU package weights])
    for (Executable::ConstantSpec& c : exe->constants)
      if (c.slot == -1) c.data = Tensor();
  exe->prepare();
  phase("prepare");
  out.exe = std::move(exe);
  return out;
}
}  // namespace

// Note [weights verified beside the load]
// The weights section (nearly all of a package's bytes: 102 MB of resnet50's 102 MB) is hashed
// on a second thread while the load parses it and builds the launches; every other section (the
// kernels' shared object above all) is verified before anything uses it. Until the hash is
// confirmed the weights are only numbers to the loader (the safetensors parser takes untrusted
// bytes and is fuzzed; oneDNN reorders them), and nothing runs. The load returns only after the
// hash matched; a mismatch is the error, whatever else the load tripped on. resnet50's CPU
// package: the hash takes ~59 ms of a 180 ms load, now beside the rest. Since format version 8
// the hash is chunked (Note [chunked weights hash]) and runs on up to 7 threads beside the load,
// which joins in when its own work is done (WeightsPass); with AVX-512, sixteen chunks at a time
// (Note [SHA-256 of sixteen messages at once] in support/sha256_x16.cc).
LoadedPackage load_package_bytes(std::string_view bytes, const std::string& source) {
  auto t0 = std::chrono::steady_clock::now();
  uint32_t version = 0;
  std::string_view weights_hash;
  std::vector<SectionView> sections =
      parse_sections(bytes, source, &version, "weights", &weights_hash);
  const double parse_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // parse_sections requires the weights second.
  WeightsPass pass(sections[1].bytes, weights_hash, hashed_in_chunks("weights", version));
  auto confirm = [&] {
    if (!pass.finish()) bad(source, "section 'weights': SHA-256 mismatch (the section is corrupt)");
  };
  LoadedPackage out;
  try {
    out = load_sections(bytes, source, sections, version, pass);
  } catch (...) {
    confirm();  // a corrupt weights section is the reason, whatever the load tripped on
    throw;
  }
  auto t1 = std::chrono::steady_clock::now();
  confirm();
  // "verify": the container and the small sections, then the rest of the weights' pass.
  out.load_phases.insert(out.load_phases.begin(), {"verify", parse_s});
  out.load_phases.emplace_back(
      "verify weights (waited)", std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
  return out;
}

namespace {
// A package file mapped read-only (an empty file maps to no bytes); errors name the path.
struct MappedPackage {
  void* map = nullptr;
  size_t size = 0;
  explicit MappedPackage(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      fail_kind(ErrorKind::InvalidArgument, "package '{}': cannot read the file: {}", path,
                errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      int err = errno;
      ::close(fd);
      fail_kind(ErrorKind::InvalidArgument, "package '{}': not a regular file ({})", path,
                errno_text(err));
    }
    size = size_t(st.st_size);
    if (size == 0) {
      ::close(fd);
      return;
    }
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED)
      fail_kind(ErrorKind::Runtime, "package '{}': cannot map the file: {}", path, errno_text(errno));
  }
  ~MappedPackage() {
    if (map) ::munmap(map, size);
  }
  MappedPackage(const MappedPackage&) = delete;
  MappedPackage& operator=(const MappedPackage&) = delete;
  std::string_view bytes() const {
    return map ? std::string_view(static_cast<const char*>(map), size) : std::string_view();
  }
};
}  // namespace

// The file is mapped read-only rather than read: the loader hashes and parses it in place and
// copies only the weights (into tensors) and the kernels (into their memfd).
LoadedPackage load_package(const std::string& path) {
  MappedPackage file(path);
  return load_package_bytes(file.bytes(), path);
}

std::string package_target_device(const std::string& path) {
  MappedPackage file(path);
  uint32_t version = 0;
  std::string_view weights_hash;  // not checked: the weights are not read here
  std::vector<SectionView> sections =
      parse_sections(file.bytes(), path, &version, "weights", &weights_hash);
  try {
    return kernels::parse_untrusted_json(sections[0].bytes).at("target").at("device").get<std::string>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad(path, fmt::format("section 'manifest': target.device: {}", e.what()));
  }
}

std::vector<PackageSection> read_package_sections(const std::string& path, uint32_t* version,
                                                  size_t* file_bytes) {
  std::string bytes;
  if (!read_whole_file(path, &bytes))
    fail_kind(ErrorKind::InvalidArgument, "package '{}': cannot read the file: {}", path,
              errno_text(errno));
  if (file_bytes) *file_bytes = bytes.size();
  return parse_package_container(bytes, path, version);
}

std::string explain_package(const std::string& path) {
  uint32_t version = 0;
  size_t file_bytes = 0;
  std::vector<PackageSection> sections = read_package_sections(path, &version, &file_bytes);
  json m;
  try {
    m = kernels::parse_untrusted_json(sections[0].bytes);
  } catch (const std::exception& e) {
    bad(path, fmt::format("section 'manifest': {}", e.what()));
  }
  std::string s = fmt::format("package {} ({} bytes, format version {})\n", path, file_bytes,
                              version);
  for (const PackageSection& sec : sections)
    s += fmt::format("  section {:<12} {:>12} bytes  sha256 {}\n", sec.name, sec.bytes.size(),
                     sha256_hex(sec.bytes).substr(0, 16));
  auto str = [&](const char* k) { return m.contains(k) ? m[k].dump() : std::string("?"); };
  s += fmt::format("model {}  mode {}  batch {}  kiln {}\n", str("model"), str("mode"),
                   str("batch"), str("kiln_version"));
  s += fmt::format("target {}\n", m.contains("target") ? m["target"].dump() : "?");
  s += fmt::format("knobs {}  precision {}\n", str("knobs"), str("precision"));
  if (m.contains("autotune") && !m["autotune"].get<std::string>().empty())
    s += fmt::format("autotune {}\n", str("autotune"));
  s += fmt::format("arena {} bytes, {} slots\n", str("arena_bytes"), str("num_slots"));
  for (const char* side : {"inputs", "outputs"})
    if (m.contains(side))
      for (const json& j : m[side]) {
        std::string named;  // "batch_size=1, sequence=128": the dims named in the source model
        if (j.contains("dim_names") && j["dim_names"].is_array() && j.contains("shape") &&
            j["shape"].is_array() && j["shape"].size() == j["dim_names"].size())
          for (size_t d = 0; d < j["shape"].size(); ++d)
            if (j["dim_names"][d].is_string())
              named += fmt::format("{}{}={}", named.empty() ? "" : ", ",
                                   j["dim_names"][d].get<std::string>(), j["shape"][d].dump());
        std::string staged;  // Note [Input staging in the arena]
        if (j.contains("staging_offset") && j["staging_offset"].is_number_integer())
          staged = fmt::format(", staged in the arena at {}", j["staging_offset"].get<int64_t>());
        s += fmt::format("{} {} {} {}{}{}\n", side, j.value("name", "?"), j.value("dtype", "?"),
                         j.contains("shape") ? j["shape"].dump() : "?",
                         named.empty() ? "" : " (specialized: " + named + ")", staged);
      }
  if (m.contains("guards") && m["guards"].is_array())
    s += fmt::format("guards: {} checks before each call (input count, each input's dtype and "
                     "shape)\n", m["guards"].size());
  int64_t weight_bytes = 0, nconst = 0;
  if (m.contains("constants"))
    for (const json& c : m["constants"]) {
      ++nconst;
      (void)c;
    }
  weight_bytes = int64_t(sections[1].bytes.size());
  s += fmt::format("weights: {} tensors, {} bytes\n", nconst, weight_bytes);
  // Note [prepacked weights]: how many oneDNN nodes read their weights as stored, and how much.
  int64_t packed = 0, packed_bytes = 0, wino = 0;
  if (m.contains("launches") && m["launches"].is_array())
    for (const json& l : m["launches"])
      if (l.is_object() && l.contains("params") && l["params"].is_object() &&
          l["params"].contains("prepacked") && l["params"]["prepacked"].is_array())
        for (const json& e : l["params"]["prepacked"]) {
          ++packed;
          std::string layout = e.is_object() ? e.value("layout", "") : "";
          wino += layout.find(" wino ") != std::string::npos;
        }
  if (packed > 0) {
    try {
      const std::string& w = sections[1].bytes;
      for (const SafetensorsEntry& e : parse_safetensors_entries(
               {reinterpret_cast<const uint8_t*>(w.data()), w.size()}, "weights"))
        if (e.name.find("@onednn") != std::string::npos) packed_bytes += e.nbytes;
    } catch (const Error&) {
    }
    s += fmt::format("prepacked: {} oneDNN weights ({} Winograd transforms) in their kernels' "
                     "layouts, {} bytes (the load copies them instead of reordering)\n",
                     packed, wino, packed_bytes);
  }
  if (m.contains("cuda_modules") && m["cuda_modules"].is_array())
    for (const json& d : m["cuda_modules"]) {
      std::string ptx = d.contains("ptx_size") ? fmt::format("PTX {} bytes (for newer GPUs)",
                                                             d["ptx_size"].dump())
                                               : std::string("no PTX");
      s += fmt::format("cuda module {}: {} cubin {} bytes, {}\n", d.value("name", "?"),
                       d.value("arch", "?"), d.contains("size") ? d["size"].dump() : "?", ptx);
    }
  // The source graph's parameters: what `kiln package --replace-weights` takes, by name.
  for (const PackageSection& sec : sections) {
    if (sec.name != "source") continue;
    try {
      SafetensorsContents src = parse_safetensors(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(sec.bytes.data()),
                                   sec.bytes.size()),
          path + ": section 'source'");
      json params = kernels::parse_untrusted_json(src.metadata.at("params"));
      s += fmt::format("source parameters ({}; `kiln package --replace-weights` takes these):\n",
                       params.size());
      for (const json& p : params)
        s += fmt::format("  {} {} {}\n", p.value("name", "?"), p.value("dtype", "?"),
                         p.contains("shape") ? p["shape"].dump() : "?");
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      bad(path, fmt::format("section 'source': {}", e.what()));
    }
  }
  if (m.contains("launches")) {
    s += fmt::format("launches ({}):\n", m["launches"].size());
    size_t i = 0;
    for (const json& l : m["launches"]) {
      std::string detail;
      if (l.value("kind", "") == "onednn" && l.contains("params"))
        detail = l["params"].value("expect", "");
      else if (l.contains("params"))
        detail = l["params"].dump();
      s += fmt::format("  {:>3} {:<7} {:<28} {}  [{}]\n", i++, l.value("kind", "?"),
                       l.value("name", "?"), detail, l.value("nodes", ""));
    }
  }
  return s;
}

}  // namespace kiln
