#include "kernels/cuda/library_warm_up.h"

#include <utility>

#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cudnn_conv.h"

namespace kiln::cuda {

void LibraryWarmUp::start(int device, bool dnn, std::vector<DType> gemm) {
  join();
  if (dnn) dnn_ = std::thread([device] { cudnn_warm_up(device); });
  if (!gemm.empty())
    gemm_ = std::thread([device, gemm = std::move(gemm)] {
      for (DType d : gemm) cublaslt_warm_up(device, d);
    });
}

void LibraryWarmUp::join() {
  if (dnn_.joinable()) dnn_.join();
  if (gemm_.joinable()) gemm_.join();
}

}  // namespace kiln::cuda
