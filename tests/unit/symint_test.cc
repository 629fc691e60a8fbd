#include <gtest/gtest.h>

#include "core/error.h"
#include "core/shape.h"
#include "core/symint.h"

using namespace kiln;

TEST(SymInt, ConcreteArithmeticStaysConcrete) {
  SymInt a(3), b(4);
  EXPECT_TRUE((a + b).is_concrete());
  EXPECT_EQ((a + b).value(), 7);
  EXPECT_EQ((a * b).value(), 12);
  EXPECT_EQ((a - b).value(), -1);
  EXPECT_EQ(floordiv(SymInt(-7), SymInt(2)).value(), -4);  // Python floor semantics
  EXPECT_EQ(mod(SymInt(-7), SymInt(2)).value(), 1);
  EXPECT_EQ(sym_min(a, b).value(), 3);
  EXPECT_EQ(sym_max(a, b).value(), 4);
  static_assert(sizeof(SymInt) == sizeof(int64_t), "SymInt must stay one int64");
}

TEST(SymInt, SymbolsAreInterned) {
  SymInt a = SymInt::symbol("batch");
  SymInt b = SymInt::symbol("batch");
  EXPECT_TRUE(a.is_symbolic());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, SymInt::symbol("seq"));
  EXPECT_EQ(a.str(), "batch");
}

TEST(SymInt, CanonicalSumsAndProducts) {
  SymInt n = SymInt::symbol("n"), m = SymInt::symbol("m");
  EXPECT_EQ(n + m, m + n);
  EXPECT_EQ(n * m, m * n);
  EXPECT_EQ((n + 1) + 2, n + 3);
  EXPECT_EQ(n + n, n * 2);
  EXPECT_EQ((n + m) * 2, n * 2 + m * 2);
  EXPECT_EQ((n + 1) * (n + 1), n * n + n * 2 + 1);
  EXPECT_EQ(n - n, SymInt(0));
  EXPECT_TRUE((n - n).is_concrete());
  EXPECT_EQ(n * 0, SymInt(0));
  EXPECT_EQ((n * 3 + m).str(), (m + n * 3).str());
  EXPECT_EQ((n * 2 + 1).str(), "2*n + 1");
}

TEST(SymInt, FloorDivModMinMaxSimplify) {
  SymInt n = SymInt::symbol("n");
  EXPECT_EQ(floordiv(n * 4 + 8, SymInt(4)), n + 2);
  EXPECT_EQ(mod(n * 6, SymInt(3)), SymInt(0));
  EXPECT_EQ(floordiv(n, SymInt(1)), n);
  EXPECT_EQ(floordiv(n, n), SymInt(1));
  EXPECT_TRUE(floordiv(n + 1, SymInt(2)).is_symbolic());
  EXPECT_EQ(floordiv(n + 1, SymInt(2)), floordiv(SymInt(1) + n, SymInt(2)));
  EXPECT_EQ(sym_min(n, SymInt(4)), sym_min(SymInt(4), n));
  EXPECT_EQ(sym_max(n, n), n);
  EXPECT_NE(sym_min(n, SymInt(4)), sym_max(n, SymInt(4)));
}

TEST(SymInt, EvaluateAndFreeSymbols) {
  SymInt n = SymInt::symbol("n"), m = SymInt::symbol("m");
  SymInt e = floordiv(n * m + 3, SymInt(2)) + sym_max(n, m) - mod(m, SymInt(3));
  EXPECT_EQ(e.evaluate({{"n", 5}, {"m", 7}}), (5 * 7 + 3) / 2 + 7 - 7 % 3);
  EXPECT_EQ(e.free_symbols(), (std::vector<std::string>{"m", "n"}));
  EXPECT_THROW(e.evaluate({{"n", 5}}), Error);
  try {
    n.value();
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("'n'"), std::string::npos);
  }
}

TEST(SymInt, PrintParseRoundTrip) {
  SymInt n = SymInt::symbol("n"), seq = SymInt::symbol("seq");
  std::vector<SymInt> cases = {n,
                               n * 2 + 1,
                               n * seq - 3,
                               floordiv(n + 1, SymInt(2)),
                               mod(seq, SymInt(8)),
                               sym_min(n, seq) * 3,
                               floordiv(n * seq + 7, SymInt(4)) * 2 + sym_max(n, SymInt(1)),
                               SymInt(0) - n,
                               SymInt(42)};
  for (SymInt c : cases) {
    std::string s = c.str();
    SymInt back = parse_symint(s);
    EXPECT_EQ(back, c) << s;
    EXPECT_EQ(back.str(), s);
  }
  // Precedence: 3*(n//2) differs from (3*n)//2.
  EXPECT_NE(parse_symint("3*(n//2)"), parse_symint("3*n//2"));
  EXPECT_EQ(parse_symint("3*(n//2)").evaluate({{"n", 5}}), 6);
  EXPECT_EQ(parse_symint("3*n//2").evaluate({{"n", 5}}), 7);
}

TEST(SymInt, ParseErrorsNamePosition) {
  for (const char* bad : {"", "n +", "(n", "n $ 2", "min(n)", "3 3", "99999999999999999999"}) {
    try {
      parse_symint(bad);
      FAIL() << "expected an error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError) << bad;
      EXPECT_NE(std::string(e.what()).find("column"), std::string::npos) << e.what();
    }
  }
}

TEST(Shape, BroadcastSymbolicAndErrors) {
  SymInt b = SymInt::symbol("b");
  Shape s = broadcast_shapes(Shape{b, SymInt(1)}, Shape{SymInt(4)});
  EXPECT_EQ(s, (Shape{b, SymInt(4)}));
  EXPECT_EQ(broadcast_shapes(Shape{3, 1, 5}, Shape{4, 1}), (Shape{3, 4, 5}));
  try {
    broadcast_shapes(Shape{3, 2}, Shape{4});
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  }
  EXPECT_EQ(numel(Shape{b, SymInt(3)}), b * 3);
  EXPECT_THROW(to_dims(Shape{b}), Error);
}

TEST(Shape, RankLimitIsAnError) {
  Dims d;
  for (int i = 0; i < kMaxRank; ++i) d.push_back(1);
  EXPECT_THROW(d.push_back(1), Error);
}

TEST(SymInt, ConcreteOverflowIsAnError) {
  SymInt big(int64_t(1) << 61);
  EXPECT_THROW(big * 4, Error);
  EXPECT_THROW(big * 2 + big * 2, Error);  // 2^63 overflows int64
  EXPECT_THROW(SymInt(0) - big - big - big, Error);
  EXPECT_EQ((big + big - 1).value(), (int64_t(1) << 62) - 1);
}
