// kiln._kiln: the nanobind extension. Bindings over bridge.h (Note [The bridge]) and the per-call
// path of compiled graphs (Note [The call path]). Nothing here includes a Kiln header.
//
// Note [The call path]
// A call of a compiled graph from Python (Runner.__call__) does, in C++:
//   1. frozen-parameter guards: for each parameter frozen into the graph, the argument at its
//      position must be the very object that was frozen and its `_version` (torch's in-place
//      write counter) must be unchanged; otherwise the call returns None and the Python side
//      re-freezes and recompiles (docs/python.md, "Parameters");
//   2. every other argument is viewed through DLPack (nb::ndarray: no copy) and checked against
//      the graph input's dtype, shape and device, an error naming the input otherwise;
//   3. the graph runs with outputs Kiln allocates, handed to torch (or NumPy) through DLPack
//      with an owner that keeps Kiln's buffer alive: no copy either.
// The GIL stays held: a compiled graph owns one arena, so calls into it must not overlap.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bridge.h"

namespace nb = nanobind;
using namespace kiln_py;

namespace {

PyObject* g_kiln_error = nullptr;         // kiln.KilnError(RuntimeError)
PyObject* g_unsupported_error = nullptr;  // kiln.UnsupportedError(KilnError)
PyObject* g_input_error = nullptr;        // kiln.InputError(KilnError, ValueError)

[[noreturn]] void raise_input_error(const std::string& msg) {
  PyErr_SetString(g_input_error, msg.c_str());
  throw nb::python_error();
}

const char* dl_name(DLType t) {
  switch (t.code) {
    case 0: return t.bits == 64 ? "int64" : t.bits == 32 ? "int32" : t.bits == 16 ? "int16" : t.bits == 8 ? "int8" : "int?";
    case 1: return t.bits == 8 ? "uint8" : t.bits == 16 ? "uint16" : t.bits == 32 ? "uint32" : t.bits == 64 ? "uint64" : "uint?";
    case 2: return t.bits == 32 ? "float32" : t.bits == 64 ? "float64" : t.bits == 16 ? "float16" : "float?";
    case 4: return "bfloat16";
    case 5: return "complex";
    case 6: return "bool";
  }
  return "unknown";
}

std::string device_str(int type, int id) {
  if (type == kDeviceCPU) return "cpu";
  if (type == kDeviceCUDA) return "cuda:" + std::to_string(id);
  return "device type " + std::to_string(type);
}

std::string shape_str(const int64_t* s, int n) {
  std::string out = "[";
  for (int i = 0; i < n; ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// ---- DLPack's C exchange API (DLPack 1.3: `type.__dlpack_c_exchange_api__`) ---------------
// torch >= 2.10 publishes, on torch.Tensor, a capsule "dlpack_exchange_api" holding C functions
// that describe a tensor as a DLTensor and wrap a DLManagedTensorVersioned as a torch tensor
// without going through Python (`__dlpack__()` + `torch.from_dlpack` cost ~10 us per tensor;
// these cost well under one). The structs below follow the DLPack specification's C ABI; only
// the fields used here are named. Where the API is absent (older torch), the nb::ndarray path
// (`__dlpack__`) is used instead.
struct DLDeviceABI {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataTypeABI {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensorABI {
  void* data;
  DLDeviceABI device;
  int32_t ndim;
  DLDataTypeABI dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLVersionABI {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedVersionedABI {
  DLVersionABI version;
  void* manager_ctx;
  void (*deleter)(DLManagedVersionedABI* self);
  uint64_t flags;
  DLTensorABI dl_tensor;
};
struct ExchangeHeaderABI {
  DLVersionABI version;
  ExchangeHeaderABI* prev_api;
};
struct ExchangeABI {
  ExchangeHeaderABI header;
  int (*managed_tensor_allocator)(DLTensorABI*, DLManagedVersionedABI**, void*,
                                  void (*)(void*, const char*, const char*));
  int (*managed_tensor_from_py_object_no_sync)(void*, DLManagedVersionedABI**);
  int (*managed_tensor_to_py_object_no_sync)(DLManagedVersionedABI*, void**);
  int (*dltensor_from_py_object_no_sync)(void*, DLTensorABI*);
  int (*current_work_stream)(int32_t, int32_t, void**);
};

// The exchange API of a Python type, or nullptr; cached for the last type seen.
const ExchangeABI* exchange_api_of(PyTypeObject* tp) {
  static PyTypeObject* cached_type = nullptr;
  static const ExchangeABI* cached_api = nullptr;
  if (tp == cached_type) return cached_api;
  const ExchangeABI* api = nullptr;
  PyObject* cap = PyObject_GetAttrString(reinterpret_cast<PyObject*>(tp), "__dlpack_c_exchange_api__");
  if (cap && PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
    auto* a = static_cast<const ExchangeABI*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
    if (a && a->header.version.major == 1 && a->dltensor_from_py_object_no_sync &&
        a->managed_tensor_to_py_object_no_sync)
      api = a;  // the capsule lives on the type, as long as the type does
  }
  Py_XDECREF(cap);
  PyErr_Clear();
  Py_INCREF(tp);  // keeps the cached type (and its capsule) alive
  if (cached_type) Py_DECREF(cached_type);
  cached_type = tp;
  cached_api = api;
  return api;
}

// torch.Tensor's exchange API, for creating torch outputs (set by kiln.dynamo / kiln.aot).
const ExchangeABI* g_torch_api = nullptr;

// Views `obj` (a torch tensor, NumPy array, anything with __dlpack__ or the buffer protocol)
// without copying. A torch tensor that requires grad refuses DLPack export: its detached alias
// (same memory) is used. Returns false when `obj` is not an array at all.
bool view_array(nb::handle obj, nb::ndarray<>& holder, TensorRef& ref) {
  if (const ExchangeABI* api = exchange_api_of(Py_TYPE(obj.ptr()))) {
    DLTensorABI t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) == 0 && t.dtype.lanes == 1) {
      ref.data = static_cast<char*>(t.data) + t.byte_offset;
      ref.dtype = DLType{t.dtype.code, t.dtype.bits};
      ref.ndim = t.ndim;
      ref.shape = t.shape;
      ref.strides = t.strides;
      ref.device_type = t.device.device_type;
      ref.device_id = t.device.device_id;
      return true;
    }
    PyErr_Clear();  // e.g. a tensor that requires grad: the path below detaches it
  }
  if (!nb::try_cast(obj, holder, false)) {
    PyErr_Clear();
    if (!nb::hasattr(obj, "detach")) return false;
    nb::object detached = obj.attr("detach")();
    if (!nb::try_cast(detached, holder, false)) return false;
  }
  if (holder.dtype().lanes != 1) return false;
  ref.data = holder.data();
  ref.dtype = DLType{holder.dtype().code, holder.dtype().bits};
  ref.ndim = int32_t(holder.ndim());
  ref.shape = holder.shape_ptr();
  ref.strides = holder.stride_ptr();
  ref.device_type = holder.device_type();
  ref.device_id = holder.device_id();
  return true;
}

std::string describe(const TensorRef& r) {
  return std::string(dl_name(r.dtype)) + " tensor of shape " + shape_str(r.shape, r.ndim) +
         " on " + device_str(r.device_type, r.device_id);
}

std::string spec_str(const TensorSpec& s) {
  return s.text + (s.device_type == kDeviceCPU ? " on cpu" : "");
}

// Checks one argument against a graph input; the error names the input by position and name.
void check_input(const TensorRef& r, const TensorSpec& s, size_t index) {
  bool ok = r.dtype == s.dl && size_t(r.ndim) == s.shape.size() &&
            r.device_type == s.device_type && (r.device_type == kDeviceCPU || r.device_id == s.device_id);
  for (size_t d = 0; ok && d < s.shape.size(); ++d) ok = s.shape[d] < 0 || s.shape[d] == r.shape[d];
  if (ok) {
    if (r.strides)
      for (int d = 0; d < r.ndim; ++d)
        if (r.strides[d] < 0)
          raise_input_error("input " + std::to_string(index) + " ('" + s.name +
                            "'): negative strides are not supported; pass a contiguous copy");
    return;
  }
  raise_input_error("input " + std::to_string(index) + " ('" + s.name + "'): expected " +
                    spec_str(s) + ", got a " + describe(r));
}

enum Framework : int { kTorch = 0, kNumpy = 1 };

// Hands a Kiln-allocated tensor to torch or NumPy (a view; the capsule owns Kiln's buffer).
nb::object export_tensor(OwnedTensor&& t, int framework) {
  auto* owner = new std::shared_ptr<void>(std::move(t.owner));
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
  nb::dlpack::dtype dt{t.dtype.code, t.dtype.bits, 1};
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  if (framework == kNumpy) {
    if (t.device_type != kDeviceCPU)
      throw Error("InvalidArgument", "a CUDA output cannot become a NumPy array; pass torch tensors");
    nb::ndarray<nb::numpy> a(t.data, shape.size(), shape.data(), cap, t.strides.data(), dt,
                             t.device_type, t.device_id);
    return nb::cast(a, nb::rv_policy::reference);
  }
  if (g_torch_api) {
    // A DLManagedTensorVersioned that owns Kiln's buffer; torch calls its deleter.
    struct Managed {
      DLManagedVersionedABI mt;
      std::vector<int64_t> shape, strides;
      std::shared_ptr<void> owner;
    };
    auto* m = new Managed{{}, std::move(t.shape), std::move(t.strides), std::move(*owner)};
    cap.release().dec_ref();  // (its owner moved into `m`)
    m->mt.version = {1, 0};
    m->mt.manager_ctx = m;
    m->mt.deleter = [](DLManagedVersionedABI* self) { delete static_cast<Managed*>(self->manager_ctx); };
    m->mt.flags = 0;
    m->mt.dl_tensor = {t.data, {t.device_type, t.device_id}, int32_t(m->shape.size()),
                       {t.dtype.code, t.dtype.bits, 1}, m->shape.data(), m->strides.data(), 0};
    void* out = nullptr;
    if (g_torch_api->managed_tensor_to_py_object_no_sync(&m->mt, &out) != 0) {
      m->mt.deleter(&m->mt);
      throw nb::python_error();
    }
    return nb::steal(static_cast<PyObject*>(out));
  }
  nb::ndarray<nb::pytorch> a(t.data, shape.size(), shape.data(), cap, t.strides.data(), dt,
                             t.device_type, t.device_id);
  return nb::cast(a, nb::rv_policy::reference);
}

// Arguments viewed for one call: fixed storage for small graphs, no allocation per call.
struct ArgViews {
  static constexpr size_t kInline = 16;
  nb::ndarray<> inline_holders[kInline];
  TensorRef inline_refs[kInline];
  std::vector<nb::ndarray<>> heap_holders;
  std::vector<TensorRef> heap_refs;
  nb::ndarray<>* holders;
  TensorRef* refs;
  explicit ArgViews(size_t n) {
    if (n <= kInline) {
      holders = inline_holders;
      refs = inline_refs;
    } else {
      heap_holders.resize(n);
      heap_refs.resize(n);
      holders = heap_holders.data();
      refs = heap_refs.data();
    }
  }
};

// A compiled graph bound to a calling convention: which call arguments feed which graph input,
// and which arguments are frozen parameters (guarded by identity and version).
class Runner {
 public:
  Runner(std::shared_ptr<CompiledGraph> graph, std::vector<int> input_args,
         std::vector<std::pair<int, nb::object>> frozen)
      : graph_(std::move(graph)), input_args_(std::move(input_args)) {
    if (input_args_.size() != graph_->inputs().size())
      throw Error("InvalidArgument", "Runner: " + std::to_string(input_args_.size()) +
                                         " argument positions for " +
                                         std::to_string(graph_->inputs().size()) + " graph inputs");
    version_str_ = nb::str("_version");
    for (auto& [arg, obj] : frozen) frozen_.push_back({arg, obj, version_of(obj.ptr())});
  }

  // None when a frozen parameter changed (see Note [The call path]); the list of outputs else.
  nb::object call(nb::handle args, int framework) {
    nb::object seq = nb::steal(PySequence_Fast(args.ptr(), "Runner: arguments must be a sequence"));
    if (!seq.is_valid()) throw nb::python_error();
    Py_ssize_t nargs = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    for (const Frozen& f : frozen_) {
      if (f.arg >= nargs) return nb::none();
      PyObject* a = items[f.arg];
      if (a != f.obj.ptr() || version_of(a) != f.version) return nb::none();
    }
    const std::vector<TensorSpec>& specs = graph_->inputs();
    size_t n = specs.size();
    ArgViews views(n);
    for (size_t i = 0; i < n; ++i) {
      int arg = input_args_[i];
      if (arg >= nargs)
        raise_input_error("expected at least " + std::to_string(arg + 1) + " arguments, got " +
                          std::to_string(nargs));
      if (!view_array(items[arg], views.holders[i], views.refs[i]))
        raise_input_error("input " + std::to_string(i) + " ('" + specs[i].name +
                          "'): expected a tensor or array (" + spec_str(specs[i]) + "), got " +
                          std::string(nb::str(nb::type_name(nb::handle(items[arg]).type())).c_str()));
      check_input(views.refs[i], specs[i], i);
    }
    std::vector<OwnedTensor> outs = graph_->run(views.refs, n);
    nb::list result;
    for (OwnedTensor& t : outs) result.append(export_tensor(std::move(t), framework));
    return std::move(result);
  }

  // Why the guards fail for `args` ("" when they hold): names the argument position.
  std::string guard_failure(nb::handle args) {
    nb::object seq = nb::steal(PySequence_Fast(args.ptr(), "arguments"));
    if (!seq.is_valid()) throw nb::python_error();
    Py_ssize_t nargs = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    for (const Frozen& f : frozen_) {
      if (f.arg >= nargs) return "argument " + std::to_string(f.arg) + " is missing";
      if (items[f.arg] != f.obj.ptr())
        return "argument " + std::to_string(f.arg) + " is another tensor than the one frozen";
      int64_t v = version_of(items[f.arg]);
      if (v != f.version)
        return "argument " + std::to_string(f.arg) + " was modified in place (version " +
               std::to_string(f.version) + " -> " + std::to_string(v) + ")";
    }
    return "";
  }

  std::shared_ptr<CompiledGraph> graph() const { return graph_; }
  size_t num_frozen() const { return frozen_.size(); }

 private:
  struct Frozen {
    int arg;
    nb::object obj;
    int64_t version;
  };
  int64_t version_of(PyObject* o) const {
    PyObject* v = PyObject_GetAttr(o, version_str_.ptr());
    if (!v) {  // not a torch tensor (NumPy arrays have no version counter)
      PyErr_Clear();
      return 0;
    }
    int64_t r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
  }

  std::shared_ptr<CompiledGraph> graph_;
  std::vector<int> input_args_;
  std::vector<Frozen> frozen_;
  nb::str version_str_;
};

// ---- attributes from Python ----------------------------------------------------------------
struct DTypeAttr {
  std::string name;
};

// A symbolic size in an int attribute or an input shape: `expr` in SymInt::str's syntax ("s0",
// "2*s0"). Lists of sizes may also hold the expression as a plain str.
struct SymDim {
  std::string expr;
};

// An int, a SymDim or (in lists) a str, as a SymInt encoding.
int64_t size_of(const std::string& key, nb::handle e) {
  if (nb::isinstance<SymDim>(e)) return symbolic_dim(nb::cast<SymDim&>(e).expr);
  if (PyUnicode_Check(e.ptr())) return symbolic_dim(nb::cast<std::string>(e));
  if (PyLong_Check(e.ptr()) && !PyBool_Check(e.ptr())) return nb::cast<int64_t>(e);
  throw Error("InvalidArgument", key + ": sizes are ints or symbolic expressions (str), got " +
                                     std::string(nb::str(nb::type_name(e.type())).c_str()));
}

AttrValue to_attr(const std::string& key, nb::handle v) {
  AttrValue a;
  if (v.is_none()) return a;
  if (nb::isinstance<DTypeAttr>(v)) {
    a.kind = AttrValue::DType;
    a.s = nb::cast<DTypeAttr&>(v).name;
  } else if (nb::isinstance<SymDim>(v)) {
    a.kind = AttrValue::Int;
    a.i = size_of("attribute '" + key + "'", v);
  } else if (PyBool_Check(v.ptr())) {
    a.kind = AttrValue::Bool;
    a.b = v.ptr() == Py_True;
  } else if (PyLong_Check(v.ptr())) {
    a.kind = AttrValue::Int;
    a.i = nb::cast<int64_t>(v);
  } else if (PyFloat_Check(v.ptr())) {
    a.kind = AttrValue::Float;
    a.f = nb::cast<double>(v);
  } else if (PyUnicode_Check(v.ptr())) {
    a.kind = AttrValue::String;
    a.s = nb::cast<std::string>(v);
  } else if (PyList_Check(v.ptr()) || PyTuple_Check(v.ptr())) {
    bool any_float = false;
    for (nb::handle e : v) {
      if (PyFloat_Check(e.ptr())) any_float = true;
      else if ((!PyLong_Check(e.ptr()) || PyBool_Check(e.ptr())) && !nb::isinstance<SymDim>(e) &&
               !PyUnicode_Check(e.ptr()))
        throw Error("InvalidArgument", "attribute '" + key + "': lists hold ints, floats or "
                                       "symbolic sizes");
    }
    if (any_float) {
      a.kind = AttrValue::Floats;
      for (nb::handle e : v) a.floats.push_back(nb::cast<double>(e));
    } else {
      a.kind = AttrValue::Ints;  // SymInt encodings (symbolic sizes in shape attributes)
      for (nb::handle e : v) a.ints.push_back(size_of("attribute '" + key + "'", e));
    }
  } else {
    throw Error("InvalidArgument", "attribute '" + key + "': unsupported value of type " +
                                       std::string(nb::str(nb::type_name(v.type())).c_str()));
  }
  return a;
}

std::shared_ptr<void> keep_python_object(nb::handle obj) {
  PyObject* p = obj.ptr();
  Py_INCREF(p);
  return std::shared_ptr<void>(p, [](void* q) {
    nb::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(q));
  });
}

TensorRef ref_or_raise(nb::handle obj, nb::ndarray<>& holder, const std::string& what) {
  TensorRef r;
  if (!view_array(obj, holder, r))
    raise_input_error(what + ": expected a tensor or array, got " +
                      std::string(nb::str(nb::type_name(obj.type())).c_str()));
  return r;
}

nb::dict spec_dict(const TensorSpec& s) {
  nb::dict d;
  d["name"] = s.name;
  d["dtype"] = s.dtype;
  d["shape"] = s.shape;
  d["symbolic"] = s.symbolic;
  d["device"] = device_str(s.device_type, s.device_id);
  d["type"] = s.text;
  return d;
}

}  // namespace

NB_MODULE(_kiln, m) {
  m.doc() = "Kiln's C++ core (graph builder, compile backends, registry). See kiln/__init__.py.";
  // Compiled graphs live in torch.compile's caches and kiln.report's records until the
  // interpreter exits, after this module's teardown: not leaks, so no warning about them.
  nb::set_leak_warnings(false);

  g_kiln_error = PyErr_NewException("kiln.KilnError", PyExc_RuntimeError, nullptr);
  g_unsupported_error = PyErr_NewException("kiln.UnsupportedError", g_kiln_error, nullptr);
  {
    PyObject* bases = PyTuple_Pack(2, g_kiln_error, PyExc_ValueError);
    g_input_error = PyErr_NewException("kiln.InputError", bases, nullptr);
    Py_DECREF(bases);
  }
  m.attr("KilnError") = nb::handle(g_kiln_error);
  m.attr("UnsupportedError") = nb::handle(g_unsupported_error);
  m.attr("InputError") = nb::handle(g_input_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = e.kind() == "NotSupported"      ? g_unsupported_error
                       : e.kind() == "InvalidArgument" ? g_input_error
                                                       : g_kiln_error;
      PyErr_SetString(type, e.what());
    }
  });

  nb::class_<DTypeAttr>(m, "DType", "A dtype-valued attribute for GraphBuilder.add_node.")
      .def(nb::init<std::string>(), nb::arg("name"))
      .def_ro("name", &DTypeAttr::name)
      .def("__repr__", [](const DTypeAttr& d) { return "DType('" + d.name + "')"; });
  nb::class_<SymDim>(m, "SymDim", "A symbolic size for an int attribute ('s0', '2*s0').")
      .def(nb::init<std::string>(), nb::arg("expr"))
      .def_ro("expr", &SymDim::expr)
      .def("__repr__", [](const SymDim& d) { return "SymDim('" + d.expr + "')"; });

  nb::class_<GraphBuilder>(m, "GraphBuilder",
                           "A Kiln graph under construction (values are ints; -1 = absent input).")
      .def(nb::init<const std::string&>(), nb::arg("name") = "main")
      .def(
          "add_input",
          [](GraphBuilder& b, const std::string& name, const std::string& dtype, nb::handle shape,
             const std::string& device) {
            std::vector<int64_t> dims;
            for (nb::handle e : shape) dims.push_back(size_of("input '" + name + "'", e));
            return b.add_input(name, dtype, dims, device);
          },
          nb::arg("name"), nb::arg("dtype"), nb::arg("shape"), nb::arg("device") = "cpu",
          "A graph input of Kiln dtype `dtype` ('f32', 'i64', ...) and shape (ints, or str "
          "expressions such as 's0' for symbolic sizes).")
      .def(
          "add_param",
          [](GraphBuilder& b, const std::string& name, nb::handle tensor) {
            nb::ndarray<> holder;
            TensorRef r = ref_or_raise(tensor, holder, "parameter '" + name + "'");
            return b.add_param(name, r, keep_python_object(tensor));
          },
          nb::arg("name"), nb::arg("tensor"),
          "A frozen parameter viewing `tensor`'s memory (no copy; the tensor is kept alive).")
      .def(
          "add_const",
          [](GraphBuilder& b, nb::handle tensor, const std::string& name, const std::string& device) {
            nb::ndarray<> holder;
            TensorRef r = ref_or_raise(tensor, holder, "constant '" + name + "'");
            return b.add_const(r, name, device);
          },
          nb::arg("tensor"), nb::arg("name") = "", nb::arg("device") = "cpu",
          "A constant (the data is copied, to `device`).")
      .def(
          "add_node",
          [](GraphBuilder& b, const std::string& op, const std::vector<int>& inputs,
             nb::dict attrs, const std::string& name) {
            AttrList list;
            for (auto [k, v] : attrs) {
              std::string key = nb::cast<std::string>(k);
              list.emplace_back(key, to_attr(key, v));
            }
            return b.add_node(op, inputs, list, name);
          },
          nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = nb::dict(), nb::arg("name") = "",
          "Appends a node of Kiln op `op`; returns its output values. Types are inferred by the "
          "registry; errors name the node.")
      .def("set_outputs", &GraphBuilder::set_outputs, nb::arg("outputs"))
      .def("dtype", &GraphBuilder::dtype, nb::arg("value"))
      .def("shape", &GraphBuilder::shape, nb::arg("value"))
      .def("dims", &GraphBuilder::dims, nb::arg("value"),
           "Each dim as text: digits for a size, the expression for a symbolic one.")
      .def("type_str", &GraphBuilder::type_str, nb::arg("value"))
      .def("value_name", &GraphBuilder::value_name, nb::arg("value"))
      .def_prop_ro("num_nodes", &GraphBuilder::num_nodes)
      .def("node_ops", &GraphBuilder::node_ops)
      .def("input_specs", [](const GraphBuilder& b) {
        nb::list l;
        for (const TensorSpec& s : b.input_specs()) l.append(spec_dict(s));
        return l;
      })
      .def("output_specs", [](const GraphBuilder& b) {
        nb::list l;
        for (const TensorSpec& s : b.output_specs()) l.append(spec_dict(s));
        return l;
      })
      .def("param_names", &GraphBuilder::param_names)
      .def("has_symbolic_shapes", &GraphBuilder::has_symbolic_shapes)
      .def("ir", &GraphBuilder::ir, "The graph as Kiln IR text (weights declared, not printed).")
      .def("verify", &GraphBuilder::verify)
      .def("save_params", &GraphBuilder::save_params, nb::arg("path"),
           "Writes every parameter to a safetensors file.")
      .def_static("load", &GraphBuilder::load, nb::arg("ir_text"), nb::arg("source_name"),
                  nb::arg("weights_path"),
                  "IR text with parameters from a safetensors file (see save_params).")
      .def_static(
          "import_onnx",
          [](const std::string& path, nb::dict input_shapes) {
            std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
            for (auto [k, v] : input_shapes)
              shapes.emplace_back(nb::cast<std::string>(k), nb::cast<std::vector<int64_t>>(v));
            return GraphBuilder::import_onnx(path, shapes);
          },
          nb::arg("path"), nb::arg("input_shapes") = nb::dict(), "Kiln's ONNX importer.");

  nb::class_<CompiledGraph>(m, "CompiledGraph", "A graph compiled by a Kiln backend.")
      .def_static(
          "compile",
          [](const GraphBuilder& g, const std::string& backend, const std::string& mode,
             const std::string& precision) {
            CompileSpec spec{backend, mode, precision};
            return std::shared_ptr<CompiledGraph>(CompiledGraph::compile(g, spec));
          },
          nb::arg("graph"), nb::arg("backend") = "inductor", nb::arg("mode") = "default",
          nb::arg("precision") = "float32",
          "Compiles with a registered backend; precision float32 | bfloat16 | float16 (autocast).")
      .def_static(
          "compile_package",
          [](const GraphBuilder& g, const std::string& path, const std::string& model,
             const std::string& mode, const std::string& precision) {
            CompileSpec spec{"inductor", mode, precision};
            return std::shared_ptr<CompiledGraph>(CompiledGraph::compile_package(g, spec, model, path));
          },
          nb::arg("graph"), nb::arg("path"), nb::arg("model"), nb::arg("mode") = "default",
          nb::arg("precision") = "float32",
          "Compiles for the CPU and writes a .kiln package to `path` (atomically).")
      .def_static(
          "load_package",
          [](const std::string& path) {
            return std::shared_ptr<CompiledGraph>(CompiledGraph::load_package(path));
          },
          nb::arg("path"), "Loads a .kiln package with the runtime alone.")
      .def_prop_ro("manifest", &CompiledGraph::manifest)
      .def_prop_ro("backend", &CompiledGraph::backend)
      .def_prop_ro("summary", &CompiledGraph::summary)
      .def_prop_ro("arena_bytes", &CompiledGraph::arena_bytes)
      .def_prop_ro("cache_hit", &CompiledGraph::cache_hit)
      .def_prop_ro("compile_seconds", &CompiledGraph::compile_seconds)
      .def("input_specs", [](const CompiledGraph& c) {
        nb::list l;
        for (const TensorSpec& s : c.inputs()) l.append(spec_dict(s));
        return l;
      })
      .def("output_specs", [](const CompiledGraph& c) {
        nb::list l;
        for (const TensorSpec& s : c.outputs()) l.append(spec_dict(s));
        return l;
      })
      .def(
          "time_cpp_ns",
          [](CompiledGraph& c, nb::sequence inputs, nb::sequence outputs, int iters) {
            std::vector<nb::ndarray<>> hold(nb::len(inputs) + nb::len(outputs));
            std::vector<TensorRef> in, out;
            size_t k = 0;
            for (nb::handle h : inputs) in.push_back(ref_or_raise(h, hold[k++], "input"));
            for (nb::handle h : outputs) out.push_back(ref_or_raise(h, hold[k++], "output"));
            return c.time_run_into_ns(in.data(), in.size(), out.data(), out.size(), iters);
          },
          nb::arg("inputs"), nb::arg("outputs"), nb::arg("iters"),
          "Median ns of `iters` C++ run_into calls (the C++ side alone, for overhead figures).");

  nb::class_<Runner>(m, "Runner", "A compiled graph with its calling convention and guards.")
      .def(
          "__init__",
          [](Runner* r, std::shared_ptr<CompiledGraph> g, std::vector<int> input_args,
             nb::list frozen) {
            std::vector<std::pair<int, nb::object>> f;
            for (nb::handle item : frozen) {
              nb::tuple t = nb::cast<nb::tuple>(item);
              f.emplace_back(nb::cast<int>(t[0]), nb::borrow(t[1]));
            }
            new (r) Runner(std::move(g), std::move(input_args), std::move(f));
          },
          nb::arg("graph"), nb::arg("input_args"), nb::arg("frozen"),
          "`input_args[i]`: the call argument feeding graph input i; `frozen`: (argument, "
          "tensor) pairs guarded by identity and version.")
      .def("__call__", &Runner::call, nb::arg("args"), nb::arg("framework") = 0,
           "Outputs as a list (framework 0: torch, 1: NumPy), or None when a frozen parameter "
           "changed.")
      .def("guard_failure", &Runner::guard_failure, nb::arg("args"))
      .def_prop_ro("graph", &Runner::graph)
      .def_prop_ro("num_frozen", &Runner::num_frozen);

  m.def("ops", [] {
    nb::list l;
    for (const OpInfo& o : ops()) {
      nb::dict d;
      d["name"] = o.name;
      d["family"] = o.family;
      d["dtypes"] = o.dtypes;
      d["inputs"] = o.inputs;
      d["attrs"] = o.attrs;
      d["num_outputs"] = o.num_outputs;
      d["is_view"] = o.is_view;
      d["cuda_kernel"] = o.cuda_kernel;
      l.append(d);
    }
    return l;
  }, "The op registry: name, family, dtypes, inputs, attrs, num_outputs, is_view, cuda_kernel.");
  m.def(
      "use_torch_exchange_api",
      [](nb::handle tensor_type) {
        g_torch_api = exchange_api_of(reinterpret_cast<PyTypeObject*>(tensor_type.ptr()));
        return g_torch_api != nullptr;
      },
      nb::arg("tensor_type"),
      "Creates torch outputs through torch.Tensor's DLPack C exchange API when it has one "
      "(torch >= 2.10); returns whether it does.");
  m.def("backends", &backends, "Registered compile backends.");
  m.def("version", &version);
  m.def("evaluate_dim", &evaluate_dim, nb::arg("expr"), nb::arg("bindings"),
        "The value of a size expression under symbol -> value bindings.");
  m.def("symbolic_dim", &symbolic_dim, nb::arg("expr"),
        "The canonical encoding of a symbolic size expression: equal expressions, equal ints.");
  m.def("cuda_status", &cuda_status, "'' when a CUDA device is usable, else the reason.");
  m.def("set_num_threads", &set_num_threads, nb::arg("n"));
  m.def("num_threads", &num_threads);
  m.def(
      "load_safetensors",
      [](const std::string& path, int framework) {
        nb::dict d;
        for (auto& [name, t] : load_safetensors(path)) d[name.c_str()] = export_tensor(std::move(t), framework);
        return d;
      },
      nb::arg("path"), nb::arg("framework") = 0);
}
