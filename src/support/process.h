// Starting tools (the C++ compiler, `--version` probes) without a shell: posix_spawn from an
// argv vector, so nothing is quoted or interpreted.
#pragma once
#include <string>
#include <vector>

namespace kiln {

// Runs argv (argv[0] an absolute path) with stdin from `stdin_path` and stdout + stderr into
// `output_path`; returns the wait status. A program that cannot be started throws kiln::Error
// naming it, followed by `hint` ("set KILN_CXX to a working C++ compiler").
int run_to_file(const std::vector<std::string>& argv, const std::string& stdin_path,
                const std::string& output_path, const std::string& hint);

// Runs argv with stdin and stderr on /dev/null and returns its stdout; *status gets the wait
// status. Throws like run_to_file when it cannot be started.
std::string run_capture_stdout(const std::vector<std::string>& argv, int* status,
                               const std::string& hint);

// "exited with status 1", "was killed by signal 9", ...
std::string describe_status(int status);

// `name` itself when it contains a '/', else the first PATH entry holding an executable `name`;
// an absolute, normalized path, or "" when there is none.
std::string find_program(const std::string& name);

}  // namespace kiln
