// Scratch files for tests: a fresh directory removed with its contents, and whole-file reads and
// writes in binary.
#pragma once
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::test {

// A fresh directory under $TMPDIR (else /tmp) named `prefix-XXXXXX`; removed, with everything
// in it, when the object goes. `path` is empty when the directory could not be made.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "kiln-test") {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/" + prefix + "-XXXXXX";
    if (mkdtemp(tmpl.data())) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// Sets an environment variable for the object's lifetime, then restores its former value (or
// its absence). Not for tests that run threads reading the environment meanwhile.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) {
      had = true;
      old = v;
    }
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// KILN_DUMP_CODE pointed at a fresh directory `name` under $TMPDIR (else /tmp) for the compiles
// of one test; unset when the object goes (the files stay, for a failing test's message).
struct DumpDir {
  std::string path;
  explicit DumpDir(const std::string& name) {
    const char* t = std::getenv("TMPDIR");
    path = std::string(t && *t ? t : "/tmp") + "/" + name;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    ::setenv("KILN_DUMP_CODE", path.c_str(), 1);
  }
  ~DumpDir() { ::unsetenv("KILN_DUMP_CODE"); }
  DumpDir(const DumpDir&) = delete;
  DumpDir& operator=(const DumpDir&) = delete;
  // How many times `marker` occurs, over every dumped unit.
  int count(const std::string& marker) const {
    int n = 0;
    if (!std::filesystem::exists(path)) return 0;
    for (const auto& f : std::filesystem::directory_iterator(path)) {
      std::ifstream in(f.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) ++n;
    }
    return n;
  }
};

}  // namespace kiln::test
