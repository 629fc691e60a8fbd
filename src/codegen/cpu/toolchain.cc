// Note [CPU toolchain and cache]
// The CPU compiler emits one C++ translation unit per graph; this file turns it into a loaded
// shared object, compiling it with the host C++ compiler only when no valid cached copy exists.
//
// Toolchain. The compiler is $KILN_CXX (a path, or a name looked up on PATH), else `c++`, else
// `g++` on PATH; its version is the first line of `<compiler> --version`. The default flags are
// fixed (-O3 -march=native ... -lsleef; never -ffast-math: generated code must keep IEEE NaN and
// infinity semantics). The host ISA string lists the CPU features __builtin_cpu_supports reports;
// it is part of the key because -march=native compiles for exactly those features. All of this
// is computed once per process (toolchain()).
//
// Key. SHA-256 over a length-prefixed record of: a format version, the source, the compiler path
// (as found and canonical), its version line, every flag (defaults, then extra_flags) and the ISA.
// Any change to one of them is a different key, hence a different file: entries are immutable.
//
// Entry. <cache_dir>/cpu/<key[0:2]>/<key>.so plus <key>.meta, a small text file with the key,
// the size and SHA-256 of the .so bytes, the unit name and the compile time. A lookup loads the
// .so only if the .meta parses, names this key, and the .so has exactly the recorded size and
// hash; anything else (a missing .meta, a truncated or bit-flipped .so) is recompiled and counted
// in rebuilt_corrupt. An invalid file is never handed to dlopen.
//
// Atomic writes. The compiler writes <key>.tmp.<pid>.<tid>.<n>.so in the entry's directory; the
// bytes are hashed and fsynced, the .meta is written to its own temp file and fsynced, then the
// .so and the .meta are renamed into place (in that order) and the directory is fsynced. A reader
// therefore sees either no entry, a complete old entry, or a .so whose .meta is not there yet
// (treated as missing). The source reaches the compiler on stdin (`-x c++ -`), so the .so does
// not embed a temp file name and two compiles of one key give identical bytes: two processes
// racing on one key both end with a valid entry and a valid loaded library, whichever rename
// lands last. (The .so is hashed and then dlopened by path; a rename between the two can only
// substitute another complete compile of the same key.)
//
// In-process map. Loaded handles are kept in a map .so path -> weak_ptr, so a second compile of
// the same unit in one process (while the first result is alive) neither reads the disk nor
// reloads; each call still gets its own LoadedLibrary with its own cache_hit()/compile_seconds().
// A per-path mutex makes threads that ask for the same unit at once wait for one compile.
// Keep a LoadedLibrary alive while its functions are in use: the last one dlcloses the handle.
// dlopen identifies libraries by path: a test that edits a cached .so must drop every reference
// first (and should replace the file rather than write into a mapped one).
//
// Errors. The compiler's stdout+stderr go to a temp file. On failure the source is kept under
// <cache_dir>/cpu/failed/ and the error names the unit, the kernel whose `// kiln-kernel: NAME`
// marker precedes the first error's line, the first lines of compiler output and the kept path.
// Processes are started with posix_spawn from an argv vector: no shell, no quoting.
#include "codegen/cpu/toolchain.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"

extern char** environ;

namespace kiln::codegen {

namespace fs = std::filesystem;

namespace detail {
struct LibraryHandle {
  void* handle = nullptr;
  std::string path, key, unit_name;
  ~LibraryHandle() {
    if (handle) dlclose(handle);
  }
};
}  // namespace detail

namespace {

using detail::LibraryHandle;

// Bumped whenever the entry layout, the key record or the meta format changes.
constexpr int kCacheFormatVersion = 1;
constexpr int kTuningFormatVersion = 1;
constexpr size_t kMaxErrorLines = 20;

// Default flags (compile) and link flags, in command-line order. Link flags follow the input.
const std::array<const char*, 8> kCompileFlags = {
    "-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-std=c++17", "-fno-math-errno",
    "-fno-trapping-math"};
const std::array<const char*, 1> kLinkFlags = {"-lsleef"};

// ---- SHA-256 (FIPS 180-4) -------------------------------------------------------------------

class Sha256 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_bytes_ += n;
    if (buffered_ > 0) {
      const size_t take = std::min(n, size_t{64} - buffered_);
      std::memcpy(buffer_ + buffered_, p, take);
      buffered_ += take;
      p += take;
      n -= take;
      if (buffered_ < 64) return;
      compress(buffer_);
      buffered_ = 0;
    }
    for (; n >= 64; p += 64, n -= 64) compress(p);
    std::memcpy(buffer_, p, n);
    buffered_ = n;
  }
  void update(std::string_view s) { update(s.data(), s.size()); }

  std::string hex_digest() {
    const uint64_t bit_length = total_bytes_ * 8;
    const uint8_t pad_start = 0x80;
    update(&pad_start, 1);
    const uint8_t zero = 0;
    while (buffered_ != 56) update(&zero, 1);
    uint8_t length_be[8];
    for (int i = 0; i < 8; ++i) length_be[i] = static_cast<uint8_t>(bit_length >> (56 - 8 * i));
    update(length_be, 8);  // completes the last block
    static const char* digits = "0123456789abcdef";
    std::string hex(64, '0');
    for (int i = 0; i < 8; ++i)
      for (int b = 0; b < 8; ++b) hex[i * 8 + b] = digits[(state_[i] >> (28 - 4 * b)) & 0xf];
    return hex;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress(const uint8_t* block) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) |
             (uint32_t{block[4 * i + 2]} << 8) | uint32_t{block[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
  }

  uint32_t state_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buffer_[64] = {};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// One field of a hashed record: tag, length, bytes. Length prefixes keep field boundaries
// unambiguous (source "a" + flag "b" never collides with source "ab").
void hash_field(Sha256& sha, std::string_view tag, std::string_view value) {
  sha.update(fmt::format("{}:{}:", tag, value.size()));
  sha.update(value);
  sha.update("\n");
}

// ---- files ----------------------------------------------------------------------------------

std::string errno_text(int err) { return std::strerror(err); }

bool read_whole_file(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

// A name unique among all threads of all processes on this host: pid, thread id, counter.
std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.{}.{}", static_cast<long>(::getpid()),
                     static_cast<long>(::syscall(SYS_gettid)), counter.fetch_add(1));
}

void write_all_or_throw(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      fail_kind(ErrorKind::Runtime, "cannot write '{}': {} (check free space and permissions)",
                path, errno_text(errno));
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void write_file(const std::string& path, std::string_view data, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail_kind(ErrorKind::Runtime, "cannot create '{}': {} (check permissions of the directory)",
              path, errno_text(errno));
  try {
    write_all_or_throw(fd, data, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (sync && ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail_kind(ErrorKind::Runtime, "cannot fsync '{}': {}", path, errno_text(err));
  }
  ::close(fd);
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: durability, not correctness, depends on it
  ::fsync(fd);
  ::close(fd);
}

// `env_var` names the variable that chose the directory, for the message.
void make_dirs(const fs::path& dir, const char* env_var = "KILN_CACHE_DIR") {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    fail_kind(ErrorKind::Runtime,
              "cannot create directory '{}': {} (set {} to a writable directory)", dir.string(),
              ec.message(), env_var);
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

// Writes `data` to a temp file next to `path`, fsyncs it and renames it over `path`.
void write_file_atomic(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp." + unique_suffix();
  try {
    write_file(tmp, data, /*sync=*/true);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    remove_quietly(tmp);
    fail_kind(ErrorKind::Runtime, "cannot rename '{}' to '{}': {}", tmp, path, errno_text(err));
  }
}

// Unit names become parts of file names: keep [A-Za-z0-9._-], replace the rest.
std::string file_safe(const std::string& unit_name) {
  std::string s = unit_name.substr(0, 64);
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      c = '_';
  return s.empty() ? std::string("unit") : s;
}

// ---- processes ------------------------------------------------------------------------------

struct SpawnFileActions {
  posix_spawn_file_actions_t fa;
  SpawnFileActions() { posix_spawn_file_actions_init(&fa); }
  ~SpawnFileActions() { posix_spawn_file_actions_destroy(&fa); }
};

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const std::string& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

std::string describe_status(int status) {
  if (status == -1) return "could not be waited for";
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("ended with wait status {}", status);
}

// Runs argv[0] (an absolute path) with stdin from `stdin_path`, stdout and stderr into
// `output_path`. Returns the wait status.
int run_to_file(const std::vector<std::string>& argv, const std::string& stdin_path,
                const std::string& output_path) {
  SpawnFileActions actions;
  posix_spawn_file_actions_addopen(&actions.fa, 0, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions.fa, 2, output_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions.fa, 2, 1);
  std::vector<char*> args = c_argv(argv);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions.fa, nullptr, args.data(), environ);
  if (rc != 0)
    fail_kind(ErrorKind::Runtime, "cannot start '{}': {} (set KILN_CXX to a working C++ compiler)",
              argv[0], errno_text(rc));
  return wait_for(pid);
}

// Runs argv and returns its stdout; *status gets the wait status.
std::string run_capture_stdout(const std::vector<std::string>& argv, int* status) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    fail_kind(ErrorKind::Runtime, "pipe failed: {}", errno_text(errno));
  SpawnFileActions actions;
  posix_spawn_file_actions_addopen(&actions.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions.fa, fds[1], 1);
  posix_spawn_file_actions_addopen(&actions.fa, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args = c_argv(argv);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions.fa, nullptr, args.data(), environ);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    fail_kind(ErrorKind::Runtime, "cannot start '{}': {} (set KILN_CXX to a working C++ compiler)",
              argv[0], errno_text(rc));
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  *status = wait_for(pid);
  return out;
}

// ---- toolchain ------------------------------------------------------------------------------

bool is_executable_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

// `name` itself when it contains a '/', else the first PATH entry holding an executable `name`.
// Returns an absolute path, or "" when there is none.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos)
    return is_executable_file(name) ? fs::absolute(name).lexically_normal().string() : "";
  const char* path_env = std::getenv("PATH");
  std::string_view path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const size_t colon = path.find(':');
    std::string dir(path.substr(0, colon));
    if (dir.empty()) dir = ".";
    const fs::path candidate = fs::path(dir) / name;
    if (is_executable_file(candidate)) return fs::absolute(candidate).lexically_normal().string();
    if (colon == std::string_view::npos) break;
    path.remove_prefix(colon + 1);
  }
  return "";
}

std::string find_compiler() {
  if (const char* cxx = std::getenv("KILN_CXX"); cxx && *cxx) {
    const std::string found = find_program(cxx);
    if (found.empty())
      fail_kind(ErrorKind::Runtime,
                "KILN_CXX='{}' is not an executable file{}: set KILN_CXX to the path of a C++ "
                "compiler (g++ 12 or newer) or unset it to use c++/g++ from PATH",
                cxx, std::string_view(cxx).find('/') == std::string_view::npos ? " on PATH" : "");
    return found;
  }
  for (const char* name : {"c++", "g++"}) {
    const std::string found = find_program(name);
    if (!found.empty()) return found;
  }
  const char* path_env = std::getenv("PATH");
  fail_kind(ErrorKind::Runtime,
            "no C++ compiler found for the CPU code generator: looked for 'c++' and 'g++' on PATH "
            "({}); install g++ or set KILN_CXX to the compiler's path",
            path_env ? path_env : "<PATH unset>");
}

std::string canonical_or_same(const std::string& path) {
  std::error_code ec;
  const fs::path c = fs::canonical(path, ec);
  return ec ? path : c.string();
}

// ---- cache entries --------------------------------------------------------------------------

struct EntryPaths {
  fs::path dir;
  std::string so, meta;
};

EntryPaths entry_paths(const std::string& key) {
  EntryPaths p;
  p.dir = fs::path(cache_dir()) / "cpu" / key.substr(0, 2);
  p.so = (p.dir / (key + ".so")).string();
  p.meta = (p.dir / (key + ".meta")).string();
  return p;
}

std::string cache_key(const CxxCompileRequest& req, const ToolchainInfo& tc) {
  Sha256 sha;
  hash_field(sha, "format", fmt::format("kiln-cpu-cache {}", kCacheFormatVersion));
  hash_field(sha, "source", req.source);
  hash_field(sha, "compiler", tc.compiler);
  hash_field(sha, "compiler_canonical", canonical_or_same(tc.compiler));
  hash_field(sha, "compiler_version", tc.compiler_version);
  for (const std::string& f : tc.flags) hash_field(sha, "flag", f);
  for (const std::string& f : req.extra_flags) hash_field(sha, "extra_flag", f);
  hash_field(sha, "isa", tc.isa);
  return sha.hex_digest();
}

std::string meta_text(const std::string& key, size_t so_bytes, const std::string& so_sha256,
                      const std::string& unit, double compile_seconds,
                      const ToolchainInfo& tc) {
  return fmt::format(
      "kiln-cpu-cache {}\nkey {}\nso_bytes {}\nso_sha256 {}\nunit {}\ncompile_seconds {:.3f}\n"
      "compiler {}\n",
      kCacheFormatVersion, key, so_bytes, so_sha256, unit, compile_seconds, tc.compiler);
}

// Reads `name value` lines of a .meta file; false when the text is not a meta of this format.
bool parse_meta(const std::string& text, std::string_view format_name, int version,
                std::unordered_map<std::string, std::string>* fields) {
  size_t pos = 0;
  bool first = true;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) return false;  // truncated: every line ends with '\n'
    const std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) return false;
    std::string name(line.substr(0, sp)), value(line.substr(sp + 1));
    if (first) {
      if (name != format_name || value != std::to_string(version)) return false;
      first = false;
      continue;
    }
    (*fields)[name] = std::move(value);
  }
  return !first;
}

// True when the entry for `key` is complete and its .so bytes match the .meta. *existed tells
// whether any file of the entry was there (an invalid existing entry is "corrupt").
bool entry_is_valid(const std::string& key, const EntryPaths& p, bool* existed) {
  std::error_code ec;
  *existed = fs::exists(p.so, ec) || fs::exists(p.meta, ec);
  if (!*existed) return false;
  std::string meta;
  if (!read_whole_file(p.meta, &meta)) return false;
  std::unordered_map<std::string, std::string> fields;
  if (!parse_meta(meta, "kiln-cpu-cache", kCacheFormatVersion, &fields)) return false;
  if (fields["key"] != key) return false;
  std::string so;
  if (!read_whole_file(p.so, &so)) return false;
  if (fields["so_bytes"] != std::to_string(so.size())) return false;
  return fields["so_sha256"] == sha256_hex(so);
}

// Units are built with -fopenmp, so loading one may load the OpenMP runtime as its dependency
// (in a process that does not link it itself). Its worker threads outlive the parallel region;
// unloading the runtime with the last unit would pull the code from under them (a crash at an
// unmapped address). RTLD_NOLOAD|RTLD_NODELETE marks an already loaded runtime as never unloaded.
void pin_openmp_runtime() {
  for (const char* runtime : {"libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so"}) {
    if (void* h = ::dlopen(runtime, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) ::dlclose(h);
  }
}

std::shared_ptr<const LibraryHandle> load_library(const std::string& path, const std::string& key,
                                                  const std::string& unit_name) {
  auto lib = std::make_shared<LibraryHandle>();
  lib->path = path;
  lib->key = key;
  lib->unit_name = unit_name;
  lib->handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    const char* why = ::dlerror();
    fail_kind(ErrorKind::Internal,
              "compiled unit '{}' cannot be loaded from '{}': {} (a generated kernel may call a "
              "function that is not defined; is libsleef installed?)",
              unit_name, path, why ? why : "unknown dlopen error");
  }
  pin_openmp_runtime();
  return lib;
}

// ---- compile errors -------------------------------------------------------------------------

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

// The source line of a `<stdin>:LINE[:COL]` location at the start of `line`, or 0.
int stdin_line_number(std::string_view line) {
  constexpr std::string_view prefix = "<stdin>:";
  const size_t at = line.find(prefix);
  if (at == std::string_view::npos) return 0;
  int n = 0;
  size_t i = at + prefix.size();
  for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])); ++i)
    n = n * 10 + (line[i] - '0');
  return i > at + prefix.size() ? n : 0;
}

bool is_error_line(std::string_view line) {
  return line.find(": error:") != std::string_view::npos ||
         line.find(": fatal error:") != std::string_view::npos;
}

// The name in the last `// kiln-kernel: NAME` marker at or before 1-based `line_number`.
std::string kernel_at_line(const std::string& source, int line_number) {
  std::string kernel;
  int n = 0;
  for (std::string_view line : split_lines(source)) {
    if (++n > line_number) break;
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string_view::npos) continue;
    line.remove_prefix(start);
    constexpr std::string_view marker = "// kiln-kernel:";
    if (line.substr(0, marker.size()) != marker) continue;
    line.remove_prefix(marker.size());
    const size_t b = line.find_first_not_of(" \t");
    const size_t e = line.find_last_not_of(" \t\r");
    kernel = b == std::string_view::npos ? "" : std::string(line.substr(b, e - b + 1));
  }
  return kernel;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

[[noreturn]] void throw_compile_error(const CxxCompileRequest& req, const std::string& unit,
                                      const std::string& compiler, int status,
                                      const std::string& output, const std::string& kept_source,
                                      const std::string& kept_log) {
  const std::vector<std::string_view> lines = split_lines(output);
  // Locate the first error and the source line it refers to: the error's own location when it
  // is in the unit, else the nearest `<stdin>:N` before it (an error inside an included header
  // is listed after the include/instantiation chain that leads to it).
  size_t first_error = lines.size();
  int error_line = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!is_error_line(lines[i])) continue;
    first_error = i;
    for (size_t j = i + 1; j-- > 0 && error_line == 0;) error_line = stdin_line_number(lines[j]);
    break;
  }
  std::string where;
  if (error_line > 0) {
    const std::string kernel = kernel_at_line(req.source, error_line);
    where = kernel.empty() ? fmt::format(" at line {}, before the first kernel", error_line)
                           : fmt::format(" in kernel '{}' (line {})", kernel, error_line);
  }
  const size_t begin = first_error < lines.size() && first_error > 2 ? first_error - 2 : 0;
  std::string excerpt;
  for (size_t i = begin; i < lines.size() && i < begin + kMaxErrorLines; ++i) {
    std::string line(lines[i].substr(0, 400));
    excerpt += "  " + replace_all(std::move(line), "<stdin>", kept_source) + "\n";
  }
  if (excerpt.empty()) excerpt = "  (the compiler printed nothing)\n";
  std::string hint;
  if (output.find("sleef.h: No such file") != std::string::npos ||
      output.find("cannot find -lsleef") != std::string::npos)
    hint = " SLEEF seems to be missing: install libsleef-dev.";
  fail_kind(ErrorKind::Internal,
            "C++ compile of unit '{}' failed{}: {} {}.\nFirst compiler output lines:\n{}"
            "The failing source is kept at {} (full compiler output: {}). Generated code that "
            "does not compile is a Kiln bug: please report it with that file.{}",
            unit, where, compiler, describe_status(status), excerpt, kept_source, kept_log, hint);
}

// Temp files of compiles that were killed midway (a crashed process never renames or removes
// them). A day old is long past any compile still running.
void remove_stale_temps(const fs::path& dir) {
  std::error_code ec;
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::hours(24);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().find(".tmp.") == std::string::npos) continue;
    std::error_code time_ec;
    const auto written = entry.last_write_time(time_ec);
    if (!time_ec && written < cutoff) fs::remove(entry.path(), time_ec);
  }
}

// Compiles `req` into the entry `p` (atomically). Returns the compiler's wall time in seconds.
double compile_entry(const CxxCompileRequest& req, const ToolchainInfo& tc, const std::string& key,
                     const std::string& unit, const EntryPaths& p) {
  make_dirs(p.dir);
  remove_stale_temps(p.dir);
  const std::string tmp = (p.dir / (key + ".tmp." + unique_suffix())).string();
  const std::string tmp_source = tmp + ".cc", tmp_so = tmp + ".so", tmp_log = tmp + ".log";
  const std::string tmp_meta = tmp + ".meta";
  write_file(tmp_source, req.source, /*sync=*/false);

  std::vector<std::string> argv = {tc.compiler};
  for (const char* f : kCompileFlags) argv.emplace_back(f);
  argv.insert(argv.end(), {"-o", tmp_so, "-x", "c++", "-", "-x", "none"});
  argv.insert(argv.end(), req.extra_flags.begin(), req.extra_flags.end());
  for (const char* f : kLinkFlags) argv.emplace_back(f);

  const auto start = std::chrono::steady_clock::now();
  int status = -1;
  try {
    status = run_to_file(argv, tmp_source, tmp_log);
  } catch (...) {
    remove_quietly(tmp_source);
    remove_quietly(tmp_log);
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string output;
  read_whole_file(tmp_log, &output);
  remove_quietly(tmp_source);
  remove_quietly(tmp_log);
  std::error_code ec;
  if (status != 0 || !fs::exists(tmp_so, ec)) {
    remove_quietly(tmp_so);
    const fs::path failed_dir = fs::path(cache_dir()) / "cpu" / "failed";
    const std::string stem = (failed_dir / fmt::format("{}_{}", unit, key.substr(0, 12))).string();
    const std::string kept_source = stem + ".cc", kept_log = stem + ".log";
    make_dirs(failed_dir);
    write_file_atomic(kept_source, req.source);
    write_file_atomic(kept_log, replace_all(output, "<stdin>", kept_source));
    throw_compile_error(req, unit, tc.compiler, status, output, kept_source, kept_log);
  }

  std::string so_bytes;
  if (!read_whole_file(tmp_so, &so_bytes)) {
    remove_quietly(tmp_so);
    fail_kind(ErrorKind::Runtime, "cannot read the compiled unit '{}' at '{}': {}", unit, tmp_so,
              errno_text(errno));
  }
  try {
    fsync_path(tmp_so);
    write_file(tmp_meta,
               meta_text(key, so_bytes.size(), sha256_hex(so_bytes), unit, seconds, tc),
               /*sync=*/true);
    // .so first: a .meta is never visible before the bytes it describes.
    if (::rename(tmp_so.c_str(), p.so.c_str()) != 0 ||
        ::rename(tmp_meta.c_str(), p.meta.c_str()) != 0)
      fail_kind(ErrorKind::Runtime, "cannot move the compiled unit '{}' into the cache at '{}': {}",
                unit, p.so, errno_text(errno));
  } catch (...) {
    remove_quietly(tmp_so);
    remove_quietly(tmp_meta);
    throw;
  }
  fsync_path(p.dir.string());
  return seconds;
}

// ---- process-wide state ---------------------------------------------------------------------

struct ProcessCache {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<const LibraryHandle>> loaded;  // by .so path
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> in_flight;      // by .so path
};

ProcessCache& process_cache() {
  static ProcessCache* cache = new ProcessCache;  // never destroyed: handles may outlive statics
  return *cache;
}

std::atomic<int64_t> g_hits{0}, g_misses{0}, g_rebuilt_corrupt{0}, g_memory_hits{0};

// A live handle for `path` from the in-process map, or null. Caller holds ProcessCache::mu.
std::shared_ptr<const LibraryHandle> find_loaded(ProcessCache& pc, const std::string& path) {
  auto it = pc.loaded.find(path);
  if (it == pc.loaded.end()) return nullptr;
  return it->second.lock();
}

std::string tuning_path(const std::string& key) {
  return (fs::path(cache_dir()) / "tuning" / (sha256_hex(key) + ".rec")).string();
}

std::string tuning_record_body(const std::string& key, const std::string& value) {
  return fmt::format("kiln-tuning {}\nkey {}\n{}\nvalue {}\n{}\n", kTuningFormatVersion,
                     key.size(), key, value.size(), value);
}

}  // namespace

// ---- public API -----------------------------------------------------------------------------

namespace cache_files {
bool read_file(const std::string& path, std::string* out) { return read_whole_file(path, out); }
void write_file(const std::string& path, std::string_view data, bool sync) {
  codegen::write_file(path, data, sync);
}
void write_file_atomic(const std::string& path, std::string_view data) {
  codegen::write_file_atomic(path, data);
}
void fsync_path(const std::string& path) { codegen::fsync_path(path); }
void make_dirs(const std::string& dir) { codegen::make_dirs(dir); }
void remove_quietly(const std::string& path) { codegen::remove_quietly(path); }
void remove_stale_temps(const std::string& dir) { codegen::remove_stale_temps(dir); }
std::string unique_suffix() { return codegen::unique_suffix(); }
std::string file_safe(const std::string& name) { return codegen::file_safe(name); }
bool parse_meta(const std::string& text, std::string_view format_name, int version,
                std::unordered_map<std::string, std::string>* fields) {
  return codegen::parse_meta(text, format_name, version, fields);
}
std::string kernel_at_line(const std::string& source, int line_number) {
  return codegen::kernel_at_line(source, line_number);
}
}  // namespace cache_files

std::string sha256_hex(std::string_view data) {
  Sha256 sha;
  sha.update(data);
  return sha.hex_digest();
}

LoadedLibrary::LoadedLibrary(std::shared_ptr<const detail::LibraryHandle> handle, bool cache_hit,
                             bool memory_hit, double compile_seconds)
    : handle_(std::move(handle)),
      cache_hit_(cache_hit),
      memory_hit_(memory_hit),
      compile_seconds_(compile_seconds) {
  KILN_ASSERT(handle_ && handle_->handle);
}

LoadedLibrary::~LoadedLibrary() = default;

void* LoadedLibrary::symbol(const char* name) const {
  ::dlerror();  // clear a stale error
  void* sym = ::dlsym(handle_->handle, name);
  if (!sym)
    fail_kind(ErrorKind::Internal,
              "symbol '{}' not found in compiled unit '{}' ({}): the generated source defines no "
              "extern \"C\" function of that name",
              name, handle_->unit_name, handle_->path);
  return sym;
}

const std::string& LoadedLibrary::path() const { return handle_->path; }
const std::string& LoadedLibrary::key() const { return handle_->key; }
const std::string& LoadedLibrary::unit_name() const { return handle_->unit_name; }

std::string host_isa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  std::string isa = "x86-64";
  // Baseline x86-64 (cmov, mmx, sse, sse2) is implied. The string lists every feature GCC 12
  // can query; any of them may change what -march=native emits.
#define KILN_ISA_FEATURE(name)                    \
  if (__builtin_cpu_supports(name)) {             \
    isa += "+";                                   \
    isa += name;                                  \
  }
  KILN_ISA_FEATURE("sse3")
  KILN_ISA_FEATURE("ssse3")
  KILN_ISA_FEATURE("sse4.1")
  KILN_ISA_FEATURE("sse4.2")
  KILN_ISA_FEATURE("popcnt")
  KILN_ISA_FEATURE("aes")
  KILN_ISA_FEATURE("pclmul")
  KILN_ISA_FEATURE("avx")
  KILN_ISA_FEATURE("f16c")
  KILN_ISA_FEATURE("avx2")
  KILN_ISA_FEATURE("fma")
  KILN_ISA_FEATURE("bmi")
  KILN_ISA_FEATURE("bmi2")
  KILN_ISA_FEATURE("movbe")
  KILN_ISA_FEATURE("lzcnt")
  KILN_ISA_FEATURE("sha")
  KILN_ISA_FEATURE("sse4a")
  KILN_ISA_FEATURE("fma4")
  KILN_ISA_FEATURE("xop")
  KILN_ISA_FEATURE("gfni")
  KILN_ISA_FEATURE("vaes")
  KILN_ISA_FEATURE("vpclmulqdq")
  KILN_ISA_FEATURE("avxvnni")
  KILN_ISA_FEATURE("avx512f")
  KILN_ISA_FEATURE("avx512bw")
  KILN_ISA_FEATURE("avx512vl")
  KILN_ISA_FEATURE("avx512dq")
  KILN_ISA_FEATURE("avx512cd")
  KILN_ISA_FEATURE("avx512er")
  KILN_ISA_FEATURE("avx512pf")
  KILN_ISA_FEATURE("avx512ifma")
  KILN_ISA_FEATURE("avx512vbmi")
  KILN_ISA_FEATURE("avx512vbmi2")
  KILN_ISA_FEATURE("avx512vnni")
  KILN_ISA_FEATURE("avx512bitalg")
  KILN_ISA_FEATURE("avx512vpopcntdq")
  KILN_ISA_FEATURE("avx5124vnniw")
  KILN_ISA_FEATURE("avx5124fmaps")
  KILN_ISA_FEATURE("avx512vp2intersect")
  KILN_ISA_FEATURE("avx512bf16")
  KILN_ISA_FEATURE("avx512fp16")
  KILN_ISA_FEATURE("amx-tile")
  KILN_ISA_FEATURE("amx-int8")
  KILN_ISA_FEATURE("amx-bf16")
#undef KILN_ISA_FEATURE
  return isa;
#elif defined(__x86_64__)
  __builtin_cpu_init();
  std::string isa = "x86-64";
  for (const char* f : {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
    if (__builtin_cpu_supports(f)) isa += std::string("+") + f;
  return isa;
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "unknown-isa";
#endif
}

ToolchainInfo detect_toolchain() {
  ToolchainInfo info;
  info.compiler = find_compiler();
  int status = -1;
  const std::string version = run_capture_stdout({info.compiler, "--version"}, &status);
  if (status != 0)
    fail_kind(ErrorKind::Runtime,
              "C++ compiler '{}' failed to run '--version' ({}): set KILN_CXX to a working C++ "
              "compiler",
              info.compiler, describe_status(status));
  info.compiler_version = version.substr(0, version.find('\n'));
  for (const char* f : kCompileFlags) info.flags.emplace_back(f);
  for (const char* f : kLinkFlags) info.flags.emplace_back(f);
  info.isa = host_isa();
  return info;
}

const ToolchainInfo& toolchain() {
  // A throwing initializer leaves the static uninitialized: the next call detects again.
  static const ToolchainInfo info = detect_toolchain();
  return info;
}

std::string cache_dir() {
  if (const char* dir = std::getenv("KILN_CACHE_DIR"); dir && *dir) return dir;
  std::string home;
  if (const char* h = std::getenv("HOME"); h && *h) {
    home = h;
  } else {
    struct passwd pw, *result = nullptr;
    char buf[4096];
    if (::getpwuid_r(::getuid(), &pw, buf, sizeof buf, &result) == 0 && result && result->pw_dir)
      home = result->pw_dir;
  }
  if (home.empty()) return fmt::format("/tmp/kiln-cache-{}", static_cast<long>(::getuid()));
  return (fs::path(home) / ".cache" / "kiln").string();
}

CacheStats cache_stats() {
  CacheStats s;
  s.hits = g_hits.load();
  s.misses = g_misses.load();
  s.rebuilt_corrupt = g_rebuilt_corrupt.load();
  s.memory_hits = g_memory_hits.load();
  return s;
}

void reset_cache_stats() {
  g_hits = 0;
  g_misses = 0;
  g_rebuilt_corrupt = 0;
  g_memory_hits = 0;
}

std::shared_ptr<LoadedLibrary> compile_cxx(const CxxCompileRequest& req) {
  const ToolchainInfo& tc = toolchain();
  const std::string key = cache_key(req, tc);
  const std::string unit = file_safe(req.unit_name);

  if (const char* dump_dir = std::getenv("KILN_DUMP_CODE"); dump_dir && *dump_dir) {
    make_dirs(dump_dir, "KILN_DUMP_CODE");
    write_file_atomic((fs::path(dump_dir) / fmt::format("{}_{}.cc", unit, key.substr(0, 12)))
                          .string(),
                      req.source);
  }

  const EntryPaths paths = entry_paths(key);
  ProcessCache& pc = process_cache();
  auto memory_hit = [&](std::shared_ptr<const LibraryHandle> h) {
    ++g_hits;
    ++g_memory_hits;
    return std::make_shared<LoadedLibrary>(std::move(h), /*cache_hit=*/true,
                                           /*memory_hit=*/true, 0.0);
  };
  std::shared_ptr<std::mutex> path_mu;
  {
    std::lock_guard<std::mutex> lock(pc.mu);
    if (auto h = find_loaded(pc, paths.so)) return memory_hit(std::move(h));
    auto& m = pc.in_flight[paths.so];
    if (!m) m = std::make_shared<std::mutex>();
    path_mu = m;
  }
  // Drops this thread's claim on the per-path mutex; the last claimant erases it.
  auto release = [&] {
    std::lock_guard<std::mutex> lock(pc.mu);
    if (path_mu.use_count() == 2) pc.in_flight.erase(paths.so);
    path_mu.reset();
  };

  std::shared_ptr<LoadedLibrary> result;
  try {
    std::lock_guard<std::mutex> path_lock(*path_mu);
    std::shared_ptr<const LibraryHandle> handle;
    {
      std::lock_guard<std::mutex> lock(pc.mu);  // another thread may have loaded it meanwhile
      handle = find_loaded(pc, paths.so);
    }
    if (handle) {
      result = memory_hit(std::move(handle));
    } else {
      bool existed = false;
      double compile_seconds = 0;
      const bool hit = entry_is_valid(key, paths, &existed);
      if (!hit) {
        if (existed) ++g_rebuilt_corrupt;
        ++g_misses;
        compile_seconds = compile_entry(req, tc, key, unit, paths);
      }
      handle = load_library(paths.so, key, unit);
      if (hit) ++g_hits;
      result = std::make_shared<LoadedLibrary>(handle, hit, /*memory_hit=*/false, compile_seconds);
      std::lock_guard<std::mutex> lock(pc.mu);
      std::erase_if(pc.loaded, [](const auto& kv) { return kv.second.expired(); });
      pc.loaded[paths.so] = handle;
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  return result;
}

std::vector<std::shared_ptr<LoadedLibrary>> compile_cxx_all(
    const std::vector<CxxCompileRequest>& reqs) {
  const size_t n = reqs.size();
  std::vector<std::shared_ptr<LoadedLibrary>> results(n);
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        results[i] = compile_cxx(reqs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t workers =
      std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(worker);
  worker();  // this thread is one of the workers
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

bool tuning_get(const std::string& key, std::string* value) {
  std::string text;
  if (!read_whole_file(tuning_path(key), &text)) return false;
  // Layout: body, then "sha256 <64 hex digits of body>\n". Parse the body strictly by its
  // lengths: any truncation or flipped byte reads as absent.
  constexpr size_t kTrailer = 7 + 64 + 1;
  if (text.size() < kTrailer || text.back() != '\n') return false;
  const size_t sha_at = text.size() - kTrailer;
  if (text.compare(sha_at, 7, "sha256 ") != 0) return false;
  const std::string body = text.substr(0, sha_at);
  if (text.compare(sha_at + 7, 64, sha256_hex(body)) != 0) return false;
  const std::string header = fmt::format("kiln-tuning {}\nkey {}\n", kTuningFormatVersion,
                                         key.size());
  if (body.compare(0, header.size(), header) != 0) return false;
  size_t pos = header.size();
  if (body.size() < pos + key.size() + 1 || body.compare(pos, key.size(), key) != 0 ||
      body[pos + key.size()] != '\n')
    return false;
  pos += key.size() + 1;
  if (body.compare(pos, 6, "value ") != 0) return false;
  pos += 6;
  const size_t nl = body.find('\n', pos);
  if (nl == std::string::npos) return false;
  size_t value_size = 0;
  for (size_t i = pos; i < nl; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(body[i]))) return false;
    value_size = value_size * 10 + static_cast<size_t>(body[i] - '0');
  }
  pos = nl + 1;
  if (body.size() != pos + value_size + 1 || body.back() != '\n') return false;
  *value = body.substr(pos, value_size);
  return true;
}

void tuning_put(const std::string& key, const std::string& value) {
  const std::string path = tuning_path(key);
  make_dirs(fs::path(path).parent_path());
  std::string body = tuning_record_body(key, value);
  const std::string sha = sha256_hex(body);
  write_file_atomic(path, body + "sha256 " + sha + "\n");
}

}  // namespace kiln::codegen
