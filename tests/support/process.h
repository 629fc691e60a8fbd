// Runs a program in a separate process with exactly the environment given (tests that a
// package runs with no compiler, no Python and no cache directory).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace kiln::test {

// fork + execve of args[0] with `args` and `env` (NAME=value each, nothing else inherited);
// returns the exit status (-1: could not start or was killed; 127: exec failed).
inline int run_with_env(std::vector<std::string> args, std::vector<std::string> env) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    std::vector<char*> av, ev;
    for (std::string& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    for (std::string& e : env) ev.push_back(e.data());
    ev.push_back(nullptr);
    execve(av[0], av.data(), ev.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace kiln::test
