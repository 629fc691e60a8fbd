// Kiln's runtime (libkiln_runtime, CMake target Kiln::runtime): an Executable is a compiled
// graph as data — an arena, a table of base pointers and a flat list of launches — and .npy
// tensor I/O. It depends on Kiln's core and support libraries only: no compiler, no IR, no
// protobuf. Deployment packages (.kiln files, loaded by this library) build on it.
#pragma once

#include "core/tensor.h"
#include "runtime/executable.h"
#include "runtime/npy.h"
