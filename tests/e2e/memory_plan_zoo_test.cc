// The memory planner on the captured graphs of zoo models: every plan verifies, reuse beats the
// naive layout, and the arena is reported next to the naive sum and the peak of live bytes
// (a lower bound no offset assignment can beat). The numbers are in docs/memory.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "capture/compile.h"
#include "nn/compile.h"
#include "ir/parser.h"
#include "lower/memory_planner.h"
#include "nn/models/zoo.h"
#include "passes/pass.h"

using namespace kiln;

namespace {

// The most bytes live at one node: a lower bound on any arena for this liveness.
int64_t peak_live_bytes(const MemoryPlan& plan) {
  std::vector<int64_t> live(size_t(plan.num_nodes) + 1, 0);
  for (const PlanBuffer& b : plan.buffers)
    for (int32_t i = b.begin; i <= b.end; ++i) live[size_t(i)] += b.bytes;
  return *std::max_element(live.begin(), live.end());
}

class MemoryPlanZoo : public testing::TestWithParam<std::string> {};

TEST_P(MemoryPlanZoo, PlansCapturedGraphs) {
  nn::ZooModel m = nn::make_zoo_model(GetParam(), 1, 7);
  CompiledFunction f = compile(m.module);
  (void)f(m.inputs);
  ExplainReport r = f.report();
  ASSERT_FALSE(r.graphs.empty());
  for (size_t gi = 0; gi < r.graphs.size(); ++gi) {
    Graph g = parse_graph(r.graphs[gi].ir, GetParam());
    MemoryPlan plan = plan_memory(g);
    ASSERT_NO_THROW(verify_memory_plan(g, plan));
    PlanOptions no_inplace;
    no_inplace.in_place = false;
    MemoryPlan plain = plan_memory(g, no_inplace);
    ASSERT_NO_THROW(verify_memory_plan(g, plain, no_inplace));
    int counts[6] = {};
    for (const ValuePlan& p : plan.values) ++counts[int(p.kind)];
    int64_t peak = peak_live_bytes(plan);
    EXPECT_GE(plan.arena_bytes, peak);
    EXPECT_LT(plan.arena_bytes, plan.naive_bytes);
    EXPECT_LE(plan.arena_bytes, plain.arena_bytes + plain.arena_bytes / 10)
        << "in-place should not make the arena much larger";
    std::printf(
        "[memory] %s graph %zu: %zu nodes; arena %lld bytes, naive %lld bytes (%.1f%% saved), "
        "peak live %lld; without in-place: arena %lld; alloc %d, in-place %d, view %d, "
        "external %d, copy %d\n",
        GetParam().c_str(), gi, g.nodes.size(), (long long)plan.arena_bytes,
        (long long)plan.naive_bytes,
        100.0 * double(plan.naive_bytes - plan.arena_bytes) / double(plan.naive_bytes),
        (long long)peak, (long long)plain.arena_bytes, counts[int(PlanKind::Alloc)],
        counts[int(PlanKind::InPlace)], counts[int(PlanKind::View)],
        counts[int(PlanKind::External)], counts[int(PlanKind::Copy)]);
    // After the default pass pipeline (fusion removes intermediates; the parsed params carry
    // no data, so folding passes see them only as typed values).
    run_passes(g, default_pipeline());
    MemoryPlan opt = plan_memory(g);
    ASSERT_NO_THROW(verify_memory_plan(g, opt));
    EXPECT_LE(opt.naive_bytes, plan.naive_bytes);
    std::printf("[memory] %s graph %zu after the default passes: %zu nodes; arena %lld bytes, "
                "naive %lld bytes (%.1f%% saved), peak live %lld\n",
                GetParam().c_str(), gi, g.nodes.size(), (long long)opt.arena_bytes,
                (long long)opt.naive_bytes,
                100.0 * double(opt.naive_bytes - opt.arena_bytes) / double(opt.naive_bytes),
                (long long)peak_live_bytes(opt));
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, MemoryPlanZoo,
                         testing::Values("resnet18", "resnet50", "bert_base", "vit_b_16"),
                         [](const auto& info) { return info.param; });

}  // namespace
