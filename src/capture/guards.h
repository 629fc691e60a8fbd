// Guards: the conditions under which a compiled entry may replay without re-tracing.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Input guards: count, and per input: defined, dtype, device, sizes and strides. Checking is a
// flat loop of integer comparisons (no allocation, no hashing).
class InputGuards {
 public:
  InputGuards() = default;
  explicit InputGuards(const TensorList& inputs);
  bool check(const TensorList& inputs) const;
  // Why `inputs` fails these guards, in words ("input 0: dim 0 expected 1, got 4"); empty if
  // they pass.
  std::string failure_reason(const TensorList& inputs) const;
  std::vector<std::string> describe() const;

 private:
  struct InputGuard {
    bool defined = false;
    DType dtype{};
    Device device;
    Dims sizes;
    Dims strides;
  };
  std::vector<InputGuard> inputs_;
  // Aliasing: per input, the first earlier input that is the same tensor (-1: none). The
  // tracer maps one tensor passed twice to one graph input, so an entry traced with f(x, x)
  // must not serve f(a, b), nor the reverse.
  std::vector<int> alias_;
};

// Parameter guards: the identity of every parameter/buffer tensor the graph froze and the
// version of its storage. Fast path: when the global mutation epoch has not moved since the
// last successful check, nothing was written anywhere and the check is one comparison.
class ParamGuards {
 public:
  void add(const Tensor& t, std::string name);
  bool check() const;
  std::string failure_reason() const;
  std::vector<std::string> describe() const;
  size_t size() const { return params_.size(); }

 private:
  struct ParamGuard {
    Tensor tensor;  // keeps the identity alive
    uint64_t version;
    std::string name;
  };
  std::vector<ParamGuard> params_;
  // Written by check() on whichever thread calls it (concurrent calls check at once): atomic,
  // relaxed — a plain load and store.
  mutable std::atomic<uint64_t> checked_epoch_{~uint64_t(0)};
};

}  // namespace kiln
