#include "support/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "support/files.h"

extern char** environ;

namespace kiln {

namespace fs = std::filesystem;

namespace {

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

bool is_executable_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

std::string describe_status(int status) {
  if (status == -1) return "could not be waited for";
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("ended with wait status {}", status);
}

int run_to_file(const std::vector<std::string>& argv, const std::string& stdin_path,
                const std::string& output_path, const std::string& hint) {
  SpawnFileActions actions;
  posix_spawn_file_actions_addopen(&actions.fa, 0, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions.fa, 2, output_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions.fa, 2, 1);
  std::vector<char*> args = c_argv(argv);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions.fa, nullptr, args.data(), environ);
  if (rc != 0)
    fail_kind(ErrorKind::Runtime, "cannot start '{}': {} ({})", argv[0], errno_text(rc), hint);
  return wait_for(pid);
}

std::string run_capture_stdout(const std::vector<std::string>& argv, int* status,
                               const std::string& hint) {
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
    fail_kind(ErrorKind::Runtime, "cannot start '{}': {} ({})", argv[0], errno_text(rc), hint);
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

}  // namespace kiln
