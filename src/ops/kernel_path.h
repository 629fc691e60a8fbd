// Which kernel eager dispatch ran. See Note [Kernel paths].
//
// Note [Kernel paths]
// An eager kernel may choose between implementations (oneDNN, a float32 vector loop, the
// reference kernel for dtypes and layouts it has no fast path for). It names the one it took
// with note_kernel_path("onednn") (a string literal); call_op records, per thread, the path of
// the last op it ran: the kernel's note, else "reference" when the record's reference kernel
// ran (no eager_cpu), "decomposition" for a decomposition-only op, or "eager_cpu" /
// "eager_cuda" for an eager kernel that named no path. Nested calls (a kernel that calls ops)
// do not overwrite their caller's note. The op harness reports the path of every case and
// checks results of the reference path against an independent computation (Note [Op harness]).
// The cost is two thread-local stores per call.
#pragma once

namespace kiln {

// Called by an eager kernel for the path it takes in this call.
void note_kernel_path(const char* path);
// The path of the last op call_op completed on this thread ("" before any).
const char* last_kernel_path();

}  // namespace kiln
