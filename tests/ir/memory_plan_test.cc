// The memory planner (src/lower/memory_planner.h): exact offsets and reuse on small IR graphs,
// and a randomized check that executing a graph with every value stored in its planned arena
// slice gives exactly the interpreter's outputs.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "ops/dispatch.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "lower/memory_planner.h"

using namespace kiln;

namespace {

struct Planned {
  Graph g;
  MemoryPlan plan;
  const ValuePlan& at(const char* name) const {
    ValueId v = g.find_value(name);
    EXPECT_NE(v, kNoValue) << name;
    return plan.values[size_t(v)];
  }
  ValueId id(const char* name) const { return g.find_value(name); }
};

Planned plan_text(const char* text, PlanOptions opts = {}) {
  Planned p{parse_graph(text, "test"), {}};
  p.plan = plan_memory(p.g, opts);
  verify_memory_plan(p.g, p.plan, opts);
  return p;
}

TEST(MemoryPlan, ChainRunsInPlace) {
  // f32[16] = 64 bytes: one buffer for the whole chain.
  const char* text = R"(graph @chain(%x: f32[16]) {
    %a = exp(%x)
    %b = neg(%a)
    %c = tanh(%b)
    return %c
  })";
  Planned p = plan_text(text);
  EXPECT_EQ(p.at("a").kind, PlanKind::Alloc);
  EXPECT_EQ(p.at("b").kind, PlanKind::InPlace);
  EXPECT_EQ(p.at("b").in_place_of, p.id("a"));
  EXPECT_EQ(p.at("c").in_place_of, p.id("b"));
  EXPECT_EQ(p.plan.buffers.size(), 1u);
  EXPECT_EQ(p.plan.arena_bytes, 64);
  EXPECT_EQ(p.plan.naive_bytes, 192);
  std::string table = memory_plan_str(p.g, p.plan);
  EXPECT_NE(table.find("in-place of %a"), std::string::npos) << table;
  EXPECT_NE(table.find("arena 64 bytes, naive 192 bytes (66.7% saved)"), std::string::npos)
      << table;

  // Without in-place: a [0,1] and c [2,3] share offset 0, b [1,2] sits at 64.
  PlanOptions no_inplace;
  no_inplace.in_place = false;
  Planned q = plan_text(text, no_inplace);
  EXPECT_EQ(q.at("a").offset, 0);
  EXPECT_EQ(q.at("b").offset, 64);
  EXPECT_EQ(q.at("c").offset, 0);
  EXPECT_EQ(q.plan.arena_bytes, 128);
  // And without reuse, every buffer gets its own slot.
  no_inplace.reuse = false;
  Planned r = plan_text(text, no_inplace);
  EXPECT_EQ(r.plan.arena_bytes, 192);
  EXPECT_EQ(r.plan.naive_bytes, 192);
}

TEST(MemoryPlan, Diamond) {
  Planned p = plan_text(R"(graph @diamond(%x: f32[16]) {
    %a = exp(%x)
    %b = neg(%a)
    %c = tanh(%a)
    %d = add(%b, %c)
    return %d
  })");
  // %a is still read by %c when %b runs: %b allocates. %c is %a's last reader: in place.
  EXPECT_EQ(p.at("b").kind, PlanKind::Alloc);
  EXPECT_EQ(p.at("c").kind, PlanKind::InPlace);
  EXPECT_EQ(p.at("c").in_place_of, p.id("a"));
  EXPECT_EQ(p.at("d").in_place_of, p.id("b"));
  EXPECT_EQ(p.at("a").offset, 0);
  EXPECT_EQ(p.at("b").offset, 64);
  EXPECT_EQ(p.at("d").offset, 64);
  EXPECT_EQ(p.plan.arena_bytes, 128);
  EXPECT_EQ(p.plan.naive_bytes, 256);
}

TEST(MemoryPlan, GreedyBySizeReusesTheLowestFreeOffset) {
  // f32[8, 32] = 1024 bytes; f32[8, 1] = 32 -> 64 aligned; f32[32] = 128.
  Planned p = plan_text(R"(graph @sizes(%x: f32[8, 32]) {
    %a = exp(%x)
    %s = sum(%a) {dims=[1], keepdim=true}
    %b = mul(%x, %s)
    %t = sum(%b) {dims=[0]}
    return %t
  })");
  // Largest first: %a [0,1] at 0; %b [2,3] is not live with %a: also 0; %t [3,4] overlaps %b:
  // 1024; %s [1,2] overlaps %a and %b but not %t: the lowest free offset is 1024.
  EXPECT_EQ(p.at("a").offset, 0);
  EXPECT_EQ(p.at("b").offset, 0);
  EXPECT_EQ(p.at("t").offset, 1024);
  EXPECT_EQ(p.at("s").offset, 1024);
  EXPECT_EQ(p.at("s").bytes, 64);
  EXPECT_EQ(p.plan.arena_bytes, 1152);
  EXPECT_EQ(p.plan.naive_bytes, 2240);
}

TEST(MemoryPlan, ViewsExtendTheLifeOfTheirBuffer) {
  Planned p = plan_text(R"(graph @views(%x: f32[16]) {
    %a = exp(%x)
    %r = reshape(%a) {shape=[4, 4]}
    %b = neg(%x)
    %c = mul(%r, %r)
    return %c, %b
  })");
  EXPECT_EQ(p.at("r").kind, PlanKind::View);
  EXPECT_EQ(p.at("r").alias_of, p.id("a"));
  EXPECT_EQ(p.at("r").bytes, 0);
  EXPECT_EQ(p.at("r").offset, p.at("a").offset);
  // %a's buffer lives until %c reads %r (node 3), so neither %b nor %c may take it, and %c
  // (input a view, not the buffer's owner) does not run in place.
  EXPECT_EQ(p.plan.buffers[size_t(p.at("a").buffer)].end, 3);
  EXPECT_EQ(p.at("c").kind, PlanKind::Alloc);
  EXPECT_EQ(p.at("a").offset, 0);
  EXPECT_EQ(p.at("b").offset, 64);
  EXPECT_EQ(p.at("c").offset, 128);
  EXPECT_EQ(p.plan.arena_bytes, 192);
}

TEST(MemoryPlan, NoInPlaceWhenAnotherInputAliasesTheBuffer) {
  // add(a, transpose(a)) in place would overwrite a[i][j] before transpose reads it.
  Planned p = plan_text(R"(graph @hazard(%x: f32[4, 4]) {
    %a = exp(%x)
    %t = transpose(%a) {dim0=0, dim1=1}
    %d = add(%a, %t)
    return %d
  })");
  EXPECT_EQ(p.at("d").kind, PlanKind::Alloc);
  EXPECT_EQ(p.at("d").offset, 64);
  // The same value twice is safe: out[k] = a[k] + a[k].
  Planned q = plan_text(R"(graph @same(%x: f32[4, 4]) {
    %a = exp(%x)
    %d = add(%a, %a)
    return %d
  })");
  EXPECT_EQ(q.at("d").kind, PlanKind::InPlace);
  EXPECT_EQ(q.plan.arena_bytes, 64);
}

TEST(MemoryPlan, NoInPlaceAcrossDtypesShapesOrLiveInputs) {
  Planned p = plan_text(R"(graph @rules(%x: f32[4, 4], %y: f32[4]) {
    %a = exp(%x)
    %g = gt(%a, %a)
    %y2 = exp(%y)
    %b = exp(%x)
    %c = add(%y2, %b)
    %e = neg(%x)
    return %g, %c, %e
  })");
  EXPECT_EQ(p.at("g").kind, PlanKind::Alloc);  // bool output over an f32 input
  EXPECT_EQ(p.at("c").kind, PlanKind::Alloc);  // first input f32[4] broadcast to f32[4, 4]
  EXPECT_EQ(p.at("e").kind, PlanKind::Alloc);  // first input is a graph input
  // An output's buffer lives to the end: nothing writes over it.
  Planned q = plan_text(R"(graph @out(%x: f32[16]) {
    %a = exp(%x)
    %b = neg(%a)
    return %a, %b
  })");
  EXPECT_EQ(q.at("b").kind, PlanKind::Alloc);
  EXPECT_EQ(q.at("a").last_use, 2);
  EXPECT_EQ(q.plan.arena_bytes, 128);
}

TEST(MemoryPlan, OutputsGetTheirOwnMemory) {
  Planned p = plan_text(R"(graph @outs(%x: f32[16]) {
    %a = exp(%x)
    %r = reshape(%a) {shape=[4, 4]}
    %v = unsqueeze(%x) {dims=[1]}
    %w = unsqueeze(%x) {dims=[0]}
    %n = neg(%w)
    return %a, %r, %v, %n
  })");
  EXPECT_EQ(p.at("a").kind, PlanKind::Alloc);
  EXPECT_EQ(p.at("r").kind, PlanKind::Copy);  // would share %a's buffer
  EXPECT_EQ(p.at("v").kind, PlanKind::Copy);  // would alias the graph input
  EXPECT_EQ(p.at("w").kind, PlanKind::External);
  EXPECT_EQ(p.at("w").buffer, -1);
  EXPECT_EQ(p.at("n").kind, PlanKind::Alloc);
  std::set<int64_t> offsets;
  for (const char* o : {"a", "r", "v", "n"}) offsets.insert(p.at(o).offset);
  EXPECT_EQ(offsets.size(), 4u);
  EXPECT_EQ(p.plan.arena_bytes, 256);
}

TEST(MemoryPlan, ReshapeOfAViewMayCopy) {
  Planned p = plan_text(R"(graph @rv(%x: f32[4, 4]) {
    %a = exp(%x)
    %t = transpose(%a) {dim0=0, dim1=1}
    %f = reshape(%t) {shape=[16]}
    %u = reshape(%a) {shape=[16]}
    %c = add(%f, %u)
    return %c
  })");
  EXPECT_EQ(p.at("t").kind, PlanKind::View);
  EXPECT_EQ(p.at("f").kind, PlanKind::Copy);  // a transposed buffer cannot be viewed flat
  EXPECT_EQ(p.at("u").kind, PlanKind::View);
  EXPECT_NE(p.at("f").offset, p.at("a").offset);
}

TEST(MemoryPlan, SameOutputTwice) {
  Planned p = plan_text(R"(graph @twice(%x: f32[16]) {
    %a = exp(%x)
    %b = neg(%a)
    return %b, %b, %a
  })");
  EXPECT_EQ(p.at("b").kind, PlanKind::Alloc);
  EXPECT_NE(p.at("a").offset, p.at("b").offset);
}

TEST(MemoryPlan, SymbolicShapesAreNotSupported) {
  Graph g = parse_graph(R"(graph @sym(%x: f32[n, 4]) {
    %a = exp(%x)
    return %a
  })", "test");
  try {
    (void)plan_memory(g, {});
    FAIL() << "expected NotSupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotSupported);
    EXPECT_NE(std::string(e.what()).find("'%a'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f32[n, 4]"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, VerifyCatchesOverlap) {
  Planned p = plan_text(R"(graph @two(%x: f32[16]) {
    %a = exp(%x)
    %b = neg(%x)
    %c = add(%a, %b)
    return %c
  })");
  MemoryPlan bad = p.plan;
  int32_t ba = bad.values[size_t(p.id("a"))].buffer, bb = bad.values[size_t(p.id("b"))].buffer;
  ASSERT_NE(bad.buffers[size_t(ba)].offset, bad.buffers[size_t(bb)].offset);
  bad.buffers[size_t(bb)].offset = bad.buffers[size_t(ba)].offset;
  bad.values[size_t(p.id("b"))].offset = bad.buffers[size_t(ba)].offset;
  EXPECT_THROW(verify_memory_plan(p.g, bad), Error);
}

// ---- randomized: plan, verify, and execute in the arena --------------------------------------

// Runs g node by node through call_op, storing every planned value in its arena slice (views
// alias the arena through their input) and poisoning each buffer right after its last use, so
// a value read after its memory was reused or freed would change the outputs.
// With node_scratch, each node with scratch fills its scratch with garbage before and after
// its outputs are stored (a library kernel uses it while it runs): a scratch placed over a
// value still to be read, or over the node's own outputs, changes the outputs.
TensorList run_in_arena(const Graph& g, const MemoryPlan& plan, const TensorList& inputs,
                        const std::vector<int64_t>& node_scratch = {}) {
  std::vector<uint64_t> words(size_t(plan.arena_bytes / 8 + 8));
  auto* arena = reinterpret_cast<uint8_t*>(words.data());
  std::memset(arena, 0xA5, size_t(plan.arena_bytes));
  std::vector<Tensor> env(g.values.size());
  // Staged inputs (Note [Input staging in the arena]) are copied into the arena first, as the
  // runtime does, and read from there.
  const bool staged = !plan.staging_offset.empty();
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    env[size_t(g.inputs[i])] = inputs[i];
    if (!staged) continue;
    Tensor slot = Tensor::from_blob(arena + plan.staging_offset[i], inputs[i].sizes(), inputs[i].dtype());
    slot.copy_(inputs[i]);
    env[size_t(g.inputs[i])] = slot;
  }
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].kind == ValueKind::Param || g.values[v].kind == ValueKind::Const)
      env[v] = g.values[v].data;
  std::vector<std::vector<size_t>> dying(g.nodes.size());
  for (size_t b = 0; b < plan.buffers.size(); ++b)
    if (plan.buffers[b].end < plan.num_nodes) dying[size_t(plan.buffers[b].end)].push_back(b);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    TensorList ins;
    for (ValueId in : node.inputs) ins.push_back(in == kNoValue ? Tensor() : env[size_t(in)]);
    TensorList outs = call_op(node.op, ins, node.attrs);
    auto scribble = [&](uint8_t byte) {
      if (i < node_scratch.size() && node_scratch[i] > 0)
        std::memset(arena + plan.scratch_offset[i], byte, size_t(node_scratch[i]));
    };
    scribble(0xEE);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      ValueId o = node.outputs[k];
      const ValuePlan& p = plan.values[size_t(o)];
      if (p.kind == PlanKind::View || p.kind == PlanKind::External) {
        auto* data = static_cast<uint8_t*>(outs[k].raw_data());
        bool in_arena = data >= arena && data < arena + plan.arena_bytes;
        EXPECT_EQ(in_arena, p.kind == PlanKind::View || (staged && p.kind == PlanKind::External))
            << g.value(o).name;
        env[size_t(o)] = outs[k];
      } else {
        Tensor slot = Tensor::from_blob(arena + p.offset, outs[k].sizes(), outs[k].dtype());
        slot.copy_(outs[k]);
        env[size_t(o)] = slot;
      }
    }
    scribble(0xDD);
    for (size_t b : dying[i])
      std::memset(arena + plan.buffers[b].offset, 0xFF, size_t(plan.buffers[b].bytes));
  }
  TensorList result;
  for (ValueId o : g.outputs) result.push_back(env[size_t(o)].clone());
  return result;
}

// A random DAG of elementwise and view ops over f32 values.
Graph random_graph(Generator& gen, int n_nodes) {
  auto pick = [&](size_t n) { return size_t(gen.next_u64() % n); };
  Graph g;
  g.add_input("x0", TensorType(DType::Float32, Shape{4, 6}));
  g.add_input("x1", TensorType(DType::Float32, Shape{4, 6}));
  g.add_input("x2", TensorType(DType::Float32, Shape{6}));
  std::vector<ValueId> pool = {0, 1, 2};
  // Only exactly rounded ops: a kernel's contiguous fast path and its strided path then give
  // the same bits, so any difference from the interpreter is a planning bug (a Copy changes the
  // layout a later op reads). clamp keeps chains of mul finite.
  const OpId unary[] = {OpId::Neg, OpId::Relu, OpId::Abs, OpId::Clamp, OpId::Clamp};
  const OpId binary[] = {OpId::Add, OpId::Sub, OpId::Mul, OpId::Maximum};
  auto add_unary = [&](ValueId a) {
    OpId op = unary[pick(5)];
    return op == OpId::Clamp ? g.add_node1(op, {a}, {{"min", -1.5}, {"max", 1.5}})
                             : g.add_node1(op, {a});
  };
  for (int i = 0; i < n_nodes; ++i) {
    // Recent values are more likely operands, which makes chains and in-place chances.
    auto operand = [&] {
      size_t n = pool.size();
      return gen.uniform() < 0.6 ? pool[n - 1 - pick(std::min<size_t>(n, 3))] : pool[pick(n)];
    };
    ValueId a = operand();
    const Shape& s = g.type(a).shape;
    int r = int(s.size());
    double u = gen.uniform();
    ValueId out;
    if (u < 0.3) {
      out = add_unary(a);
    } else if (u < 0.6) {
      // A second operand of the same shape (maybe a itself), or one that broadcasts into it.
      std::vector<ValueId> same;
      for (ValueId v : pool)
        if (g.type(v).shape == s) same.push_back(v);
      ValueId b = same[pick(same.size())];
      out = gen.uniform() < 0.5 ? g.add_node1(binary[pick(4)], {a, b})
                                : g.add_node1(binary[pick(4)], {b, a});
    } else {
      int kind = int(pick(5));
      if (kind == 0 && r >= 2) {
        out = g.add_node1(OpId::Transpose, {a}, {{"dim0", int64_t(0)}, {"dim1", int64_t(r - 1)}});
      } else if (kind == 1) {
        out = g.add_node1(OpId::Reshape, {a}, {{"shape", Ints{numel(s).value()}}});
      } else if (kind == 2 && r < 3) {
        out = g.add_node1(OpId::Unsqueeze, {a}, {{"dims", Ints{0}}});
      } else if (kind == 3 && s[0].value() > 1) {
        out = g.add_node1(OpId::Slice, {a},
                          {{"dim", int64_t(0)}, {"start", int64_t(1)}, {"end", s[0].value()}});
      } else if (r >= 1 && s[0].value() == 1) {
        Ints shape(size_t(r), -1);
        shape[0] = 3;
        out = g.add_node1(OpId::Expand, {a}, {{"shape", shape}});
      } else {
        out = add_unary(a);
      }
    }
    pool.push_back(out);
  }
  // 1 to 3 distinct outputs, the last node's value always among them.
  std::vector<ValueId> outs = {pool.back()};
  int extra = int(pick(3));
  for (int k = 0; k < extra; ++k) {
    ValueId v = pool[3 + pick(pool.size() - 3)];
    if (std::find(outs.begin(), outs.end(), v) == outs.end()) outs.push_back(v);
  }
  g.outputs = outs;
  return g;
}

TEST(MemoryPlan, RandomGraphsRunInTheirArena) {
  Generator gen(20261129);
  std::map<PlanKind, int> kinds;
  int64_t arena = 0, naive = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Graph g = random_graph(gen, 4 + int(gen.next_u64() % 20));
    MemoryPlan plan = plan_memory(g, {});
    ASSERT_NO_THROW(verify_memory_plan(g, plan)) << "trial " << trial;
    for (const ValuePlan& p : plan.values) ++kinds[p.kind];
    arena += plan.arena_bytes;
    naive += plan.naive_bytes;
    TensorList inputs = {Tensor::randn({4, 6}, gen), Tensor::randn({4, 6}, gen),
                         Tensor::randn({6}, gen)};
    TensorList expected = run(g, inputs);
    TensorList got = run_in_arena(g, plan, inputs);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].sizes(), expected[i].sizes()) << "trial " << trial;
      auto e = expected[i].to_vector<float>(), a = got[i].to_vector<float>();
      ASSERT_EQ(std::memcmp(e.data(), a.data(), e.size() * sizeof(float)), 0)
          << "trial " << trial << " output " << i << "\n"
          << print_graph(g) << memory_plan_str(g, plan);
    }
  }
  // The random graphs exercise every kind of plan, and reuse pays.
  for (PlanKind k : {PlanKind::Alloc, PlanKind::InPlace, PlanKind::View, PlanKind::External,
                     PlanKind::Copy})
    EXPECT_GT(kinds[k], 10) << plan_kind_name(k);
  EXPECT_LT(arena, naive);
}

// random_graph's graphs on fresh inputs, run in their planned arena (scratch scribbled as
// run_in_arena does): the interpreter's bits.
void expect_arena_run_bitwise(const Graph& g, const MemoryPlan& plan, Generator& gen,
                              const std::vector<int64_t>& node_scratch, int trial) {
  TensorList inputs = {Tensor::randn({4, 6}, gen), Tensor::randn({4, 6}, gen),
                       Tensor::randn({6}, gen)};
  TensorList expected = run(g, inputs);
  TensorList got = run_in_arena(g, plan, inputs, node_scratch);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    auto e = expected[i].to_vector<float>(), a = got[i].to_vector<float>();
    ASSERT_EQ(e.size(), a.size());
    ASSERT_EQ(std::memcmp(e.data(), a.data(), e.size() * sizeof(float)), 0)
        << "trial " << trial << " output " << i << "\n"
        << print_graph(g) << memory_plan_str(g, plan);
  }
}

// How many (selected buffer, value buffer) pairs share arena bytes.
int overlaps_with_values(const MemoryPlan& plan, bool (*selected)(const PlanBuffer&)) {
  int n = 0;
  for (const PlanBuffer& b : plan.buffers) {
    if (!selected(b)) continue;
    for (const PlanBuffer& o : plan.buffers)
      if (o.staging_of < 0 && o.scratch_of < 0 && o.bytes > 0 && o.offset < b.offset + b.bytes &&
          b.offset < o.offset + o.bytes)
        ++n;
  }
  return n;
}

// Note [Scratch per step]: random nodes get scratch; executing in the arena with each scratch
// scribbled over while its node runs gives the interpreter's bits, and scratch does share
// memory with values (else the test would not exercise the placement).
TEST(MemoryPlan, RandomGraphsWithScratchRunInTheirArena) {
  Generator gen(20261206);
  int shared = 0, scratch_nodes = 0;
  int64_t arena = 0, separate = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Graph g = random_graph(gen, 4 + int(gen.next_u64() % 20));
    PlanOptions po;
    po.scratch_alignment = 64;
    po.node_scratch.assign(g.nodes.size(), 0);
    int64_t largest = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (gen.uniform() < 0.5) {
        po.node_scratch[i] = 8 * int64_t(1 + gen.next_u64() % 40);  // 8 to 320 bytes
        largest = std::max(largest, (po.node_scratch[i] + 63) / 64 * 64);
        ++scratch_nodes;
      }
    MemoryPlan plan = plan_memory(g, po);
    ASSERT_NO_THROW(verify_memory_plan(g, plan, po)) << "trial " << trial;
    MemoryPlan values_only = plan_memory(g, {});
    arena += plan.arena_bytes;
    separate += values_only.arena_bytes + largest;
    EXPECT_LE(plan.arena_bytes, values_only.arena_bytes + largest) << "trial " << trial;
    shared += overlaps_with_values(plan, [](const PlanBuffer& b) { return b.scratch_of >= 0; });
    expect_arena_run_bitwise(g, plan, gen, po.node_scratch, trial);
    if (testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(scratch_nodes, 500);
  EXPECT_GT(shared, 100);
  EXPECT_LT(arena, separate);
}

// Note [Input staging in the arena]: with every input staged (and random scratch), executing
// in the arena, each input copied into its staging first and the staging poisoned after its
// last read, gives the interpreter's bits; staging does share memory with values, and no
// arena exceeds the values' layout with the staging after it.
TEST(MemoryPlan, RandomGraphsWithStagedInputsRunInTheirArena) {
  Generator gen(20261207);
  int shared = 0;
  int64_t arena = 0, separate = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Graph g = random_graph(gen, 4 + int(gen.next_u64() % 20));
    PlanOptions po;
    po.stage_inputs = true;
    po.scratch_alignment = 64;
    po.node_scratch.assign(g.nodes.size(), 0);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (gen.uniform() < 0.3) po.node_scratch[i] = 8 * int64_t(1 + gen.next_u64() % 40);
    MemoryPlan plan = plan_memory(g, po);
    ASSERT_NO_THROW(verify_memory_plan(g, plan, po)) << "trial " << trial << "\n"
                                                     << memory_plan_str(g, plan);
    ASSERT_EQ(plan.staging_offset.size(), g.inputs.size());
    PlanOptions unstaged = po;
    unstaged.stage_inputs = false;
    const int64_t values_only = plan_memory(g, unstaged).arena_bytes;
    const int64_t block = 128 + 128 + 64;  // the three inputs, each in its own staging
    arena += plan.arena_bytes;
    separate += values_only + block;
    EXPECT_LE(plan.arena_bytes, values_only + block) << "trial " << trial;
    shared += overlaps_with_values(plan, [](const PlanBuffer& b) { return b.staging_of >= 0; });
    expect_arena_run_bitwise(g, plan, gen, po.node_scratch, trial);
    if (testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(shared, 100);
  EXPECT_LT(arena, separate);
}

// Staging lives until the input's last read, through views; an input returned as an output
// keeps it to the end; verify refuses staging over a live value, too short or too small.
TEST(MemoryPlan, InputStagingTakesDeadMemory) {
  const char* text = R"(graph @s(%x: f32[256], %y: f32[16]) {
    %a = exp(%x)
    %b = sum(%a)
    %c = neg(%y)
    %d = add(%c, %b)
    %e = exp(%d)
    return %e
  })";
  Graph g = parse_graph(text, "test");
  PlanOptions po;
  po.in_place = false;
  po.stage_inputs = true;
  MemoryPlan plan = plan_memory(g, po);
  verify_memory_plan(g, plan, po);
  ASSERT_EQ(plan.staging_offset.size(), 2u);
  // x's staging (1024 bytes) and a (1024) are live together at step 0 only; y's (64, live
  // over [0, 2]) beside them; b, c, d, e reuse x's memory.
  EXPECT_EQ(plan.arena_bytes, 2048 + 64) << memory_plan_str(g, plan);
  EXPECT_EQ(plan.values[size_t(g.find_value("b"))].offset, plan.staging_offset[0]);
  EXPECT_NE(memory_plan_str(g, plan).find("input staging"), std::string::npos);
  auto staging = [](MemoryPlan& p, int k) -> PlanBuffer& {
    for (PlanBuffer& b : p.buffers)
      if (b.staging_of == k) return b;
    throw std::runtime_error("no staging buffer");
  };
  {
    MemoryPlan bad = plan;  // y's staging over a, live at step 0
    const int64_t a_at = bad.values[size_t(g.find_value("a"))].offset;
    staging(bad, 1).offset = a_at;
    bad.staging_offset[1] = a_at;
    try {
      verify_memory_plan(g, bad, po);
      ADD_FAILURE() << "staging over a live value passed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("staging of input '%y'"), std::string::npos) << e.what();
    }
  }
  {
    MemoryPlan bad = plan;  // y's staging dead before c reads y
    staging(bad, 1).end = 1;
    try {
      verify_memory_plan(g, bad, po);
      ADD_FAILURE() << "staging dead before the input's last read passed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the input over [0, 2]"), std::string::npos) << e.what();
    }
    bad = plan;
    staging(bad, 0).bytes = 512;
    EXPECT_THROW(verify_memory_plan(g, bad, po), Error);
    bad = plan;
    bad.staging_offset.pop_back();
    EXPECT_THROW(verify_memory_plan(g, bad, po), Error);
    PlanOptions unstaged = po;
    unstaged.stage_inputs = false;
    EXPECT_THROW(verify_memory_plan(g, plan, unstaged), Error);
  }
  // A view of an input read late, and an input returned: staged to the view's read, to the end.
  Graph v = parse_graph(R"(graph @v(%x: f32[4, 8], %y: f32[8]) {
    %r = reshape(%x) {shape = [32]}
    %a = exp(%y)
    %b = neg(%a)
    %c = sum(%r)
    return %c, %y
  })", "test");
  MemoryPlan vp = plan_memory(v, po);
  verify_memory_plan(v, vp, po);
  EXPECT_EQ(staging(vp, 0).end, 3) << memory_plan_str(v, vp);
  EXPECT_EQ(staging(vp, 1).end, vp.end_step) << memory_plan_str(v, vp);
}

// Scratch takes memory that is dead at its step: the wide value a, dead after b, leaves room
// for c's scratch, so the arena is the widest step, not every value plus the largest scratch.
TEST(MemoryPlan, ScratchTakesDeadMemory) {
  const char* text = R"(graph @s(%x: f32[256], %y: f32[16]) {
    %a = exp(%x)
    %b = sum(%a)
    %c = neg(%y)
    %d = add(%c, %b)
    return %d
  })";
  Graph g = parse_graph(text, "test");
  PlanOptions po;
  po.in_place = false;
  po.node_scratch = {0, 0, 512, 0};  // c: 512 bytes while it runs
  MemoryPlan plan = plan_memory(g, po);
  verify_memory_plan(g, plan, po);
  // a is 1024 bytes and dies at b; c's scratch and c itself fit in its memory.
  EXPECT_EQ(plan.arena_bytes, 1024 + 64) << memory_plan_str(g, plan);  // + b, live until d
  EXPECT_EQ(plan.scratch_offset[2] % 256, 0);
  EXPECT_EQ(plan.scratch_offset[0], -1);
  EXPECT_NE(memory_plan_str(g, plan).find("scratch"), std::string::npos);

  // verify catches a scratch over a value live at its step, a missing one, a too small one,
  // and one live past its step.
  auto scratch_buffer = [](MemoryPlan& p) -> PlanBuffer& {
    for (PlanBuffer& b : p.buffers)
      if (b.scratch_of >= 0) return b;
    throw std::runtime_error("no scratch buffer");
  };
  {
    MemoryPlan bad = plan;
    const int64_t b_at = bad.values[size_t(g.find_value("b"))].offset;
    scratch_buffer(bad).offset = b_at;
    bad.scratch_offset[2] = b_at;
    try {
      verify_memory_plan(g, bad, po);
      ADD_FAILURE() << "an overlapping scratch passed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scratch of node 2"), std::string::npos) << e.what();
    }
  }
  {
    PlanOptions more = po;
    more.node_scratch[3] = 64;  // d asks for scratch the plan does not have
    EXPECT_THROW(verify_memory_plan(g, plan, more), Error);
    more = po;
    more.node_scratch[2] = 4096;
    EXPECT_THROW(verify_memory_plan(g, plan, more), Error);
  }
  {
    MemoryPlan bad = plan;
    scratch_buffer(bad).end += 1;
    EXPECT_THROW(verify_memory_plan(g, bad, po), Error);
  }
  // Two nodes of one step (a fused kernel's) with scratch each: never one memory.
  PlanOptions shared = po;
  shared.node_step = {0, 1, 2, 2};
  shared.node_scratch = {0, 0, 512, 512};
  MemoryPlan both = plan_memory(g, shared);
  EXPECT_NO_THROW(verify_memory_plan(g, both, shared)) << memory_plan_str(g, both);
  EXPECT_NE(both.scratch_offset[2], both.scratch_offset[3]);

  // A negative request is a bug of the caller.
  PlanOptions negative = po;
  negative.node_scratch[1] = -8;
  EXPECT_THROW(plan_memory(g, negative), Error);
}

}  // namespace
