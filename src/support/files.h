// Files written so that a reader never sees half of one: atomic replacement through a temp file
// and rename, fsync where durability matters, and errors that name the path and what to do.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace kiln {

// strerror(err) as a string.
std::string errno_text(int err);

// Reads the whole file; false when it cannot be opened or read.
bool read_whole_file(const std::string& path, std::string* out);

// Creates/truncates `path` and writes `data` (fsynced when `sync`); throws kiln::Error naming
// the path on failure.
void write_file(const std::string& path, std::string_view data, bool sync);

// Writes `data` to a temp file next to `path`, fsyncs it and renames it over `path`: readers see
// the old file or the new one, never a part. Throws kiln::Error naming the path on failure (the
// temp file is removed).
void write_file_atomic(const std::string& path, std::string_view data);

// A file written through a temp file next to `path` and renamed into place by commit(); a
// reader sees the old file or the complete new one. Destroyed without commit() (an error, an
// exception), it removes the temp file. Errors throw kiln::Error starting with `what` and
// naming the path:  "save_safetensors 'w.safetensors': write failed: No space left on device".
class AtomicFile {
 public:
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync, rename over `path`, fsync the directory. The file gets mode 0666 & ~umask.
  void commit();

 private:
  [[noreturn]] void fail_io(const char* what, int err);
  std::string path_, tmp_, what_;
  int fd_ = -1;
  bool committed_ = false;
};

// fsync of a file or directory, best effort (durability, not correctness, depends on it).
void fsync_path(const std::string& path);

// mkdir -p; throws naming the directory and `env_var` (the variable that chose it) on failure.
void make_dirs(const std::string& dir, const char* env_var = "KILN_CACHE_DIR");

// Removes a file, ignoring errors.
void remove_quietly(const std::string& path);

// A name part unique among all threads of all processes on this host: pid.tid.counter.
std::string unique_suffix();

// A string usable as part of a file name: [A-Za-z0-9._-] kept, the rest replaced by '_',
// at most 64 characters, "unit" when empty.
std::string file_safe(const std::string& name);

// Removes files whose name contains ".tmp." and that were last written more than a day ago
// (left behind by processes killed mid-write).
void remove_stale_temps(const std::string& dir);

// $KILN_CACHE_DIR, else ~/.cache/kiln (from $HOME or the password database), else
// /tmp/kiln-cache-<uid>; re-read on every call.
std::string cache_dir();

}  // namespace kiln
