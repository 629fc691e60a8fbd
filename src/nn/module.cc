// Module: registration, traversal, state dicts. See Note [Modules] in module.h.
#include "nn/module.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace kiln::nn {

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

TensorList Module::call(const TensorList&) {
  fail_kind(ErrorKind::NotSupported, "{}: this module does not implement call()", type_name_);
}

void Module::check_new_name(const std::string& name, const char* what) const {
  KILN_CHECK(!name.empty(), "{}: register_{}: the name is empty", type_name_, what);
  KILN_CHECK(name.find('.') == std::string::npos,
             "{}: register_{} '{}': names cannot contain '.' (it separates submodule names)",
             type_name_, what, name);
  auto taken = [&](const auto& list) {
    for (const auto& e : list)
      if (e.first == name) return true;
    return false;
  };
  bool exists = taken(children_);
  for (const auto& s : params_) exists |= s.name == name;
  for (const auto& s : buffers_) exists |= s.name == name;
  KILN_CHECK(!exists, "{}: register_{} '{}': the name is already registered", type_name_, what,
             name);
}

Registration Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name, "parameter");
  KILN_CHECK(t.defined(), "{}: register_parameter '{}': the tensor is undefined", type_name_,
             name);
  params_.push_back({name, t, true});
  return {std::move(t), this, false, params_.size() - 1};
}

Registration Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "buffer");
  KILN_CHECK(t.defined(), "{}: register_buffer '{}': the tensor is undefined", type_name_, name);
  buffers_.push_back({name, t, persistent});
  return {std::move(t), this, true, buffers_.size() - 1};
}

void Module::replace_registered(bool buffer, size_t index, const Tensor& t) {
  std::vector<Slot>& slots = buffer ? buffers_ : params_;
  KILN_ASSERT(index < slots.size());
  slots[index].tensor = t;
  // Compiled functions froze the old tensor: their state guard must look again.
  module_state_epoch().fetch_add(1, std::memory_order_acq_rel);
}

ParamRef& ParamRef::operator=(const Registration& r) {
  Tensor::operator=(r.tensor);
  owner_ = r.owner;
  buffer_ = r.buffer;
  index_ = r.index;
  return *this;
}

ParamRef& ParamRef::operator=(const Tensor& t) {
  if (static_cast<const void*>(&t) == static_cast<const void*>(this)) return *this;
  Tensor::operator=(t);
  if (owner_) owner_->replace_registered(buffer_, index_, t);
  return *this;
}

void Module::add_child(const std::string& name, ModulePtr m) {
  check_new_name(name, "module");
  KILN_CHECK(m != nullptr, "{}: register_module '{}': the module is null", type_name_, name);
  KILN_CHECK(m.get() != this, "{}: register_module '{}': a module cannot contain itself",
             type_name_, name);
  children_.emplace_back(name, std::move(m));
}

void Module::collect(NamedTensors& out, const std::string& prefix, bool params, bool buffers,
                     bool persistent_only, bool recurse) const {
  if (params)
    for (const auto& s : params_)
      if (s.tensor.defined()) out.emplace_back(prefix + s.name, s.tensor);
  if (buffers)
    for (const auto& s : buffers_)
      if (s.tensor.defined() && (s.persistent || !persistent_only))
        out.emplace_back(prefix + s.name, s.tensor);
  if (recurse)
    for (const auto& [name, child] : children_)
      child->collect(out, prefix + name + ".", params, buffers, persistent_only, true);
}

// Drops later entries that share a TensorImpl with an earlier one (tied weights).
static NamedTensors dedup(NamedTensors all) {
  std::unordered_set<const TensorImpl*> seen;
  NamedTensors out;
  out.reserve(all.size());
  for (auto& e : all)
    if (seen.insert(e.second.impl()).second) out.push_back(std::move(e));
  return out;
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect(out, "", true, false, false, recurse);
  return dedup(std::move(out));
}
NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect(out, "", false, true, false, recurse);
  return dedup(std::move(out));
}
TensorList Module::parameters(bool recurse) const {
  TensorList out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}
TensorList Module::buffers(bool recurse) const {
  TensorList out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

NamedModules Module::named_modules(bool include_self) const {
  NamedModules out;
  if (include_self) {
    auto self = weak_from_this().lock();
    KILN_CHECK(self != nullptr,
               "{}: named_modules(include_self=true) needs the module to be owned by a "
               "std::shared_ptr (use std::make_shared)",
               type_name_);
    out.emplace_back("", std::const_pointer_cast<Module>(self));
  }
  std::unordered_set<const Module*> seen{this};
  // Pre-order walk; a module shared by two parents is listed once.
  auto walk = [&](auto& self_fn, const Module& m, const std::string& prefix) -> void {
    for (const auto& [name, child] : m.children_) {
      if (!seen.insert(child.get()).second) continue;
      out.emplace_back(prefix + name, child);
      self_fn(self_fn, *child, prefix + name + ".");
    }
  };
  walk(walk, *this, "");
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::to(Device device) {
  std::vector<Tensor> all = parameters();
  for (const Tensor& b : buffers()) all.push_back(b);
  // Allocate and copy everything first: a failure (out of device memory) changes nothing.
  std::unordered_map<Storage*, Ref<Storage>> moved;  // keys stay alive: `all` holds them
  for (const Tensor& t : all) {
    TensorImpl* impl = t.impl();
    if (!impl->storage || impl->device == device) continue;
    Storage* old = impl->storage.get();
    if (moved.count(old)) continue;
    Tensor whole = Tensor::fake(Dims{int64_t(old->nbytes())}, DType::UInt8, impl->device);
    whole.impl()->storage = impl->storage;
    moved.emplace(old, whole.to(device).impl()->storage);
  }
  for (const Tensor& t : all) {
    TensorImpl* impl = t.impl();
    auto it = impl->storage ? moved.find(impl->storage.get()) : moved.end();
    if (it == moved.end()) continue;
    impl->storage = it->second;
    impl->device = device;
  }
  // Capture guards a parameter by the identity of its impl (unchanged here) and its version:
  // the fresh storage must carry a version above the old one, or a compiled function that froze
  // the old weights would replay on them.
  for (auto& [old, fresh] : moved)
    while (fresh->version() <= old->version()) fresh->bump_version();
}

ModulePtr Module::submodule(const std::string& dotted) const {
  const Module* m = this;
  ModulePtr found;
  size_t start = 0;
  while (start <= dotted.size()) {
    size_t dot = dotted.find('.', start);
    std::string part = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    ModulePtr next;
    for (const auto& [name, child] : m->children_)
      if (name == part) next = child;
    KILN_CHECK(next != nullptr, "{}: no submodule '{}' (at '{}')", type_name_, dotted, part);
    found = next;
    m = next.get();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return found;
}

// Splits "a.b.c" into the owning module of "c" and "c"; null owner when "a.b" does not exist.
static std::pair<const Module*, std::string> owner_of(const Module& root, const std::string& dotted) {
  size_t dot = dotted.rfind('.');
  if (dot == std::string::npos) return {&root, dotted};
  const Module* m = &root;
  size_t start = 0;
  while (start < dot) {
    size_t next = dotted.find('.', start);
    std::string part = dotted.substr(start, next - start);
    const Module* child = nullptr;
    for (const auto& [name, c] : m->named_children())
      if (name == part) child = c.get();
    if (!child) return {nullptr, dotted.substr(0, next)};
    m = child;
    start = next + 1;
  }
  return {m, dotted.substr(dot + 1)};
}

Tensor Module::parameter(const std::string& dotted) const {
  auto [owner, leaf] = owner_of(*this, dotted);
  KILN_CHECK(owner, "{}: no parameter '{}' (no submodule '{}')", type_name_, dotted, leaf);
  for (const auto& s : owner->params_)
    if (s.name == leaf) return s.tensor;
  fail("{}: no parameter '{}'", type_name_, dotted);
}
Tensor Module::buffer(const std::string& dotted) const {
  auto [owner, leaf] = owner_of(*this, dotted);
  KILN_CHECK(owner, "{}: no buffer '{}' (no submodule '{}')", type_name_, dotted, leaf);
  for (const auto& s : owner->buffers_)
    if (s.name == leaf) return s.tensor;
  fail("{}: no buffer '{}'", type_name_, dotted);
}

std::atomic<uint64_t>& module_state_epoch() {
  static std::atomic<uint64_t> epoch{0};
  return epoch;
}

namespace {
void mode_flags(const Module& m, std::string& out) {
  out += m.is_training() ? '1' : '0';
  for (const auto& [name, child] : m.named_children()) mode_flags(*child, out);
}

std::string describe_modes(std::string_view f) {
  size_t on = size_t(std::count(f.begin(), f.end(), '1'));
  if (f.empty()) return "no module";
  if (on == 0) return "eval mode";
  if (on == f.size()) return "training mode";
  return fmt::format("mixed modes ({} of {} modules training)", on, f.size());
}

// "name=address" entries of a fingerprint (after its '|').
std::vector<std::pair<std::string, std::string>> identities(std::string_view f) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t bar = f.find('|');
  if (bar == std::string_view::npos) return out;
  std::string_view rest = f.substr(bar + 1);
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    std::string_view item = rest.substr(0, end);
    size_t eq = item.rfind('=');
    if (eq != std::string_view::npos)
      out.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    if (end == std::string_view::npos) break;
    rest = rest.substr(end + 1);
  }
  return out;
}
}  // namespace

std::string state_fingerprint(const Module& m) {
  std::string out;
  mode_flags(m, out);
  out += '|';
  auto add = [&](const NamedTensors& list) {
    for (const auto& [name, t] : list)
      out += fmt::format("{}={}\n", name, static_cast<const void*>(t.impl()));
  };
  add(m.named_parameters());
  add(m.named_buffers());
  return out;
}

std::string describe_state_change(const std::string& traced, const std::string& now) {
  std::string_view a(traced), b(now);
  std::string_view ma = a.substr(0, a.find('|')), mb = b.substr(0, b.find('|'));
  if (ma != mb)
    return fmt::format("module mode changed: traced with {}, called with {}", describe_modes(ma),
                       describe_modes(mb));
  auto ia = identities(a), ib = identities(b);
  // (pairs by name, not structured bindings: clang 14 cannot capture those in a lambda)
  for (const auto& now_entry : ib) {
    const auto& name = now_entry.first;
    auto it = std::find_if(ia.begin(), ia.end(), [&](const auto& e) { return e.first == name; });
    if (it == ia.end()) return fmt::format("parameter or buffer '{}' was added", name);
    if (it->second != now_entry.second)
      return fmt::format("parameter or buffer '{}' was reassigned (a different tensor)", name);
  }
  for (const auto& traced_entry : ia) {
    const auto& name = traced_entry.first;
    if (std::none_of(ib.begin(), ib.end(), [&](const auto& e) { return e.first == name; }))
      return fmt::format("parameter or buffer '{}' was removed", name);
  }
  return "module state changed";
}

void Module::train(bool on) {
  module_state_epoch().fetch_add(1, std::memory_order_acq_rel);
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

NamedTensors Module::state_dict() const {
  // PyTorch's order: per module its parameters, then its persistent buffers, then children.
  NamedTensors out;
  auto walk = [&](auto& self_fn, const Module& m, const std::string& prefix) -> void {
    m.collect(out, prefix, true, true, true, false);
    for (const auto& [name, child] : m.children_) self_fn(self_fn, *child, prefix + name + ".");
  };
  walk(walk, *this, "");
  return out;
}

// "a, b, c ... and 7 more"
static std::string key_list(const std::vector<std::string>& keys) {
  const size_t shown = 10;
  std::string s;
  for (size_t i = 0; i < keys.size() && i < shown; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > shown) s += fmt::format(" ... and {} more", keys.size() - shown);
  return s;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors mine = state_dict();
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < mine.size(); ++i) index.emplace(mine[i].first, i);

  std::vector<std::string> unexpected, missing, mismatched;
  std::vector<bool> provided(mine.size(), false);
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  for (const auto& [key, src] : state) {
    auto it = index.find(key);
    if (it == index.end()) {
      unexpected.push_back(key);
      continue;
    }
    const Tensor& dst = mine[it->second].second;
    KILN_CHECK(!provided[it->second], "load_state_dict ({}): key '{}' is given twice",
               type_name_, key);
    provided[it->second] = true;
    if (!src.defined() || !src.has_storage()) {
      mismatched.push_back(fmt::format("'{}': the given tensor has no data", key));
      continue;
    }
    if (src.sizes() != dst.sizes() || src.dtype() != dst.dtype()) {
      mismatched.push_back(fmt::format("'{}': checkpoint has {}{}, module has {}{}", key,
                                       dtype_name(src.dtype()), to_string(src.sizes()),
                                       dtype_name(dst.dtype()), to_string(dst.sizes())));
      continue;
    }
    copies.emplace_back(dst, src);
  }
  for (size_t i = 0; i < mine.size(); ++i)
    if (!provided[i]) missing.push_back(mine[i].first);

  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (!mismatched.empty())
    add(fmt::format("size/dtype mismatch for {}", key_list(mismatched)));
  if (strict && !missing.empty())
    add(fmt::format("{} missing key{}: {}", missing.size(), missing.size() == 1 ? "" : "s",
                    key_list(missing)));
  if (strict && !unexpected.empty())
    add(fmt::format("{} unexpected key{}: {}", unexpected.size(),
                    unexpected.size() == 1 ? "" : "s", key_list(unexpected)));
  if (!problems.empty()) fail("load_state_dict ({}): {}", type_name_, problems);

  for (auto& [dst, src] : copies) dst.copy_(src);
}

void Module::save(const std::string& path) const {
  // "format": "pt" lets HuggingFace loaders read the file; the module type is informational.
  save_safetensors(path, state_dict(), {{"format", "pt"}, {"kiln.module", type_name_}});
}

void Module::load(const std::string& path, bool strict) {
  SafetensorsContents contents = load_safetensors(path);
  try {
    load_state_dict(contents.tensors, strict);
  } catch (const Error& e) {
    throw_error(e.kind(), fmt::format("loading '{}': {}", path, e.message()));
  }
}

void Module::check_num_inputs(const TensorList& inputs, size_t min, size_t max) const {
  KILN_CHECK(inputs.size() >= min && inputs.size() <= max,
             "{}: call() expects {} input{}, got {}", type_name_,
             min == max ? std::to_string(min) : fmt::format("{} to {}", min, max),
             max == 1 ? "" : "s", inputs.size());
  for (size_t i = 0; i < min; ++i)
    KILN_CHECK(inputs[i].defined(), "{}: call() input {} is undefined", type_name_, i);
}

std::string Module::str() const {
  std::string out;
  str_into(out, 0);
  return out;
}

void Module::str_into(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (children_.empty()) {
    out += ")";
    return;
  }
  out += "\n";
  for (const auto& [name, child] : children_) {
    out += std::string(size_t(indent + 2), ' ') + "(" + name + "): ";
    child->str_into(out, indent + 2);
    out += "\n";
  }
  out += std::string(size_t(indent), ' ') + ")";
}

TensorList UnaryModule::call(const TensorList& inputs) {
  check_num_inputs(inputs, 1, 1);
  return {forward(inputs[0])};
}

}  // namespace kiln::nn
