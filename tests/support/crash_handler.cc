// Linked into every test binary: a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT)
// prints the signal and a backtrace to stderr before the process dies with the same signal, so
// a crash on a machine without a debugger (the GPU machine) still says where it happened.
// Only async-signal-safe calls in the handler: write(2), backtrace(3) (its first call is made
// at start-up, outside a handler, so that it never loads libgcc while handling), signal, raise.
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <initializer_list>

namespace {

void on_fatal(int sig) {
  const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
                     : sig == SIGILL ? "SIGILL" : "SIGABRT";
  const char head[] = "\n*** kiln test: fatal signal ";
  (void)!write(STDERR_FILENO, head, sizeof head - 1);
  (void)!write(STDERR_FILENO, name, strlen(name));
  (void)!write(STDERR_FILENO, "; backtrace:\n", 13);
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

struct Install {
  Install() {
    void* warm[1];
    backtrace(warm, 1);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, on_fatal);
  }
} install;

}  // namespace
