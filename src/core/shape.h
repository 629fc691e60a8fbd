// Fixed-capacity dimension vectors. Kiln supports tensors of rank <= kMaxRank (as TensorRT
// does); with the dims inline, shapes never touch the heap and copy as plain memory.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/symint.h"

namespace kiln {

inline constexpr int kMaxRank = 8;

[[noreturn]] void throw_rank_error(size_t rank);

template <typename T>
class DimVec {
 public:
  DimVec() = default;
  DimVec(std::initializer_list<T> v) { assign(v.begin(), v.end()); }
  explicit DimVec(std::span<const T> v) { assign(v.begin(), v.end()); }
  template <typename It>
  DimVec(It b, It e) { assign(b, e); }
  DimVec(size_t n, T fill) {
    resize(n);
    for (size_t i = 0; i < n; ++i) d_[i] = fill;
  }

  template <typename It>
  void assign(It b, It e) {
    rank_ = 0;
    for (; b != e; ++b) push_back(T(*b));
  }
  void push_back(T v) {
    if (rank_ >= kMaxRank) [[unlikely]] throw_rank_error(rank_ + 1);
    d_[rank_++] = v;
  }
  void insert(size_t pos, T v) {
    push_back(v);
    for (size_t i = rank_ - 1; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
  }
  void erase(size_t pos) {
    for (size_t i = pos; i + 1 < rank_; ++i) d_[i] = d_[i + 1];
    --rank_;
  }
  void pop_back() { --rank_; }
  void resize(size_t n) {
    if (n > size_t(kMaxRank)) [[unlikely]] throw_rank_error(n);
    for (size_t i = rank_; i < n; ++i) d_[i] = T(0);
    rank_ = uint8_t(n);
  }
  void clear() { rank_ = 0; }

  size_t size() const { return rank_; }
  int rank() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  T& operator[](size_t i) { return d_[i]; }
  const T& operator[](size_t i) const { return d_[i]; }
  T& back() { return d_[rank_ - 1]; }
  const T& back() const { return d_[rank_ - 1]; }
  T* begin() { return d_; }
  T* end() { return d_ + rank_; }
  const T* begin() const { return d_; }
  const T* end() const { return d_ + rank_; }
  const T* data() const { return d_; }
  T* data() { return d_; }
  std::span<const T> span() const { return {d_, rank_}; }

  friend bool operator==(const DimVec& a, const DimVec& b) {
    if (a.rank_ != b.rank_) return false;
    for (size_t i = 0; i < a.rank_; ++i)
      if (!(a.d_[i] == b.d_[i])) return false;
    return true;
  }
  friend bool operator!=(const DimVec& a, const DimVec& b) { return !(a == b); }

 private:
  T d_[kMaxRank]{};
  uint8_t rank_ = 0;
};

using Dims = DimVec<int64_t>;   // concrete sizes or strides (runtime tensors)
using Shape = DimVec<SymInt>;   // possibly symbolic sizes (IR types, inference)

Shape to_shape(const Dims& d);
// Converts to concrete dims; throws naming `what` if any dim is symbolic.
Dims to_dims(const Shape& s, const char* what = "shape");
bool is_concrete(const Shape& s);

int64_t numel(const Dims& d);
SymInt numel(const Shape& s);
Dims contiguous_strides(const Dims& sizes);

std::string to_string(const Dims& d);   // "[1, 3, 224, 224]"
std::string to_string(const Shape& s);  // "[batch, 3, 224, 224]"

// Normalizes a possibly negative axis against rank; throws naming `what` when out of range.
int normalize_axis(int64_t axis, int rank, const char* what = "axis");

// NumPy broadcasting of two shapes; throws naming both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace kiln
