// Opening cuDNN and cuBLASLt ahead of their first plan, on threads of their own.
#pragma once

#include <thread>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda {

// Note [CUDA libraries opened ahead]
// The first cuDNN plan of a process pays for opening cuDNN and making its handle (cudnnCreate:
// 120 ms on an H100, 2026-12-05), and the first cuBLASLt plan for opening cuBLASLt (a 540 MB
// library), making its handle and cuBLASLt's first query for each data type (60-120 ms each,
// measured by a probe: cublasLtMatmulAlgoGetIds, or whichever query comes first). None of it
// depends on the plans, so it can start before they are known: a package load starts it while
// it verifies and uploads the weights (runtime/package.cc), a CUDA compile before its passes
// (targets/cuda/target.cc). Two threads, one per library; the plans, built later, find the
// handles made (both libraries' handle tables are locked, so a plan that comes first waits for
// the handle rather than making a second). Errors are swallowed: the plans report them.
class LibraryWarmUp {
 public:
  LibraryWarmUp() = default;
  LibraryWarmUp(const LibraryWarmUp&) = delete;
  LibraryWarmUp& operator=(const LibraryWarmUp&) = delete;
  ~LibraryWarmUp() { join(); }
  // Opens cuDNN if `dnn`, and cuBLASLt with a first query for each of `gemm`, on `device`.
  void start(int device, bool dnn, std::vector<DType> gemm);
  void join();

 private:
  std::thread dnn_, gemm_;
};

}  // namespace kiln::cuda
