// prebuild_launches (runtime/launch_library.h): the slow part of rebuilding a package's launches,
// run once per distinct key on several threads. A made-up launch kind stands in for cuDNN's (its
// prebuild counts its runs), so this runs on any machine.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/launch_library.h"

namespace kiln {
namespace {

std::atomic<int> g_runs{0};

// params: "<key>" or "<key>:fail" (the prebuild throws) or "!" (the key function throws).
const bool g_registered = [] {
  register_launch_kind(
      "test_prebuild", Device::cpu(),
      [](const LaunchRecord&, LaunchEnv&, const std::string& where) -> Executable::Launch {
        fail("{}: not rebuilt in this test", where);
      },
      {},
      [](const LaunchRecord& r, const LaunchEnv&, const std::string&) -> std::shared_ptr<void> {
        ++g_runs;
        if (r.params.find(":fail") != std::string::npos) throw std::runtime_error("refused");
        return std::make_shared<std::string>(r.params);
      },
      [](const LaunchRecord& r) -> std::string {
        if (r.params == "!") throw std::runtime_error("malformed");
        return r.params.substr(0, r.params.find(':'));
      });
  register_launch_kind(
      "test_prebuild_unkeyed", Device::cpu(),
      [](const LaunchRecord&, LaunchEnv&, const std::string& where) -> Executable::Launch {
        fail("{}: not rebuilt in this test", where);
      },
      {},
      [](const LaunchRecord& r, const LaunchEnv&, const std::string&) -> std::shared_ptr<void> {
        ++g_runs;
        return std::make_shared<std::string>(r.params);
      });
  return true;
}();

std::vector<std::shared_ptr<void>> prebuild(const std::vector<LaunchRecord>& records, int threads) {
  std::vector<std::string> where;
  for (size_t i = 0; i < records.size(); ++i) where.push_back("launch " + std::to_string(i));
  LaunchEnv env;
  return prebuild_launches(records, env, where, threads);
}

std::string text(const std::shared_ptr<void>& p) {
  return p ? *static_cast<const std::string*>(p.get()) : std::string("<null>");
}

TEST(LaunchPrebuild, EqualKeysShareOneResultBuiltOnce) {
  for (int threads : {1, 4}) {
    g_runs = 0;
    std::vector<LaunchRecord> r = {{"test_prebuild", "a"}, {"loop", "{}"}, {"test_prebuild", "b"},
                                   {"test_prebuild", "a"}, {"test_prebuild", "b"},
                                   {"test_prebuild", "c"}, {"test_prebuild", "a"}};
    std::vector<std::shared_ptr<void>> out = prebuild(r, threads);
    ASSERT_EQ(out.size(), r.size());
    EXPECT_EQ(g_runs.load(), 3) << threads << " threads";  // a, b, c
    EXPECT_EQ(out[1], nullptr);  // a kind without a prebuild
    EXPECT_EQ(text(out[0]), "a");
    EXPECT_EQ(text(out[2]), "b");
    EXPECT_EQ(text(out[5]), "c");
    EXPECT_EQ(out[3].get(), out[0].get());  // the same object, not an equal one
    EXPECT_EQ(out[6].get(), out[0].get());
    EXPECT_EQ(out[4].get(), out[2].get());
    EXPECT_NE(out[0].get(), out[2].get());
  }
}

TEST(LaunchPrebuild, AFailedPrebuildLeavesEveryRecordOfItsKeyToRebuild) {
  g_runs = 0;
  std::vector<LaunchRecord> r = {{"test_prebuild", "x:fail"}, {"test_prebuild", "x"},
                                 {"test_prebuild", "y"}};
  std::vector<std::shared_ptr<void>> out = prebuild(r, 2);
  EXPECT_EQ(g_runs.load(), 2);
  EXPECT_EQ(out[0], nullptr);
  EXPECT_EQ(out[1], nullptr);  // shares the failed result: its rebuild does the work
  EXPECT_EQ(text(out[2]), "y");
}

TEST(LaunchPrebuild, RecordsWithoutAKeyArePrebuiltAlone) {
  g_runs = 0;
  std::vector<LaunchRecord> r = {{"test_prebuild", "!"}, {"test_prebuild", "!"},
                                 {"test_prebuild_unkeyed", "k"}, {"test_prebuild_unkeyed", "k"}};
  std::vector<std::shared_ptr<void>> out = prebuild(r, 3);
  EXPECT_EQ(g_runs.load(), 4);
  EXPECT_EQ(text(out[0]), "!");
  EXPECT_EQ(text(out[1]), "!");
  EXPECT_NE(out[0].get(), out[1].get());
  EXPECT_NE(out[2].get(), out[3].get());
  EXPECT_EQ(text(out[3]), "k");
}

}  // namespace
}  // namespace kiln
