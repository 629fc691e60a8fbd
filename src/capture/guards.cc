#include "capture/guards.h"

#include <fmt/format.h>

namespace kiln {

namespace {
// The first input before i that is the same tensor as input i, or -1.
int alias_of(const TensorList& inputs, size_t i) {
  if (!inputs[i].defined()) return -1;
  const TensorImpl* impl = inputs[i].impl();
  for (size_t j = 0; j < i; ++j)
    if (inputs[j].defined() && inputs[j].impl() == impl) return int(j);
  return -1;
}
}  // namespace

InputGuards::InputGuards(const TensorList& inputs) {
  inputs_.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    InputGuard g;
    g.defined = t.defined();
    if (g.defined) {
      g.dtype = t.dtype();
      g.device = t.device();
      g.sizes = t.sizes();
      g.strides = t.strides();
    }
    inputs_.push_back(g);
  }
  for (size_t i = 0; i < inputs.size(); ++i) alias_.push_back(alias_of(inputs, i));
}

bool InputGuards::check(const TensorList& inputs) const {
  if (inputs.size() != inputs_.size()) return false;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputGuard& g = inputs_[i];
    const Tensor& t = inputs[i];
    if (t.defined() != g.defined) return false;
    if (!g.defined) continue;
    const TensorImpl* impl = t.impl();
    if (impl->dtype != g.dtype || impl->device != g.device || impl->sizes != g.sizes ||
        impl->strides != g.strides)
      return false;
    if (alias_of(inputs, i) != alias_[i]) return false;
  }
  return true;
}

std::string InputGuards::failure_reason(const TensorList& inputs) const {
  if (inputs.size() != inputs_.size())
    return fmt::format("input count expected {}, got {}", inputs_.size(), inputs.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputGuard& g = inputs_[i];
    const Tensor& t = inputs[i];
    if (t.defined() != g.defined)
      return fmt::format("input {}: expected {}, got {}", i, g.defined ? "a tensor" : "none",
                         t.defined() ? "a tensor" : "none");
    if (!g.defined) continue;
    if (t.dtype() != g.dtype)
      return fmt::format("input {}: dtype expected {}, got {}", i, dtype_name(g.dtype),
                         dtype_name(t.dtype()));
    if (t.device() != g.device)
      return fmt::format("input {}: device expected {}, got {}", i, g.device.str(),
                         t.device().str());
    if (t.sizes().size() != g.sizes.size())
      return fmt::format("input {}: rank expected {}, got {}", i, g.sizes.size(), t.dim());
    for (size_t d = 0; d < g.sizes.size(); ++d)
      if (t.sizes()[d] != g.sizes[d])
        return fmt::format("input {}: dim {} expected {}, got {}", i, d, g.sizes[d], t.sizes()[d]);
    if (t.strides() != g.strides)
      return fmt::format("input {}: strides expected {}, got {}{}", i, to_string(g.strides),
                         to_string(t.strides()), t.is_contiguous() ? "" : " (non-contiguous)");
    int a = alias_of(inputs, i);
    if (a != alias_[i]) {
      if (alias_[i] >= 0)
        return fmt::format("input {}: traced as the same tensor as input {}, got a distinct one", i,
                           alias_[i]);
      return fmt::format("input {}: the same tensor as input {}, traced with distinct tensors", i, a);
    }
  }
  return "";
}

std::vector<std::string> InputGuards::describe() const {
  std::vector<std::string> out;
  out.push_back(fmt::format("len(inputs) == {}", inputs_.size()));
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputGuard& g = inputs_[i];
    if (!g.defined) {
      out.push_back(fmt::format("input {} is none", i));
      continue;
    }
    out.push_back(fmt::format("input {}: dtype == {}, device == {}, shape == {}, strides == {}", i,
                              dtype_name(g.dtype), g.device.str(), to_string(g.sizes),
                              to_string(g.strides)));
    out.push_back(alias_[i] >= 0 ? fmt::format("input {} is input {}", i, alias_[i])
                                 : fmt::format("input {} is no earlier input", i));
  }
  return out;
}

void ParamGuards::add(const Tensor& t, std::string name) {
  params_.push_back({t, t.version(), std::move(name)});
  checked_epoch_.store(~uint64_t(0), std::memory_order_relaxed);
}

bool ParamGuards::check() const {
  uint64_t epoch = global_mutation_epoch();
  if (epoch == checked_epoch_.load(std::memory_order_relaxed)) [[likely]] return true;
  for (const ParamGuard& p : params_)
    if (p.tensor.version() != p.version) return false;
  checked_epoch_.store(epoch, std::memory_order_relaxed);
  return true;
}

std::string ParamGuards::failure_reason() const {
  for (const ParamGuard& p : params_)
    if (p.tensor.version() != p.version)
      return fmt::format("parameter '{}' was modified (version {} -> {})", p.name, p.version,
                         p.tensor.version());
  return "";
}

std::vector<std::string> ParamGuards::describe() const {
  std::vector<std::string> out;
  if (params_.empty()) return out;
  std::string names;
  for (size_t i = 0; i < params_.size() && i < 4; ++i) names += (i ? ", " : "") + params_[i].name;
  if (params_.size() > 4) names += ", ...";
  out.push_back(fmt::format("{} parameters/buffers unchanged (identity and version): {}",
                            params_.size(), names));
  return out;
}

}  // namespace kiln
