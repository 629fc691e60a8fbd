// Note [Executable]
// A compiled graph runs as: bind the input pointers into the slot table, call each launch in
// order, copy the outputs out. Everything else — kernel addresses, arena offsets, oneDNN
// primitives with their prepacked weights, the eager kernels' prebuilt argument lists — was
// resolved at compile time, so a steady-state call does no heap allocation, no hash lookup and
// no dispatch beyond one indirect call per launch. The arena is owned by the executable: calls
// on one executable must not overlap (capture serializes them).
#include "runtime/executable.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace kiln {

namespace {
thread_local Executable::LaunchTimer* t_timer = nullptr;
}  // namespace

Executable::LaunchTimer* Executable::set_launch_timer(LaunchTimer* t) {
  LaunchTimer* prev = t_timer;
  t_timer = t;
  return prev;
}

std::shared_ptr<char> allocate_host_arena(int64_t arena_bytes) {
  size_t bytes = size_t((arena_bytes + 63) / 64 * 64);
  if (bytes == 0) bytes = 64;
  char* p = static_cast<char*>(std::aligned_alloc(64, bytes));
  if (!p)
    throw_error(ErrorKind::Runtime,
                fmt::format("executable: cannot allocate the {}-byte arena", arena_bytes));
  std::memset(p, 0, bytes);
  return std::shared_ptr<char>(p, [](char* q) { std::free(q); });
}

void Executable::init(std::shared_ptr<char> arena, int64_t arena_bytes, int num_slots) {
  KILN_ASSERT(arena);
  arena_bytes_ = arena_bytes;
  arena_owner_ = std::move(arena);
  arena_ = arena_owner_.get();
  slots_.assign(size_t(num_slots), nullptr);
  slots_[0] = arena_;
}

void Executable::run(const Tensor* in, size_t num_inputs, Tensor* out, size_t num_outputs) {
  if (num_inputs != inputs.size())
    fail("compiled graph: expected {} inputs, got {}", inputs.size(), num_inputs);
  if (num_outputs != outputs.size())
    fail("compiled graph: expected {} outputs, got {}", outputs.size(), num_outputs);
  // Non-contiguous inputs are copied (kept alive for the call by this array's scope).
  Tensor staged[8];
  Tensor* heap_staged = nullptr;
  std::unique_ptr<Tensor[]> heap_owner;
  if (num_inputs > 8) {
    heap_owner.reset(new Tensor[num_inputs]);
    heap_staged = heap_owner.get();
  }
  const Tensor* args = in;
  for (size_t i = 0; i < num_inputs; ++i) {
    const InputSpec& s = inputs[i];
    const Tensor& t = in[i];
    if (!t.defined() || t.dtype() != s.dtype || t.sizes() != s.sizes || !t.device().is_cpu())
      fail("compiled graph: input {} ('{}') expected a cpu {} tensor of shape {}, got {}", i,
           s.name, dtype_name(s.dtype), to_string(s.sizes),
           t.defined() ? fmt::format("{} {} on {}", dtype_name(t.dtype()), to_string(t.sizes()),
                                     t.device().str())
                       : std::string("an undefined tensor"));
    const Tensor* use = &t;
    if (!t.is_contiguous()) {
      Tensor* st = heap_staged ? heap_staged : staged;
      st[i] = t.contiguous();
      use = &st[i];
      args = st;  // eager launches see the staged copies
    }
    slots_[size_t(s.slot)] = static_cast<char*>(use->raw_data());
  }
  if (args != in)
    for (size_t i = 0; i < num_inputs; ++i) {
      Tensor* st = heap_staged ? heap_staged : staged;
      if (!st[i].defined()) st[i] = in[i];
    }
  char* const* b = slots_.data();
  if (t_timer) {
    for (const Launch& l : launches) {
      t_timer->launch_begin(l);
      l.fn(l.state, b, args);
      t_timer->launch_end(l);
    }
  } else {
    for (const Launch& l : launches) l.fn(l.state, b, args);
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    const OutputSpec& o = outputs[i];
    Tensor& t = out[i];
    if (!t.defined() || t.dtype() != o.dtype || t.sizes() != o.sizes)
      fail("compiled graph: output {} expected a {} tensor of shape {}", i, dtype_name(o.dtype),
           to_string(o.sizes));
    const char* src = b[o.slot] + o.byte_offset;
    if (!o.strides.empty()) {
      Tensor base = Tensor::from_blob(const_cast<char*>(src), o.base_sizes, o.dtype);
      t.copy_(base.as_strided(o.sizes, o.strides, o.view_offset));
    } else if (t.is_contiguous()) {
      std::memcpy(t.raw_data(), src, t.nbytes());
    } else {
      Tensor view = Tensor::from_blob(const_cast<char*>(src), o.sizes, o.dtype);
      t.copy_(view);
    }
  }
}

TensorList Executable::run(const TensorList& in) {
  TensorList out;
  out.reserve(outputs.size());
  for (const OutputSpec& o : outputs) out.push_back(Tensor::empty(o.sizes, o.dtype));
  run(in.data(), in.size(), out.data(), out.size());
  return out;
}

}  // namespace kiln
