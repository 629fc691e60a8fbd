// The C++ module API, close to libtorch's C++ frontend. See docs/nn.md.
//
// Note [Modules]
// A Module owns named parameters, named buffers and named submodules, each registered once in
// its constructor (register_parameter / register_buffer / register_module return what they
// registered, so a module keeps its own handles). Tensors are handles (Note [Tensor model]):
// the handle a module keeps and the one in its registry share one TensorImpl, and
// load_state_dict copies into that storage in place, so both stay valid. Names are dotted paths
// through the tree ("layer1.0.conv1.weight") and match torchvision / HuggingFace state_dict
// names for the zoo models, so weights can be exchanged with PyTorch through safetensors.
//
// Every module runs through one generic virtual entry point, call(TensorList) -> TensorList;
// capture and the compiler use it to run any module. Concrete modules also have a typed
// forward(...) that call() delegates to. Modules are held by std::shared_ptr.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/safetensors.h"

namespace kiln::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;

// What register_parameter / register_buffer return: the registered tensor and where it is
// registered. It converts to a Tensor; assigned to a ParamRef it binds the ParamRef to the
// registration.
struct Registration {
  Tensor tensor;
  Module* owner = nullptr;
  bool buffer = false;
  size_t index = 0;
  operator Tensor() const { return tensor; }  // NOLINT(google-explicit-constructor)
};

// A module's own handle on one of its registered parameters or buffers: the type of the
// layers' `weight`, `bias`, `running_mean`, ... members. It is the Tensor it holds (every
// Tensor call works on it). Assigning a tensor to it (`fc->weight = other`) replaces the
// registered tensor: state_dict() and named_parameters() follow, and compiled functions that
// froze the old tensor recompile, because the assignment moves module_state_epoch(). A plain
// `Tensor` member that host code reassigns is invisible to capture (docs/capture.md). A copy of
// a ParamRef is unbound: assigning to the copy changes only the copy.
class ParamRef : public Tensor {
 public:
  ParamRef() = default;
  ParamRef(const ParamRef& other) : Tensor(other) {}
  ParamRef& operator=(const ParamRef& other) { return *this = static_cast<const Tensor&>(other); }
  // Binds this handle to a registration (the idiom `weight = register_parameter(...)`).
  ParamRef& operator=(const Registration& r);
  // Replaces the tensor (and, when bound, the registered one).
  ParamRef& operator=(const Tensor& t);

 private:
  Module* owner_ = nullptr;
  bool buffer_ = false;
  size_t index_ = 0;
};
using NamedModules = std::vector<std::pair<std::string, ModulePtr>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The generic entry point. The default throws NotSupported naming the module type.
  virtual TensorList call(const TensorList& inputs);

  // "Linear", "ResNet", ...
  const std::string& type_name() const { return type_name_; }

  // ---- registration (names: non-empty, no '.', unique within the module) ----
  Registration register_parameter(const std::string& name, Tensor t);
  // Non-persistent buffers are not part of state_dict() (PyTorch's persistent=False).
  Registration register_buffer(const std::string& name, Tensor t, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // ---- traversal (pre-order: a module's own entries, then its children's, dotted names) ----
  // Tensors shared between modules (tied weights) appear once, under their first name.
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  TensorList parameters(bool recurse = true) const;
  TensorList buffers(bool recurse = true) const;
  NamedModules named_children() const { return children_; }
  // All descendants; with include_self, this module first under the name "" (it must then be
  // owned by a shared_ptr).
  NamedModules named_modules(bool include_self = true) const;
  // Total number of parameter elements.
  int64_t num_parameters() const;

  // Lookup by dotted name; throws naming the path when absent.
  Tensor parameter(const std::string& dotted_name) const;
  Tensor buffer(const std::string& dotted_name) const;
  ModulePtr submodule(const std::string& dotted_name) const;

  // ---- mode (recursive). Modules start in training mode, as in PyTorch. Every call moves
  // module_state_epoch(), which compiled modules use to guard on the mode. ----
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // ---- device ----
  // Moves every parameter and buffer (recursively) to `device` in place, like PyTorch's
  // module.to(device): the tensors keep their identity (handles held elsewhere, such as a
  // layer's `weight` member, see the move), storages shared by several tensors (tied weights,
  // views) move once and stay shared, and each moved storage starts a new version, so compiled
  // functions that froze the old weights recompile instead of reading them.
  void to(Device device);

  // ---- weights ----
  // Parameters and persistent buffers, PyTorch's order.
  NamedTensors state_dict() const;
  // Copies into the registered tensors in place. Every key is checked before anything is
  // copied (a failed load changes nothing). strict: missing and unexpected keys are errors;
  // a shape or dtype mismatch is always an error. Errors name the keys and both shapes.
  void load_state_dict(const NamedTensors& state, bool strict = true);
  // state_dict() through safetensors (atomic write; see nn/safetensors.h).
  void save(const std::string& path) const;
  void load(const std::string& path, bool strict = true);

  // The module tree, one module per line (like printing a torch.nn.Module).
  std::string str() const;

 protected:
  // For call(): throws naming the module unless min <= inputs.size() <= max and the first `min`
  // inputs are defined.
  void check_num_inputs(const TensorList& inputs, size_t min, size_t max) const;
  // Extra text inside the parentheses of str() ("in_features=10, out_features=50").
  virtual std::string extra_repr() const { return ""; }

 private:
  struct Slot {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };
  friend class ParamRef;
  void replace_registered(bool buffer, size_t index, const Tensor& t);
  void add_child(const std::string& name, ModulePtr m);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(NamedTensors& out, const std::string& prefix, bool params, bool buffers,
               bool persistent_only, bool recurse) const;
  void str_into(std::string& out, int indent) const;

  std::string type_name_;
  std::vector<Slot> params_;
  std::vector<Slot> buffers_;
  NamedModules children_;
  bool training_ = true;
};

// Moves whenever any module's train()/eval() runs or a ParamRef is reassigned (compiled
// modules guard on it: while it stands still, nothing a module guard reads has changed).
std::atomic<uint64_t>& module_state_epoch();
// The host state of `m` that compiled modules guard on, as one string: the training flags of
// `m` and its submodules in pre-order ('1' / '0' per module), then the identity of every
// registered parameter and buffer by name.
std::string state_fingerprint(const Module& m);
// What changed between two fingerprints, in words: "module mode changed: traced with eval
// mode, called with training mode" (modes: "eval mode", "training mode", "mixed modes (k of n
// modules training)"), or "parameter 'fc.weight' was reassigned (a different tensor)".
std::string describe_state_change(const std::string& traced, const std::string& now);

// A module with one input and one output: forward(x), and call() delegating to it.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  TensorList call(const TensorList& inputs) override;
};

}  // namespace kiln::nn
