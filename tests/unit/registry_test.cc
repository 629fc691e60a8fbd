// Structural checks of the op registry: every op in ops.def has a whole, consistent record.
// The op harness (tests/ops/op_harness_test.cc) checks the records' behaviour; this file checks
// their shape, so that a half-registered op fails here with a precise message.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../support/compare.h"
#include "ops/op.h"

namespace kiln {
namespace {

// Reports every problem found by `check` over all ops in one failure message.
std::string join(const std::vector<std::string>& problems) {
  std::string s;
  for (const auto& p : problems) s += "\n  " + p;
  return s;
}

bool is_snake_identifier(std::string_view s) {
  if (s.empty() || !std::islower((unsigned char)s[0])) return false;
  for (char c : s)
    if (!(std::islower((unsigned char)c) || std::isdigit((unsigned char)c) || c == '_'))
      return false;
  return true;
}

TEST(Registry, EveryOpHasAWholeRecord) {
  // Inference, a kernel (reference or decomposition), dtypes and test samples for every op in
  // ops.def. Fails while op families are still being written; that is its job.
  std::vector<std::string> problems = registry_problems();
  EXPECT_TRUE(problems.empty()) << problems.size() << " problems:" << join(problems);
}

TEST(Registry, OpsMatchOpsDefInOrder) {
  ASSERT_EQ(all_ops().size(), size_t(kNumOps));
  const char* names[] = {
#define KILN_OP(I, N, F, T) N,
#include "ops/ops.def"
#undef KILN_OP
  };
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& op = all_ops()[size_t(i)];
    EXPECT_EQ(op.id, OpId(i)) << op.name;
    EXPECT_STREQ(op.name, names[i]);
    EXPECT_EQ(&op_def(OpId(i)), &op) << op.name;
  }
}

TEST(Registry, NamesAreUniqueAndFound) {
  std::set<std::string> seen;
  std::vector<std::string> problems;
  for (const OpDef& op : all_ops()) {
    if (!seen.insert(op.name).second) problems.push_back(fmt::format("{}: duplicate name", op.name));
    if (!is_snake_identifier(op.name))
      problems.push_back(fmt::format("'{}': not a lower_snake_case name", op.name));
    if (find_op(op.name) != &op) problems.push_back(fmt::format("{}: find_op misses it", op.name));
  }
  EXPECT_TRUE(problems.empty()) << join(problems);
  EXPECT_EQ(find_op("no_such_op"), nullptr);
  EXPECT_EQ(find_op(""), nullptr);
  EXPECT_EQ(find_op("ADD"), nullptr);  // names are case-sensitive
}

TEST(Registry, FamiliesComeFromTheFamilyList) {
  std::set<std::string> families = {
#define KILN_OP_FAMILY(f) #f,
#include "ops/ops.def"
  };
  std::set<std::string> used;
  for (const OpDef& op : all_ops()) {
    EXPECT_TRUE(families.count(op.family)) << op.name << ": unknown family '" << op.family << "'";
    used.insert(op.family);
  }
  // Every listed family has at least one op (a stale family line would register nothing).
  for (const auto& f : families) EXPECT_TRUE(used.count(f)) << "family '" << f << "' has no ops";
}

bool default_matches(AttrType t, const AttrValue& v) {
  // Strict: the default is stored as the declared type (canonicalize would coerce an int to a
  // float, but a schema should say what it means).
  switch (t) {
    case AttrType::Int: return std::holds_alternative<int64_t>(v);
    case AttrType::Float: return std::holds_alternative<double>(v);
    case AttrType::Bool: return std::holds_alternative<bool>(v);
    case AttrType::String: return std::holds_alternative<std::string>(v);
    case AttrType::Ints: return std::holds_alternative<Ints>(v);
    case AttrType::Floats: return std::holds_alternative<Floats>(v);
    case AttrType::DType: return std::holds_alternative<DType>(v);
  }
  return false;
}

TEST(Registry, AttributeSchemas) {
  std::vector<std::string> problems;
  for (const OpDef& op : all_ops()) {
    std::set<std::string> names;
    for (const AttrSpec& a : op.attrs) {
      if (!is_snake_identifier(a.name))
        problems.push_back(fmt::format("{}: attribute '{}' is not lower_snake_case", op.name, a.name));
      if (!names.insert(a.name).second)
        problems.push_back(fmt::format("{}: attribute '{}' declared twice", op.name, a.name));
      bool has_default = !std::holds_alternative<std::monostate>(a.default_value);
      if (has_default && !default_matches(a.type, a.default_value))
        problems.push_back(fmt::format("{}: attribute '{}' is {} but its default is {}", op.name,
                                       a.name, attr_type_name(a.type),
                                       attr_value_str(a.default_value)));
      if (op.attr_index(a.name) < 0)
        problems.push_back(fmt::format("{}: attr_index misses '{}'", op.name, a.name));
    }
    // Canonicalizing the defaults of an op without required attributes must round-trip.
    bool all_defaulted = true;
    for (const AttrSpec& a : op.attrs)
      all_defaulted &= a.optional || !std::holds_alternative<std::monostate>(a.default_value);
    if (all_defaulted) {
      try {
        Attrs c = op.canonicalize({}, "registry_test");
        if (c.size() != op.attrs.size())
          problems.push_back(fmt::format("{}: canonical attrs have {} entries, schema {}",
                                         op.name, c.size(), op.attrs.size()));
      } catch (const Error& e) {
        problems.push_back(fmt::format("{}: canonicalizing the defaults fails: {}", op.name,
                                       e.what()));
      }
    }
  }
  EXPECT_TRUE(problems.empty()) << join(problems);
}

TEST(Registry, InputSchemas) {
  std::vector<std::string> problems;
  for (const OpDef& op : all_ops()) {
    if (!op.infer) continue;  // an unwritten op is reported by EveryOpHasAWholeRecord
    if (op.inputs.empty()) problems.push_back(fmt::format("{}: no inputs declared", op.name));
    std::set<std::string> names;
    bool seen_optional = false;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const InputSpec& in = op.inputs[i];
      if (!is_snake_identifier(in.name))
        problems.push_back(fmt::format("{}: input {} name '{}' is not lower_snake_case", op.name,
                                       i, in.name));
      if (!names.insert(in.name).second)
        problems.push_back(fmt::format("{}: input '{}' declared twice", op.name, in.name));
      if (in.variadic && i + 1 != op.inputs.size())
        problems.push_back(fmt::format("{}: variadic input '{}' is not last", op.name, in.name));
      // check_arity counts inputs, so optional ones can only be omitted from the end.
      if (!in.optional && seen_optional)
        problems.push_back(fmt::format("{}: required input '{}' follows an optional one",
                                       op.name, in.name));
      seen_optional |= in.optional;
    }
    if (op.num_outputs < 1 && op.num_outputs != -1)
      problems.push_back(fmt::format("{}: num_outputs is {}", op.name, op.num_outputs));
    if (op.doc.empty()) problems.push_back(fmt::format("{}: no doc line", op.name));
    if (!(op.tolerance_scale >= 1.0))
      problems.push_back(fmt::format("{}: tolerance_scale {} < 1", op.name, op.tolerance_scale));
  }
  EXPECT_TRUE(problems.empty()) << join(problems);
}

TEST(Registry, DTypeLists) {
  std::vector<std::string> problems;
  for (const OpDef& op : all_ops()) {
    std::set<int> seen;
    for (DType d : op.dtypes) {
      if (!seen.insert(int(d)).second)
        problems.push_back(fmt::format("{}: dtype {} listed twice", op.name, dtype_name(d)));
      if (!op.supports_dtype(d))
        problems.push_back(fmt::format("{}: supports_dtype({}) is false", op.name, dtype_name(d)));
    }
  }
  EXPECT_TRUE(problems.empty()) << join(problems);
}

// Structural rules for one op's samples; returns problems.
std::vector<std::string> sample_problems(const OpDef& op) {
  std::vector<std::string> problems;
  auto add = [&](std::string p) { problems.push_back(fmt::format("{}: {}", op.name, p)); };
  Generator g1(1234), g2(1234), g3(98765);
  std::vector<OpSample> a = op.samples(g1), b = op.samples(g2), c = op.samples(g3);
  if (a.size() < 3) add(fmt::format("{} samples; at least 3 cover an op", a.size()));
  if (a.size() != b.size() || a.size() != c.size()) {
    add("the number of samples depends on the generator");
    return problems;
  }
  bool seeds_matter = false, has_float_input = false;
  for (size_t s = 0; s < a.size(); ++s) {
    const OpSample& x = a[s];
    std::string where = fmt::format("sample {} \"{}\"", s, x.note);
    if (x.note.empty()) add(fmt::format("sample {} has no note", s));
    try {
      op.check_arity(x.inputs.size(), where);
      op.canonicalize(x.attrs, where);
    } catch (const Error& e) {
      add(e.what());
    }
    if (!(x.attrs == b[s].attrs) || x.note != b[s].note || x.inputs.size() != b[s].inputs.size()) {
      add(where + ": not reproducible from the same seed");
      continue;
    }
    for (size_t i = 0; i < x.inputs.size(); ++i) {
      const Tensor& t = x.inputs[i];
      if (!t.defined()) {
        if (i >= op.inputs.size() || !op.inputs[i].optional)
          add(fmt::format("{}: input {} is absent but not optional", where, i));
        continue;
      }
      if (!t.has_storage() || !t.device().is_cpu()) {
        add(fmt::format("{}: input {} is not a CPU tensor with data", where, i));
        continue;
      }
      if (is_floating(t.dtype()) && t.dtype() != DType::Float64)
        add(fmt::format("{}: floating input {} is {}; samples hold float64 (the harness casts)",
                        where, i, dtype_name(t.dtype())));
      // (values compared exactly, NaN equal to NaN: the special-value samples hold NaN)
      if (!b[s].inputs[i].defined() || b[s].inputs[i].sizes() != t.sizes() ||
          !test::close(b[s].inputs[i], t, test::Tolerance::exact().with_signed_zeros()))
        add(fmt::format("{}: input {} differs between two runs with the same seed", where, i));
      if (is_floating(t.dtype()) && t.numel() > 0) {
        has_float_input = true;
        std::vector<double> v = t.to_vector<double>();
        bool all_zero = true;
        for (double e : v) all_zero &= e == 0.0;
        // A 1-element input (a scalar exponent, a constant) may legitimately be 0; a tensor of
        // zeros tests nothing.
        if (all_zero && v.size() > 1) add(fmt::format("{}: input {} is all zeros", where, i));
        const Tensor& u = c[s].inputs[i];
        if (u.defined() && u.sizes() == t.sizes() && u.to_vector<double>() != v)
          seeds_matter = true;
      }
    }
  }
  if (has_float_input && !seeds_matter)
    add("samples are the same for every seed; draw values from the generator");
  return problems;
}

TEST(Registry, SamplesAreWellFormed) {
  std::vector<std::string> problems;
  for (const OpDef& op : all_ops()) {
    if (!op.samples) continue;  // reported by EveryOpHasAWholeRecord
    try {
      for (auto& p : sample_problems(op)) problems.push_back(p);
    } catch (const std::exception& e) {
      problems.push_back(fmt::format("{}: samples threw: {}", op.name, e.what()));
    }
  }
  EXPECT_TRUE(problems.empty()) << problems.size() << " problems:" << join(problems);
}

TEST(Registry, CommonDTypeSets) {
  EXPECT_EQ(float_dtypes().size(), 4u);
  for (DType d : float_dtypes()) EXPECT_TRUE(is_floating(d)) << dtype_name(d);
  EXPECT_EQ(numeric_dtypes().size(), 8u);
  EXPECT_EQ(all_dtypes().size(), size_t(kNumDTypes));
  std::set<int> all;
  for (DType d : all_dtypes()) all.insert(int(d));
  EXPECT_EQ(all.size(), size_t(kNumDTypes)) << "all_dtypes() repeats a dtype";
}

}  // namespace
}  // namespace kiln
