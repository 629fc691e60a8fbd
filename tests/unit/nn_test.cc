// The module API (src/nn): registration and naming, state dicts, safetensors I/O (round trips,
// corrupted and truncated files, atomic saves) and every layer's forward against a hand-written
// computation on fresh random inputs.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "../support/compare.h"
#include "ops/api.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/safetensors.h"

namespace kiln::nn {
namespace {

namespace fs = std::filesystem;

// ---- helpers ----------------------------------------------------------------------------------

// A fresh directory under $TMPDIR, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kiln_nn_test_XXXXXX").string();
    KILN_ASSERT(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Elementwise |a - b| <= atol + rtol * |b| (tests/support/compare.h).
void expect_close(const Tensor& actual, const std::vector<double>& expected, double rtol,
                  double atol, const std::string& what) {
  std::vector<double> a = values(actual);
  EXPECT_TRUE(test::close(a, expected, test::Tolerance::rel(rtol, atol),
                          actual.dim() > 0 ? actual.sizes() : Dims{}))
      << what;
}
void expect_close(const Tensor& actual, const Tensor& expected, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  expect_close(actual, values(expected), rtol, atol, what);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

std::vector<std::string> names_of(const NamedTensors& nt) {
  std::vector<std::string> out;
  for (const auto& [n, t] : nt) out.push_back(n);
  return out;
}

// Runs f, expecting a kiln::Error whose message contains every one of `needles`.
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles,
                  const std::string& what = "") {
  try {
    f();
    ADD_FAILURE() << what << ": no error thrown";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(e.message().find(n), std::string::npos)
          << what << ": message lacks \"" << n << "\": " << e.message();
  }
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
// A safetensors file from a header string and raw data bytes.
std::vector<uint8_t> make_st(const std::string& header, size_t data_bytes,
                             uint64_t header_len_override = UINT64_MAX) {
  uint64_t n = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(uint8_t(i * 37 + 1));
  return out;
}

// A small module tree used by the registration tests.
class Net : public Module {
 public:
  explicit Net(Generator& gen) : Module("Net") {
    scale = register_parameter("scale", Tensor::rand({4}, gen, 0.5, 1.5));
    offset = register_buffer("offset", Tensor::randn({4}, gen));
    scratch = register_buffer("scratch", Tensor::randn({2}, gen), /*persistent=*/false);
    block = register_module("block", std::make_shared<Sequential>());
    block->push_back(std::make_shared<Linear>(3, 5, true, gen));
    block->push_back(std::make_shared<ReLU>());
    block->push_back(std::make_shared<Linear>(5, 4, true, gen));
    norm = register_module("norm", std::make_shared<BatchNorm2d>(4, 1e-5, true, gen));
  }
  Tensor scale, offset, scratch;
  std::shared_ptr<Sequential> block;
  std::shared_ptr<BatchNorm2d> norm;
};

// ---- registration and naming ------------------------------------------------------------------

TEST(Module, DottedNamesInPyTorchOrder) {
  Generator gen(1);
  auto net = std::make_shared<Net>(gen);
  EXPECT_EQ(names_of(net->named_parameters()),
            (std::vector<std::string>{"scale", "block.0.weight", "block.0.bias", "block.2.weight",
                                      "block.2.bias", "norm.weight", "norm.bias"}));
  EXPECT_EQ(names_of(net->named_parameters(/*recurse=*/false)), std::vector<std::string>{"scale"});
  EXPECT_EQ(names_of(net->named_buffers()),
            (std::vector<std::string>{"offset", "scratch", "norm.running_mean",
                                      "norm.running_var", "norm.num_batches_tracked"}));
  // state_dict: per module its parameters, then persistent buffers, then children.
  EXPECT_EQ(names_of(net->state_dict()),
            (std::vector<std::string>{"scale", "offset", "block.0.weight", "block.0.bias",
                                      "block.2.weight", "block.2.bias", "norm.weight",
                                      "norm.bias", "norm.running_mean", "norm.running_var",
                                      "norm.num_batches_tracked"}));
  std::vector<std::string> module_names;
  for (const auto& [name, m] : net->named_modules()) module_names.push_back(name);
  EXPECT_EQ(module_names,
            (std::vector<std::string>{"", "block", "block.0", "block.1", "block.2", "norm"}));
  EXPECT_EQ(net->named_modules()[0].second.get(), net.get());
  EXPECT_EQ(net->named_modules(false).size(), 5u);
  EXPECT_EQ(net->named_children().size(), 2u);
  EXPECT_EQ(net->parameters().size(), 7u);
  EXPECT_EQ(net->buffers().size(), 5u);
  EXPECT_EQ(net->num_parameters(), 4 + 3 * 5 + 5 + 5 * 4 + 4 + 4 + 4);

  // Registration returns handles that share the registered tensor.
  auto lin = std::dynamic_pointer_cast<Linear>((*net->block)[2]);
  ASSERT_TRUE(lin);
  EXPECT_TRUE(same_tensor(net->parameter("block.2.bias"), lin->bias));
  EXPECT_TRUE(same_tensor(net->parameter("scale"), net->scale));
  EXPECT_TRUE(same_tensor(net->buffer("norm.running_var"), net->norm->running_var));
  EXPECT_EQ(net->submodule("block.2").get(), lin.get());
  expect_error([&] { net->parameter("block.7.weight"); }, {"block.7.weight", "no submodule 'block.7'"});
  expect_error([&] { net->parameter("block.0.nope"); }, {"block.0.nope"});
  expect_error([&] { net->buffer("scale"); }, {"no buffer", "scale"});
  EXPECT_NE(net->str().find("(0): Linear(in_features=3, out_features=5"), std::string::npos)
      << net->str();
}

TEST(Module, RegistrationErrorsNameTheModuleAndName) {
  Generator gen(2);
  Module m("Custom");
  m.register_parameter("w", Tensor::randn({2}, gen));
  expect_error([&] { m.register_parameter("w", Tensor::randn({2}, gen)); },
               {"Custom", "'w'", "already registered"});
  expect_error([&] { m.register_buffer("w", Tensor::randn({2}, gen)); }, {"'w'", "already"});
  expect_error([&] { m.register_module("w", std::make_shared<ReLU>()); }, {"'w'", "already"});
  expect_error([&] { m.register_parameter("a.b", Tensor::randn({2}, gen)); }, {"'a.b'", "'.'"});
  expect_error([&] { m.register_parameter("", Tensor::randn({2}, gen)); }, {"empty"});
  expect_error([&] { m.register_parameter("u", Tensor()); }, {"'u'", "undefined"});
  expect_error([&] { m.register_module("n", ModulePtr()); }, {"'n'", "null"});
  // Not owned by a shared_ptr: include_self cannot hand out a pointer to it.
  expect_error([&] { m.named_modules(true); }, {"shared_ptr"});
  EXPECT_TRUE(m.named_modules(false).empty());
  expect_error([&] { m.call({}); }, {"Custom", "call()"});
}

TEST(Module, TrainEvalIsRecursive) {
  Generator gen(3);
  auto net = std::make_shared<Net>(gen);
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(net->norm->is_training());
  net->eval();
  for (const auto& [name, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net->train();
  for (const auto& [name, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

TEST(Module, TiedParametersAppearOnce) {
  Generator gen(4);
  auto root = std::make_shared<Module>("Tied");
  auto a = root->register_module("a", std::make_shared<Linear>(4, 4, false, gen));
  auto b = root->register_module("b", std::make_shared<Module>("Holder"));
  b->register_parameter("shared", a->weight);
  EXPECT_EQ(names_of(root->named_parameters()), std::vector<std::string>{"a.weight"});
  EXPECT_EQ(root->num_parameters(), 16);
  // state_dict keeps both names, like PyTorch.
  EXPECT_EQ(names_of(root->state_dict()), (std::vector<std::string>{"a.weight", "b.shared"}));
}

TEST(Module, InitIsDeterministicAndNeverZero) {
  Generator g1(7), g2(7), g3(8);
  auto a = std::make_shared<Net>(g1), b = std::make_shared<Net>(g2), c = std::make_shared<Net>(g3);
  NamedTensors sa = a->state_dict(), sb = b->state_dict(), sc = c->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    const auto& [name, t] = sa[i];
    EXPECT_TRUE(bitwise_equal(t, sb[i].second)) << name << ": same seed, different values";
    if (name.ends_with("num_batches_tracked")) continue;
    EXPECT_FALSE(bitwise_equal(t, sc[i].second)) << name << ": a different seed gives the same";
    std::vector<double> v = values(t);
    double sum_abs = 0;
    for (double x : v) sum_abs += std::fabs(x);
    EXPECT_GT(sum_abs / double(v.size()), 1e-3) << name << " is (nearly) all zeros";
  }
  // Distributions of Note [Random init].
  std::vector<double> var = values(a->norm->running_var), w = values(a->norm->weight);
  for (double x : var) EXPECT_TRUE(x >= 0.5 && x < 1.5) << x;
  for (double x : w) EXPECT_TRUE(x >= 0.5 && x < 1.5) << x;
  auto lin = std::dynamic_pointer_cast<Linear>((*a->block)[0]);
  for (double x : values(lin->weight)) EXPECT_LE(std::fabs(x), 1.0 / std::sqrt(3.0)) << x;
}

TEST(Module, InitStatistics) {
  // Large fills: mean and spread of the uniform and normal generators are right.
  Generator gen(11);
  Tensor u = Tensor::empty({100000}), n = Tensor::empty({100001});
  init::uniform_(u, -2.0, 4.0, gen);
  init::normal_(n, 3.0, 0.5, gen);
  auto stats = [](const Tensor& t) {
    std::vector<double> v = values(t);
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= double(v.size());
    for (double x : v) s += (x - m) * (x - m);
    return std::pair{m, std::sqrt(s / double(v.size()))};
  };
  auto [um, us] = stats(u);
  EXPECT_NEAR(um, 1.0, 0.03);
  EXPECT_NEAR(us, 6.0 / std::sqrt(12.0), 0.03);
  for (double x : values(u)) ASSERT_TRUE(x >= -2.0 && x < 4.0) << x;
  auto [nm, ns] = stats(n);
  EXPECT_NEAR(nm, 3.0, 0.01);
  EXPECT_NEAR(ns, 0.5, 0.01);
  // Non-float32 tensors are filled through a conversion.
  Tensor h = Tensor::empty({64}, DType::Float16);
  init::uniform_(h, 1.0, 2.0, gen);
  for (double x : values(h)) EXPECT_TRUE(x >= 1.0 && x <= 2.0) << x;
  expect_error([&] { init::uniform_(Tensor::empty({4}, DType::Int64), 0, 1, gen); },
               {"floating", "int64"});
}

// The example of docs/nn.md.
class Block : public UnaryModule {
 public:
  Block(int64_t dim, Generator& gen) : UnaryModule("Block") {
    norm = register_module("norm", std::make_shared<LayerNorm>(std::vector<int64_t>{dim}, 1e-5, true, gen));
    fc = register_module("fc", std::make_shared<Linear>(dim, dim, true, gen));
    scale = register_parameter("scale", Tensor::full({dim}, 0.5));
  }
  Tensor forward(const Tensor& x) override {
    return add(x, mul(gelu(fc->forward(norm->forward(x))), scale));
  }
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> fc;
  Tensor scale;
};

TEST(Module, DocsExampleBlock) {
  Generator gen(0);
  auto model = std::make_shared<Block>(16, gen);
  model->eval();
  EXPECT_EQ(names_of(model->named_parameters()),
            (std::vector<std::string>{"scale", "norm.weight", "norm.bias", "fc.weight", "fc.bias"}));
  Tensor x = Tensor::randn({8, 16}, gen);
  Tensor y = model->forward(x);
  Tensor h = model->fc->forward(model->norm->forward(x));
  expect_close(y, add(x, mul(gelu(h), 0.5)), 1e-6, 1e-6, "block");
  expect_close(model->call({x})[0], y, 0, 0, "call");
  EXPECT_NE(model->str().find("(fc): Linear(in_features=16, out_features=16, bias=true)"),
            std::string::npos)
      << model->str();
}

// ---- state dicts ------------------------------------------------------------------------------

TEST(StateDict, RoundTripThroughSafetensors) {
  TempDir dir;
  Generator g1(21), g2(22);
  auto a = std::make_shared<Net>(g1), b = std::make_shared<Net>(g2);
  a->norm->num_batches_tracked.copy_(Tensor::scalar(17, DType::Int64));
  std::string path = dir.file("net.safetensors");
  a->save(path);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"net.safetensors"});  // no temp files left

  NamedTensors before = b->state_dict();
  EXPECT_FALSE(bitwise_equal(before[0].second, a->state_dict()[0].second));
  Tensor handle = b->scale;  // a handle taken before loading sees the loaded values
  uint64_t version = handle.version();
  b->load(path);
  NamedTensors sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(names_of(sa), names_of(sb));
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(bitwise_equal(sa[i].second, sb[i].second)) << sa[i].first;
  EXPECT_TRUE(bitwise_equal(handle, a->scale));
  EXPECT_GT(handle.version(), version);  // loading is an in-place write
  EXPECT_EQ(b->norm->num_batches_tracked.item(), 17);
  // The non-persistent buffer is not saved, so it keeps its own values.
  EXPECT_FALSE(bitwise_equal(a->scratch, b->scratch));

  SafetensorsContents file = load_safetensors(path);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.metadata.at("kiln.module"), "Net");
  EXPECT_EQ(names_of(file.tensors), names_of(sa));
}

TEST(StateDict, LoadErrorsNameKeysAndShapes) {
  Generator g1(31), g2(32);
  auto net = std::make_shared<Net>(g1);
  NamedTensors good = std::make_shared<Net>(g2)->state_dict();
  NamedTensors before = net->state_dict();
  auto unchanged = [&] {
    NamedTensors now = net->state_dict();
    for (size_t i = 0; i < now.size(); ++i)
      EXPECT_TRUE(bitwise_equal(before[i].second, now[i].second.clone()))
          << now[i].first << " changed by a failed load";
  };
  for (auto& [n, t] : before) t = t.clone();

  NamedTensors missing = good;
  missing.erase(missing.begin() + 3);  // block.0.bias
  expect_error([&] { net->load_state_dict(missing); }, {"Net", "1 missing key", "block.0.bias"});
  unchanged();

  NamedTensors extra = good;
  extra.emplace_back("block.9.weight", Tensor::ones({2}));
  expect_error([&] { net->load_state_dict(extra); }, {"1 unexpected key", "block.9.weight"});
  unchanged();

  NamedTensors wrong_shape = good;
  Generator g3(33);
  wrong_shape[2].second = Tensor::randn({5, 4}, g3);  // block.0.weight is [5, 3]
  expect_error([&] { net->load_state_dict(wrong_shape); },
               {"block.0.weight", "checkpoint has float32[5, 4]", "module has float32[5, 3]"});
  unchanged();

  NamedTensors wrong_dtype = good;
  wrong_dtype[0].second = wrong_dtype[0].second.to(DType::Float64);
  expect_error([&] { net->load_state_dict(wrong_dtype); }, {"'scale'", "float64[4]", "float32[4]"});
  unchanged();

  // A mismatch fails even when not strict; missing/unexpected keys do not.
  expect_error([&] { net->load_state_dict(wrong_shape, /*strict=*/false); }, {"block.0.weight"});
  net->load_state_dict(missing, /*strict=*/false);
  EXPECT_TRUE(bitwise_equal(net->scale, good[0].second));
  EXPECT_TRUE(bitwise_equal(net->parameter("block.0.bias"), before[3].second));  // kept
  net->load_state_dict(extra, /*strict=*/false);
  EXPECT_TRUE(bitwise_equal(net->parameter("block.0.bias"), good[3].second));

  // Errors through load(path) name the file too.
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  save_safetensors(path, wrong_shape);
  expect_error([&] { net->load(path); }, {path, "block.0.weight", "[5, 4]"});
}

// ---- safetensors --------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  Generator gen(41);
  NamedTensors tensors;
  for (DType d : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64})
    tensors.emplace_back(std::string("f_") + dtype_name(d), Tensor::randn({3, 5}, gen, d));
  for (DType d : {DType::Int64, DType::Int32, DType::Int8, DType::UInt8})
    tensors.emplace_back(std::string("i_") + dtype_name(d), Tensor::randint({7}, gen, 0, 100, d));
  tensors.emplace_back("mask", Tensor::randint({2, 3}, gen, 0, 2, DType::Bool));
  tensors.emplace_back("scalar", Tensor::scalar(2.5));
  tensors.emplace_back("empty", Tensor::empty({0, 4}));
  // A non-contiguous view is written as its logical (row-major) contents.
  Tensor base = Tensor::randn({4, 6}, gen);
  tensors.emplace_back("strided", base.as_strided({6, 4}, {1, 6}, 0));
  std::map<std::string, std::string> meta{{"author", "kiln"}, {"note", "\"quoted\" \u00e9"}};

  std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, meta);
  std::vector<uint8_t> bytes = read_bytes(path);
  EXPECT_EQ(bytes, safetensors_bytes(tensors, meta));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[size_t(i)];
  EXPECT_EQ(header_len % 8, 0u) << "data section must start 8-byte aligned";
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + long(header_len));
  EXPECT_NE(header.find("\"f_bfloat16\":{\"dtype\":\"BF16\",\"shape\":[3,5]"), std::string::npos)
      << header;
  EXPECT_NE(header.find("\"mask\":{\"dtype\":\"BOOL\""), std::string::npos) << header;

  SafetensorsContents c = load_safetensors(path);
  EXPECT_EQ(c.metadata, meta);
  ASSERT_EQ(names_of(c.tensors), names_of(tensors));
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(c.tensors[i].second, tensors[i].second.contiguous()))
        << tensors[i].first;
  }
  SafetensorsContents m = parse_safetensors(bytes, "mem");
  for (size_t i = 0; i < tensors.size(); ++i)
    EXPECT_TRUE(bitwise_equal(m.tensors[i].second, c.tensors[i].second)) << tensors[i].first;
}

TEST(Safetensors, SaveRejectsBadTensorsAndLeavesNothing) {
  TempDir dir;
  Generator gen(42);
  std::string path = dir.file("w.safetensors");
  Tensor good = Tensor::randn({4}, gen);
  expect_error([&] { save_safetensors(path, {{"a", good}, {"a", good}}); }, {"'a'", "twice"});
  expect_error([&] { save_safetensors(path, {{"a", good}, {"f", Tensor::fake({2}, DType::Float32)}}); },
               {path, "'f'", "fake"});
  expect_error([&] { save_safetensors(path, {{"u", Tensor()}}); }, {"'u'", "undefined"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", good}}); }, {"reserved"});
  expect_error([&] { save_safetensors(path, {{"", good}}); }, {"empty name"});
  expect_error([&] { save_safetensors(path, {{std::string("bad\xff"), good}}); }, {"UTF-8"});
  EXPECT_TRUE(dir.entries().empty());
  expect_error([&] { save_safetensors(dir.file("no/such/dir/w.safetensors"), {{"a", good}}); },
               {"no/such/dir", "temp file"});
}

TEST(Safetensors, AtomicSaveKeepsTheOldFileOnFailure) {
  TempDir dir;
  Generator gen(43);
  std::string path = dir.file("w.safetensors");
  NamedTensors old{{"x", Tensor::randn({16}, gen)}};
  save_safetensors(path, old);
  std::vector<uint8_t> old_bytes = read_bytes(path);

  // A write that fails halfway (the file-size limit is hit inside the data section).
  NamedTensors big{{"big", Tensor::randn({1 << 18}, gen)}};  // 1 MiB
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of a signal
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    save_safetensors(path, big);
  } catch (const Error& e) {
    message = e.message();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("write failed"), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), old_bytes) << "the old file was modified";
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.safetensors"}) << "temp file left behind";

  // The rename fails (the target is a directory): the complete temp file is removed too.
  fs::create_directory(dir.file("d.safetensors"));
  expect_error([&] { save_safetensors(dir.file("d.safetensors"), old); }, {"rename"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"d.safetensors", "w.safetensors"}));

  // Success replaces the file as a whole.
  save_safetensors(path, big);
  EXPECT_TRUE(bitwise_equal(load_safetensors(path).tensors[0].second, big[0].second));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"d.safetensors", "w.safetensors"}));
}

TEST(Safetensors, MissingFileAndNotAFile) {
  TempDir dir;
  expect_error([&] { load_safetensors(dir.file("absent.safetensors")); },
               {"absent.safetensors", "cannot open"});
  expect_error([&] { load_safetensors(dir.path.string()); }, {"not a regular file"});
}

TEST(Safetensors, TruncatedFilesFailCleanly) {
  TempDir dir;
  Generator gen(44);
  std::vector<uint8_t> bytes =
      safetensors_bytes({{"a", Tensor::randn({8, 8}, gen)}, {"b", Tensor::randn({3}, gen)}});
  std::string path = dir.file("t.safetensors");
  // Every prefix shorter than the file is an error (never a crash, never a partial result);
  // in memory for all of them, through a file for a sample.
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + long(n));
    bool via_file = n % 37 == 0 || n < 9;
    if (via_file) write_bytes(path, prefix);
    try {
      if (via_file)
        load_safetensors(path);
      else
        parse_safetensors(prefix, path);
      ADD_FAILURE() << "prefix of " << n << " bytes loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError) << e.message();
      EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    }
  }
  write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
  expect_error([&] { load_safetensors(path); }, {"'b'", "past the data section", "truncated"});
}

TEST(Safetensors, CorruptHeadersAreRejectedWithReasons) {
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    std::vector<std::string> needles;
  };
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  std::vector<Case> cases = {
      {"huge header length", make_st("{}", 0, uint64_t(1) << 62), {"header length"}},
      {"header longer than file", make_st("{}", 0, 1000), {"header length 1000"}},
      {"not JSON", make_st("{\"w\": [", 0), {"not valid JSON"}},
      {"not an object", make_st("[1,2]", 0), {"not a JSON object"}},
      {"unknown dtype", make_st(R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
       {"'w'", "unsupported dtype 'F8_E4M3'"}},
      {"I16 unsupported", make_st(R"({"w":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})", 4),
       {"'w'", "'I16'"}},
      {"offsets past end", make_st(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 20),
       {"'w'", "past the data section"}},
      {"reversed offsets", make_st(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8),
       {"'w'", "reversed"}},
      {"byte count mismatch", make_st(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
       {"'w'", "needs 24 bytes", "hold 20"}},
      {"overflowing shape",
       make_st(R"({"w":{"dtype":"F64","shape":[1000000000,1000000000],"data_offsets":[0,8]}})", 8),
       {"'w'", "more than the file's"}},
      {"huge empty shape",
       make_st(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}})", 0),
       {"'w'", "too large"}},
      {"negative dim", make_st(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       {"'w'", "non-negative integer"}},
      {"fractional dim", make_st(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
       {"'w'", "non-negative integer"}},
      {"rank too high",
       make_st(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
       {"'w'", "rank 9"}},
      {"overlap",
       make_st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       {"'a'", "'b'", "overlap"}},
      {"duplicate name", make_st("{" + ok_entry + "," + ok_entry + "}", 24), {"'w'", "twice"}},
      {"missing dtype", make_st(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8), {"'w'", "dtype"}},
      {"offsets not a pair", make_st(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       {"'w'", "data_offsets"}},
      {"unknown field",
       make_st(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8),
       {"'w'", "unknown field 'extra'"}},
      {"entry not object", make_st(R"({"w":5})", 0), {"'w'", "not an object"}},
      {"metadata not strings", make_st(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'"}},
      {"deep nesting", make_st(std::string(5000, '[') + std::string(5000, ']'), 0),
       {"nests too deeply"}},
      {"short file", std::vector<uint8_t>{1, 2, 3}, {"too short"}},
  };
  for (const auto& c : cases) {
    try {
      parse_safetensors(c.bytes, "case.safetensors");
      ADD_FAILURE() << c.what << ": parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError) << c.what;
      EXPECT_NE(e.message().find("case.safetensors"), std::string::npos) << e.message();
      for (const auto& n : c.needles)
        EXPECT_NE(e.message().find(n), std::string::npos)
            << c.what << ": message lacks \"" << n << "\": " << e.message();
    }
  }
  // Valid edge cases: no tensors; a gap between tensors; an empty tensor anywhere.
  EXPECT_TRUE(parse_safetensors(make_st("{}", 0)).tensors.empty());
  auto gap = parse_safetensors(make_st(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[6,6]}})", 8));
  ASSERT_EQ(gap.tensors.size(), 2u);
  EXPECT_EQ(values(gap.tensors[0].second), (std::vector<double>{uint8_t(4 * 37 + 1), uint8_t(5 * 37 + 1)}));
}

TEST(Safetensors, BoolBytesAreNormalized) {
  std::vector<uint8_t> b = make_st(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 0);
  b.insert(b.end(), {0, 7, 255});
  Tensor m = parse_safetensors(b).tensors[0].second;
  const uint8_t* p = static_cast<const uint8_t*>(m.raw_data());
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[1], 1);
  EXPECT_EQ(p[2], 1);
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  // Flip random bytes of a valid file's header (and length): every result is either a clean
  // parse or a kiln::Error, never a crash or another exception.
  Generator gen(45);
  std::vector<uint8_t> good = safetensors_bytes(
      {{"layer.weight", Tensor::randn({4, 4}, gen)}, {"layer.bias", Tensor::randn({4}, gen)}},
      {{"format", "pt"}});
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | good[size_t(i)];
  int errors = 0, parsed = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> b = good;
    int flips = 1 + int(gen.next_u64() % 3);
    for (int f = 0; f < flips; ++f) {
      size_t pos = size_t(gen.next_u64() % (8 + header_len));
      b[pos] = uint8_t(gen.next_u64());
    }
    try {
      SafetensorsContents c = parse_safetensors(b, "fuzz");
      for (const auto& [n, t] : c.tensors) ASSERT_LE(t.nbytes(), b.size());
      ++parsed;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);  // most corruptions are detected
  EXPECT_EQ(errors + parsed, 2000);
}

// ---- layers: forward against hand-written computations ----------------------------------------

constexpr double kRtol = 1e-4, kAtol = 1e-5;  // float32 kernels against float64 loops

TEST(Layers, LinearMatchesMatmulAndLoops) {
  Generator gen(51);
  Linear lin(7, 5, true, gen);
  Tensor x = Tensor::randn({2, 3, 7}, gen);
  Tensor y = lin.forward(x);
  ASSERT_EQ(y.sizes(), (Dims{2, 3, 5}));
  expect_close(y, add(matmul(x, transpose(lin.weight, 0, 1)), lin.bias), kRtol, kAtol, "ops");
  std::vector<double> xv = values(x), w = values(lin.weight), b = values(lin.bias), ref;
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < 5; ++o) {
      double acc = b[size_t(o)];
      for (int64_t i = 0; i < 7; ++i) acc += xv[size_t(r * 7 + i)] * w[size_t(o * 7 + i)];
      ref.push_back(acc);
    }
  expect_close(y, ref, kRtol, kAtol, "loops");
  Linear nobias(7, 5, false, gen);
  EXPECT_FALSE(nobias.bias.defined());
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
  expect_close(nobias.forward(x), matmul(x, transpose(nobias.weight, 0, 1)), kRtol, kAtol, "nobias");
  expect_error([&] { lin.forward(Tensor::randn({2, 6}, gen)); }, {"Linear", "in_features=7", "[2, 6]"});
  // call() delegates to forward.
  expect_close(lin.call({x})[0], y, 0, 0, "call");
  expect_error([&] { lin.call({x, x}); }, {"Linear", "expects 1 input", "got 2"});
}

// Direct convolution in float64: x [N, C, H, W], w [O, C/g, kh, kw].
std::vector<double> conv_loops(const Tensor& x, const Tensor& w, const Tensor& b, int64_t sh,
                               int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                               int64_t groups, Dims* out_sizes) {
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  int64_t O = w.size(0), kh = w.size(2), kw = w.size(3), cg = C / groups, og = O / groups;
  int64_t Ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, Wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  *out_sizes = {N, O, Ho, Wo};
  std::vector<double> xv = values(x), wv = values(w), bv = b.defined() ? values(b) : std::vector<double>(size_t(O), 0.0);
  std::vector<double> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < Ho; ++i)
        for (int64_t j = 0; j < Wo; ++j) {
          double acc = bv[size_t(o)];
          int64_t g = o / og;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                int64_t y = i * sh - ph + u * dh, z = j * sw - pw + v * dw;
                if (y < 0 || y >= H || z < 0 || z >= W) continue;
                acc += xv[size_t(((n * C + g * cg + c) * H + y) * W + z)] *
                       wv[size_t(((o * cg + c) * kh + u) * kw + v)];
              }
          out.push_back(acc);
        }
  return out;
}

TEST(Layers, Conv2dMatchesLoops) {
  Generator gen(52);
  Conv2d conv(Conv2dOptions{.in_channels = 4, .out_channels = 6, .kernel_size = {3, 2},
                            .stride = {2, 1}, .padding = {1, 1}, .dilation = {1, 2}, .groups = 2},
              gen);
  EXPECT_EQ(conv.weight.sizes(), (Dims{6, 2, 3, 2}));
  Tensor x = Tensor::randn({2, 4, 9, 7}, gen);
  Dims sizes;
  std::vector<double> ref = conv_loops(x, conv.weight, conv.bias, 2, 1, 1, 1, 1, 2, 2, &sizes);
  Tensor y = conv.forward(x);
  ASSERT_EQ(y.sizes(), sizes);
  expect_close(y, ref, kRtol, kAtol, "conv");
  Conv2d plain(Conv2dOptions{.in_channels = 3, .out_channels = 5, .kernel_size = {3, 3}, .bias = false}, gen);
  Tensor x2 = Tensor::randn({1, 3, 6, 6}, gen);
  expect_close(plain.forward(x2), conv_loops(x2, plain.weight, Tensor(), 1, 1, 0, 0, 1, 1, 1, &sizes),
               kRtol, kAtol, "plain");
  expect_error([&] { conv.forward(Tensor::randn({1, 3, 8, 8}, gen)); }, {"Conv2d", "4 channels", "[1, 3, 8, 8]"});
  expect_error([&] { Conv2d(Conv2dOptions{.in_channels = 3, .out_channels = 4, .groups = 2}, gen); },
               {"divisible by groups"});
  expect_error([&] { Conv2d(Conv2dOptions{.in_channels = 3, .out_channels = 4, .kernel_size = {3}}, gen); },
               {"kernel_size", "2 values"});
}

TEST(Layers, BatchNorm2dMatchesFormula) {
  Generator gen(53);
  BatchNorm2d bn(5, 1e-3, true, gen);
  bn.eval();
  Tensor x = Tensor::randn({2, 5, 3, 4}, gen);
  auto chan = [](const Tensor& t) { return reshape(t, {1, 5, 1, 1}); };
  Tensor ref = add(mul(div(sub(x, chan(bn.running_mean)), sqrt(add(chan(bn.running_var), 1e-3))),
                       chan(bn.weight)),
                   chan(bn.bias));
  expect_close(bn.forward(x), ref, kRtol, kAtol, "batch_norm");
  bn.train();
  expect_error([&] { bn.forward(x); }, {"BatchNorm2d", "training mode", "eval()"});
  bn.eval();
  expect_error([&] { bn.forward(Tensor::randn({2, 4, 3, 3}, gen)); }, {"BatchNorm2d", "5 channels"});
  BatchNorm2d plain(5, 1e-5, /*affine=*/false, gen);
  plain.eval();
  EXPECT_EQ(plain.named_parameters().size(), 0u);
  expect_close(plain.forward(x),
               div(sub(x, chan(plain.running_mean)), sqrt(add(chan(plain.running_var), 1e-5))),
               kRtol, kAtol, "no affine");
}

TEST(Layers, LayerNormAndGroupNormMatchFormulas) {
  Generator gen(54);
  LayerNorm ln({3, 8}, 1e-5, true, gen);
  Tensor x = add(mul(Tensor::randn({4, 3, 8}, gen), 3.0), 1.5);
  Tensor mu = mean(x, {1, 2}, true);
  Tensor var_ = mean(mul(sub(x, mu), sub(x, mu)), {1, 2}, true);
  Tensor ref = add(mul(div(sub(x, mu), sqrt(add(var_, 1e-5))), ln.weight), ln.bias);
  expect_close(ln.forward(x), ref, kRtol, kAtol, "layer_norm");
  expect_error([&] { ln.forward(Tensor::randn({4, 8, 3}, gen)); }, {"LayerNorm", "[3, 8]"});

  GroupNorm gn(3, 6, 1e-5, true, gen);
  Tensor xg = add(mul(Tensor::randn({2, 6, 5, 3}, gen), 2.0), -0.5);
  Tensor grouped = reshape(xg, {2, 3, 30});
  Tensor gm = mean(grouped, {2}, true);
  Tensor gv = mean(mul(sub(grouped, gm), sub(grouped, gm)), {2}, true);
  Tensor norm = reshape(div(sub(grouped, gm), sqrt(add(gv, 1e-5))), {2, 6, 5, 3});
  Tensor gref = add(mul(norm, reshape(gn.weight, {1, 6, 1, 1})), reshape(gn.bias, {1, 6, 1, 1}));
  expect_close(gn.forward(xg), gref, kRtol, kAtol, "group_norm");
  expect_error([&] { GroupNorm(4, 6); }, {"multiple of num_groups"});
}

TEST(Layers, ActivationsMatchFormulas) {
  Generator gen(55);
  Tensor x = mul(Tensor::randn({3, 17}, gen), 3.0);
  std::vector<double> xv = values(x);
  auto map = [&](double (*f)(double)) {
    std::vector<double> out;
    for (double v : xv) out.push_back(f(v));
    return out;
  };
  expect_close(ReLU().forward(x), map([](double v) { return v > 0 ? v : 0.0; }), 0, 0, "relu");
  expect_close(GELU().forward(x),
               map([](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }), kRtol,
               kAtol, "gelu");
  expect_close(GELU("tanh").forward(x), map([](double v) {
                 return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
               }),
               kRtol, kAtol, "gelu tanh");
  // The two GELU forms differ measurably, so the option is really passed through.
  EXPECT_FALSE(bitwise_equal(GELU().forward(x), GELU("tanh").forward(x)));
  expect_close(SiLU().forward(x), mul(x, sigmoid(x)), kRtol, kAtol, "silu");
  expect_close(Tanh().forward(x), map([](double v) { return std::tanh(v); }), kRtol, kAtol, "tanh");
  expect_error([&] { GELU("fast"); }, {"GELU", "\"fast\""});
  EXPECT_TRUE(same_tensor(Identity().forward(x), x));
}

// Pooling windows in float64; mode 'm' max, 'a' average (count_include_pad as given).
std::vector<double> pool_loops(const Tensor& x, char mode, int64_t k, int64_t s, int64_t p,
                               bool include_pad, Dims* sizes) {
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  int64_t Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
  *sizes = {N, C, Ho, Wo};
  std::vector<double> xv = values(x), out;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t i = 0; i < Ho; ++i)
      for (int64_t j = 0; j < Wo; ++j) {
        double best = -INFINITY, sum = 0;
        int64_t count = 0;
        for (int64_t u = 0; u < k; ++u)
          for (int64_t v = 0; v < k; ++v) {
            int64_t y = i * s - p + u, z = j * s - p + v;
            if (y < 0 || y >= H || z < 0 || z >= W) continue;
            double e = xv[size_t((nc * H + y) * W + z)];
            best = std::max(best, e);
            sum += e;
            ++count;
          }
        if (mode == 'm') out.push_back(best);
        else out.push_back(sum / double(include_pad ? k * k : count));
      }
  return out;
}

TEST(Layers, PoolingMatchesLoops) {
  Generator gen(56);
  Tensor x = Tensor::randn({2, 3, 9, 8}, gen);
  Dims sizes;
  MaxPool2d mp(Pool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  std::vector<double> ref = pool_loops(x, 'm', 3, 2, 1, true, &sizes);
  Tensor y = mp.forward(x);
  ASSERT_EQ(y.sizes(), sizes);
  expect_close(y, ref, 0, 0, "max_pool");
  AvgPool2d ap(Pool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  expect_close(ap.forward(x), pool_loops(x, 'a', 3, 2, 1, true, &sizes), kRtol, kAtol, "avg incl pad");
  AvgPool2d ap2(Pool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1},
                              .count_include_pad = false});
  expect_close(ap2.forward(x), pool_loops(x, 'a', 3, 2, 1, false, &sizes), kRtol, kAtol, "avg excl pad");
  AvgPool2d ap3(Pool2dOptions{.kernel_size = {2, 2}});  // stride defaults to the kernel
  expect_close(ap3.forward(x), pool_loops(x, 'a', 2, 2, 0, true, &sizes), kRtol, kAtol, "avg default stride");

  // Adaptive: window i covers [floor(i*In/Out), ceil((i+1)*In/Out)).
  AdaptiveAvgPool2d aap({4, 3});
  Tensor xa = Tensor::randn({2, 3, 9, 7}, gen);
  std::vector<double> xv = values(xa), aref;
  for (int64_t nc = 0; nc < 6; ++nc)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        int64_t h0 = i * 9 / 4, h1 = ((i + 1) * 9 + 3) / 4, w0 = j * 7 / 3, w1 = ((j + 1) * 7 + 2) / 3;
        double sum = 0;
        for (int64_t y = h0; y < h1; ++y)
          for (int64_t z = w0; z < w1; ++z) sum += xv[size_t((nc * 9 + y) * 7 + z)];
        aref.push_back(sum / double((h1 - h0) * (w1 - w0)));
      }
  Tensor ya = aap.forward(xa);
  ASSERT_EQ(ya.sizes(), (Dims{2, 3, 4, 3}));
  expect_close(ya, aref, kRtol, kAtol, "adaptive");
}

TEST(Layers, DropoutFlattenEmbedding) {
  Generator gen(57);
  Tensor x = Tensor::randn({2, 3, 4}, gen);
  Dropout d(0.3);
  d.eval();
  EXPECT_TRUE(same_tensor(d.forward(x), x));
  d.train();
  expect_error([&] { d.forward(x); }, {"Dropout", "training mode"});
  EXPECT_TRUE(same_tensor(Dropout(0.0).forward(x), x));  // p = 0 is the identity in any mode
  expect_error([&] { Dropout(1.5); }, {"[0, 1]"});

  Tensor f = Flatten().forward(x);
  EXPECT_EQ(f.sizes(), (Dims{2, 12}));
  expect_close(f, values(x), 0, 0, "flatten");

  Embedding emb(11, 4, gen);
  Tensor ids = Tensor::randint({2, 5}, gen, 0, 11);
  Tensor e = emb.forward(ids);
  ASSERT_EQ(e.sizes(), (Dims{2, 5, 4}));
  std::vector<double> w = values(emb.weight), ref;
  for (int64_t id : ids.to_vector<int64_t>())
    for (int64_t k = 0; k < 4; ++k) ref.push_back(w[size_t(id * 4 + k)]);
  expect_close(e, ref, 0, 0, "embedding");
  expect_error([&] { emb.forward(x); }, {"Embedding", "integer"});
  expect_error([&] { emb.forward(Tensor::full({1}, 11, DType::Int64)); }, {"11"});
}

TEST(Layers, SequentialChainsItsChildren) {
  Generator gen(58);
  Sequential seq{std::make_shared<Linear>(6, 8, true, gen), std::make_shared<GELU>(),
                 std::make_shared<Linear>(8, 3, true, gen)};
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  Tensor x = Tensor::randn({5, 6}, gen);
  auto l0 = std::dynamic_pointer_cast<Linear>(seq[0]), l2 = std::dynamic_pointer_cast<Linear>(seq[2]);
  Tensor ref = l2->forward(gelu(l0->forward(x)));
  expect_close(seq.forward(x), ref, 0, 0, "sequential");
  expect_close(seq.call({x})[0], ref, 0, 0, "call");
  Sequential named;
  named.push_back("head", std::make_shared<Linear>(6, 2, true, gen));
  EXPECT_EQ(names_of(named.named_parameters()), (std::vector<std::string>{"head.weight", "head.bias"}));
}

// Multi-head attention written out per batch and head in float64, with PyTorch's mask
// semantics: bool true = masked out, float = added.
std::vector<double> mha_loops(const MultiheadAttention& m, const Tensor& q, const Tensor& k,
                              const Tensor& v, const std::vector<double>* kpm_add,
                              const std::vector<double>* am_add, bool am_per_head) {
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1), E = m.embed_dim, H = m.num_heads,
                D = m.head_dim;
  std::vector<double> W = values(m.in_proj_weight), bias = values(m.in_proj_bias),
                      Wo = values(m.out_proj->weight), bo = values(m.out_proj->bias);
  auto project = [&](const Tensor& x, int64_t len, int64_t part) {  // -> [B, len, E]
    std::vector<double> xv = values(x), out(size_t(B * len * E));
    for (int64_t r = 0; r < B * len; ++r)
      for (int64_t o = 0; o < E; ++o) {
        double acc = bias[size_t(part * E + o)];
        for (int64_t i = 0; i < E; ++i)
          acc += xv[size_t(r * E + i)] * W[size_t((part * E + o) * E + i)];
        out[size_t(r * E + o)] = acc;
      }
    return out;
  };
  std::vector<double> qp = project(q, L, 0), kp = project(k, S, 1), vp = project(v, S, 2);
  std::vector<double> heads(size_t(B * L * E));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> score(static_cast<size_t>(S));
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += qp[size_t((b * L + i) * E + h * D + d)] * kp[size_t((b * S + j) * E + h * D + d)];
          dot /= std::sqrt(double(D));
          if (kpm_add) dot += (*kpm_add)[size_t(b * S + j)];
          if (am_add) dot += (*am_add)[size_t(((am_per_head ? (b * H + h) * L : 0) + i) * S + j)];
          score[size_t(j)] = dot;
          mx = std::max(mx, dot);
        }
        double total = 0;
        for (auto& sc : score) total += (sc = std::exp(sc - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j)
            acc += score[size_t(j)] / total * vp[size_t((b * S + j) * E + h * D + d)];
          heads[size_t((b * L + i) * E + h * D + d)] = acc;
        }
      }
  std::vector<double> out;
  for (int64_t r = 0; r < B * L; ++r)
    for (int64_t o = 0; o < E; ++o) {
      double acc = bo[size_t(o)];
      for (int64_t i = 0; i < E; ++i) acc += heads[size_t(r * E + i)] * Wo[size_t(o * E + i)];
      out.push_back(acc);
    }
  return out;
}

TEST(Layers, MultiheadAttentionMatchesPerHeadLoops) {
  Generator gen(59);
  const int64_t B = 2, L = 5, S = 7, E = 12, H = 3;
  MultiheadAttention mha(E, H, true, gen);
  EXPECT_EQ(names_of(mha.named_parameters()),
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                      "out_proj.bias"}));
  Tensor x = Tensor::randn({B, L, E}, gen);
  Tensor kv_k = Tensor::randn({B, S, E}, gen), kv_v = Tensor::randn({B, S, E}, gen);

  // Self-attention (the packed-projection path) and cross-attention (separate projections).
  Tensor self_out = mha.forward(x, x, x);
  ASSERT_EQ(self_out.sizes(), (Dims{B, L, E}));
  expect_close(self_out, mha_loops(mha, x, x, x, nullptr, nullptr, false), kRtol, kAtol, "self");
  Tensor x_copy = x.clone();  // same values, different tensors: the unpacked path agrees
  expect_close(mha.forward(x, x_copy, x_copy), self_out, kRtol, kAtol, "unpacked");
  expect_close(mha.forward(x, kv_k, kv_v), mha_loops(mha, x, kv_k, kv_v, nullptr, nullptr, false),
               kRtol, kAtol, "cross");

  // Bool key padding mask (true = ignore) and bool causal-like attn_mask [L, S].
  std::vector<uint8_t> pad_bits;
  std::vector<double> pad_add;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < S; ++j) {
      bool masked = j >= S - 2 - b;  // trailing keys
      pad_bits.push_back(masked);
      pad_add.push_back(masked ? -INFINITY : 0.0);
    }
  Tensor kpm = cast(Tensor::from_vector(pad_bits, {B, S}), DType::Bool);
  std::vector<uint8_t> am_bits;
  std::vector<double> am_add;
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j) {
      bool masked = j > i + 1;
      am_bits.push_back(masked);
      am_add.push_back(masked ? -INFINITY : 0.0);
    }
  Tensor am = cast(Tensor::from_vector(am_bits, {L, S}), DType::Bool);
  expect_close(mha.forward(x, kv_k, kv_v, kpm), mha_loops(mha, x, kv_k, kv_v, &pad_add, nullptr, false),
               kRtol, kAtol, "key_padding_mask");
  expect_close(mha.forward(x, kv_k, kv_v, Tensor(), am),
               mha_loops(mha, x, kv_k, kv_v, nullptr, &am_add, false), kRtol, kAtol, "attn_mask");
  expect_close(mha.forward(x, kv_k, kv_v, kpm, am),
               mha_loops(mha, x, kv_k, kv_v, &pad_add, &am_add, false), kRtol, kAtol, "both bool");
  // Float masks: per-head [B*H, L, S] additive mask combined with the bool padding mask.
  Tensor fam = Tensor::randn({B * H, L, S}, gen);
  std::vector<double> fam_add = values(fam);
  expect_close(mha.forward(x, kv_k, kv_v, kpm, fam),
               mha_loops(mha, x, kv_k, kv_v, &pad_add, &fam_add, true), kRtol, kAtol, "float mask");
  // call() with the optional masks.
  expect_close(mha.call({x, kv_k, kv_v, kpm})[0], mha.forward(x, kv_k, kv_v, kpm), 0, 0, "call");

  expect_error([&] { mha.forward(Tensor::randn({B, L, 8}, gen), kv_k, kv_v); },
               {"MultiheadAttention", "embed_dim=12", "[2, 5, 8]"});
  expect_error([&] { mha.forward(x, kv_k, kv_v, Tensor::ones({B, L}, DType::Bool)); },
               {"key_padding_mask", "[2, 7]"});
  expect_error([&] { mha.forward(x, kv_k, kv_v, Tensor(), Tensor::ones({S, L}, DType::Bool)); },
               {"attn_mask"});
  expect_error([&] { MultiheadAttention(10, 3); }, {"multiple of num_heads"});
}

TEST(Layers, ForwardThroughSavedWeightsIsIdentical) {
  // A model saved and loaded into a differently seeded copy computes bit-identical outputs.
  TempDir dir;
  Generator g1(60), g2(61), gx(62);
  auto make = [](Generator& g) {
    auto s = std::make_shared<Sequential>();
    s->push_back(std::make_shared<Conv2d>(Conv2dOptions{.in_channels = 3, .out_channels = 4,
                                                        .kernel_size = {3, 3}, .padding = {1, 1}}, g));
    s->push_back(std::make_shared<BatchNorm2d>(4, 1e-5, true, g));
    s->push_back(std::make_shared<ReLU>());
    s->push_back(std::make_shared<Flatten>());
    s->push_back(std::make_shared<Linear>(4 * 5 * 5, 3, true, g));
    s->eval();
    return s;
  };
  auto a = make(g1), b = make(g2);
  Tensor x = Tensor::randn({2, 3, 5, 5}, gx);
  Tensor ya = a->forward(x);
  EXPECT_FALSE(bitwise_equal(ya, b->forward(x)));
  std::string path = dir.file("m.safetensors");
  a->save(path);
  b->load(path);
  EXPECT_TRUE(bitwise_equal(ya, b->forward(x)));
}

}  // namespace
}  // namespace kiln::nn
