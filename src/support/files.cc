#include "support/files.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"

namespace kiln {

namespace fs = std::filesystem;

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

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.{}.{}", static_cast<long>(::getpid()),
                     static_cast<long>(::syscall(SYS_gettid)), counter.fetch_add(1));
}

namespace {
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
}  // namespace

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
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void make_dirs(const std::string& dir, const char* env_var) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    fail_kind(ErrorKind::Runtime,
              "cannot create directory '{}': {} (set {} to a writable directory)", dir,
              ec.message(), env_var);
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

void write_file_atomic(const std::string& path, std::string_view data) {
  AtomicFile f(path, "write");
  f.write(data);
  f.commit();
}

namespace {
// The process umask, read without umask(2)'s set-and-restore (which races with other threads).
mode_t current_umask() {
  FILE* f = std::fopen("/proc/self/status", "r");
  mode_t mask = 022;
  if (!f) return mask;
  char line[256];
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "Umask:", 6) == 0) {
      mask = mode_t(std::strtoul(line + 6, nullptr, 8));
      break;
    }
  std::fclose(f);
  return mask;
}
std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : slash == 0 ? std::string("/")
                                                                    : path.substr(0, slash);
}
}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  tmp_ = path_ + ".tmp." + unique_suffix();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666 & ~current_umask());
  if (fd_ < 0) fail_io("cannot create a temp file next to it", errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::fail_io(const char* what, int err) {
  fail_kind(ErrorKind::Runtime, "{} '{}': {}: {} (check free space and permissions)", what_, path_,
            what, errno_text(err));
}

void AtomicFile::write(const void* data, size_t n) {
  KILN_ASSERT(!committed_ && fd_ >= 0);
  auto* b = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail_io("write failed", w < 0 ? errno : EIO);
    b += w;
    n -= size_t(w);
  }
}

void AtomicFile::commit() {
  KILN_ASSERT(!committed_ && fd_ >= 0);
  if (::fsync(fd_) != 0) fail_io("fsync failed", errno);
  int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail_io("close failed", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_io("cannot rename the temp file into place", errno);
  committed_ = true;
  fsync_path(parent_dir(path_));
}

std::string file_safe(const std::string& name) {
  std::string s = name.substr(0, 64);
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      c = '_';
  return s.empty() ? std::string("unit") : s;
}

void remove_stale_temps(const std::string& dir) {
  std::error_code ec;
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::hours(24);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().find(".tmp.") == std::string::npos) continue;
    std::error_code time_ec;
    const auto written = entry.last_write_time(time_ec);
    if (!time_ec && written < cutoff) fs::remove(entry.path(), time_ec);
  }
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

}  // namespace kiln
