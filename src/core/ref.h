// Ref<T>: an intrusive reference-counted pointer (T derives from RefCounted). One atomic
// counter in the object, no separate control block.
#pragma once
#include <atomic>
#include <utility>

namespace kiln {

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;
  void ref_retain() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  bool ref_release() const { return refs_.fetch_sub(1, std::memory_order_acq_rel) == 1; }
  int ref_count() const { return refs_.load(std::memory_order_relaxed); }

 protected:
  ~RefCounted() = default;

 private:
  mutable std::atomic<int> refs_{0};
};

template <typename T>
class Ref {
 public:
  Ref() = default;
  Ref(std::nullptr_t) {}  // NOLINT
  explicit Ref(T* p) : p_(p) {
    if (p_) p_->ref_retain();
  }
  Ref(const Ref& o) : p_(o.p_) {
    if (p_) p_->ref_retain();
  }
  Ref(Ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  template <typename U>
  Ref(const Ref<U>& o) : Ref(o.get()) {}  // NOLINT
  ~Ref() { reset(); }
  Ref& operator=(Ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  void reset() {
    if (p_ && p_->ref_release()) delete p_;
    p_ = nullptr;
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  friend bool operator==(const Ref& a, const Ref& b) { return a.p_ == b.p_; }

  template <typename... Args>
  static Ref make(Args&&... args) {
    return Ref(new T(std::forward<Args>(args)...));
  }

 private:
  T* p_ = nullptr;
};

}  // namespace kiln
