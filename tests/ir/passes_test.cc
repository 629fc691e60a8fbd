// The pass registry and runner: name lookup, verification after each pass, KILN_DUMP_IR.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pass.h"

namespace kiln {
namespace {

const char* kText =
    "graph @g(%x: f32[n, 4]) {\n"
    "  %a = relu(%x) : f32[n, 4]\n"
    "  %b = neg(%a) : f32[n, 4]\n"
    "  return %b\n"
    "}\n";

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A buggy pass: retypes a value without changing its producer.
class CorruptingPass : public Pass {
 public:
  std::string_view name() const override { return "corrupt"; }
  std::string_view description() const override { return "breaks the graph on purpose"; }
  bool run(Graph& g) override {
    g.value(g.nodes.back().outputs[0]).type.dtype = DType::Float64;
    return true;
  }
};

// A correct pass that changes the graph: appends tanh to the first output.
class AppendTanhPass : public Pass {
 public:
  std::string_view name() const override { return "append_tanh"; }
  std::string_view description() const override { return "adds a tanh"; }
  bool run(Graph& g) override {
    g.outputs[0] = g.add_node1(OpId::Tanh, {g.outputs[0]});
    return true;
  }
};

TEST(Passes, RegistryLookup) {
  std::unique_ptr<Pass> v = find_pass("verify");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->name(), "verify");
  EXPECT_FALSE(v->description().empty());
  for (const PassEntry& e : registered_passes()) EXPECT_EQ(find_pass(e.name)->name(), e.name);
  try {
    find_pass("nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown pass 'nope' (available passes: verify"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(split_pass_list(" a, b,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_pass_list("").empty());
}

TEST(Passes, VerifyChangesNothing) {
  Graph g = parse_graph(kText);
  std::vector<std::string> names = {"verify", "verify"};
  EXPECT_FALSE(run_passes(g, names));
  EXPECT_EQ(print_graph(g), kText);
}

TEST(Passes, ReportsChangesAndCatchesBrokenPasses) {
  Graph g = parse_graph(kText);
  AppendTanhPass tanh_pass;
  std::vector<Pass*> ok = {&tanh_pass};
  EXPECT_TRUE(run_passes(g, std::span<Pass* const>(ok)));
  EXPECT_NE(print_graph(g).find("= tanh(%b) : f32[n, 4]"), std::string::npos);

  CorruptingPass corrupt;
  std::vector<Pass*> bad = {&tanh_pass, &corrupt};
  Graph h = parse_graph(kText);
  try {
    run_passes(h, std::span<Pass* const>(bad));
    ADD_FAILURE() << "the corrupting pass went unnoticed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(std::string(e.what()).find("pass 'corrupt' left an invalid graph"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("has type f64[n, 4], but inference gives f32[n, 4]"),
              std::string::npos)
        << e.what();
  }
  // KILN_VERIFY=0 turns the check off.
  ScopedEnv off("KILN_VERIFY", "0");
  Graph k = parse_graph(kText);
  EXPECT_NO_THROW(run_passes(k, std::span<Pass* const>(bad)));
}

TEST(Passes, DumpIr) {
  std::random_device rd;
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln_dump_ir_test_" + std::to_string(rd()));
  std::filesystem::remove_all(dir);
  {
    ScopedEnv dump("KILN_DUMP_IR", dir.string());
    Graph g = parse_graph(kText);
    AppendTanhPass tanh_pass;
    std::unique_ptr<Pass> verify = find_pass("verify");
    std::vector<Pass*> passes = {verify.get(), &tanh_pass};
    run_passes(g, std::span<Pass* const>(passes));
    auto read = [&](const char* name) {
      std::ifstream in(dir / name);
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    EXPECT_EQ(read("00-input.kir"), kText);
    EXPECT_EQ(read("01-verify.kir"), kText);
    EXPECT_EQ(read("02-append_tanh.kir"), print_graph(g));
    int files = 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) {
      ++files;
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "temp file left behind";
    }
    EXPECT_EQ(files, 3);
  }
  std::filesystem::remove_all(dir);
}

TEST(Passes, InvalidInputGraphIsReported) {
  Graph g = parse_graph(kText);
  g.outputs.push_back(ValueId(77));
  std::vector<std::string> names = {"verify"};
  try {
    run_passes(g, names);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the input to run_passes is invalid"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
