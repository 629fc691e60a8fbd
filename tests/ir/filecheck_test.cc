// The FileCheck matcher used by the IR text tests: it must accept what it should and, just as
// important, reject what it should.
#include "filecheck.h"

#include <gtest/gtest.h>

namespace kiln::test {
namespace {

const char* kOutput =
    "graph @g(%x: f32[2]) {\n"
    "  %a = relu(%x) : f32[2]\n"
    "  %b = neg(%a) : f32[2]\n"
    "  %c = exp(%b) : f32[2]\n"
    "  return %c\n"
    "}\n"
    "graph @h(%y: f32[3]) {\n"
    "  %d = tanh(%y) : f32[3]\n"
    "  return %d\n"
    "}\n";

std::string check(const std::string& directives) {
  std::string err;
  std::vector<CheckDirective> d = parse_check_directives(directives, 1, &err);
  EXPECT_EQ(err, "");
  return filecheck(kOutput, d);
}

TEST(FileCheck, Check) {
  EXPECT_EQ(check("// CHECK: relu(%x)\n// CHECK: exp(%b)"), "");
  EXPECT_NE(check("// CHECK: exp(%b)\n// CHECK: relu(%x)"), "");  // order matters
  EXPECT_NE(check("// CHECK: sigmoid"), "");
  // Runs of blanks match any run of blanks.
  EXPECT_EQ(check("// CHECK: %a   =  relu"), "");
}

TEST(FileCheck, Next) {
  EXPECT_EQ(check("// CHECK: %a = relu\n// CHECK-NEXT: %b = neg\n// CHECK-NEXT: %c = exp"), "");
  std::string e = check("// CHECK: %a = relu\n// CHECK-NEXT: %c = exp");
  EXPECT_NE(e.find("line 2: CHECK-NEXT: %c = exp: not on the next line"), std::string::npos) << e;
}

TEST(FileCheck, Same) {
  EXPECT_EQ(check("// CHECK: %b =\n// CHECK-SAME: neg(%a)\n// CHECK-SAME: f32[2]"), "");
  EXPECT_NE(check("// CHECK: %b =\n// CHECK-SAME: exp"), "");
}

TEST(FileCheck, Not) {
  EXPECT_EQ(check("// CHECK: relu\n// CHECK-NOT: sigmoid\n// CHECK: return"), "");
  // neg lies between relu and return: the NOT must fail.
  std::string e = check("// CHECK: relu\n// CHECK-NOT: neg\n// CHECK: return");
  EXPECT_NE(e.find("line 2: CHECK-NOT: neg: found on output line 3"), std::string::npos) << e;
  // A trailing NOT covers the rest of the output.
  EXPECT_NE(check("// CHECK: relu\n// CHECK-NOT: tanh"), "");
  EXPECT_EQ(check("// CHECK: tanh\n// CHECK-NOT: relu"), "");
}

TEST(FileCheck, Labels) {
  EXPECT_EQ(check("// CHECK-LABEL: graph @g\n// CHECK: exp\n// CHECK-LABEL: graph @h\n"
                  "// CHECK-NEXT: tanh"),
            "");
  // Checks after a label are confined to its block: tanh is not in @g's block.
  EXPECT_NE(check("// CHECK-LABEL: graph @g\n// CHECK: tanh\n// CHECK-LABEL: graph @h"), "");
  // A NOT in @h's block does not see @g's relu.
  EXPECT_EQ(check("// CHECK-LABEL: graph @h\n// CHECK-NOT: relu"), "");
  EXPECT_NE(check("// CHECK-LABEL: graph @nothere"), "");
}

TEST(FileCheck, Regex) {
  EXPECT_EQ(check("// CHECK: %{{[a-c]}} = neg(%{{.*}})"), "");
  EXPECT_NE(check("// CHECK: %{{[x-z]}} = neg"), "");
  // Outside {{ }}, regex characters are literal.
  EXPECT_NE(check("// CHECK: f32.2."), "");
  EXPECT_EQ(check("// CHECK: f32[2]"), "");
}

TEST(FileCheck, DirectiveParsing) {
  std::string err;
  std::vector<CheckDirective> d = parse_check_directives(
      "x\n# CHECK: a\n  // CHECK-NOT:  b  \n// CHECK-NXT: c\n// CHECK:\n", 10, &err);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].line, 11);
  EXPECT_EQ(d[1].kind, CheckDirective::Not);
  EXPECT_EQ(d[1].pattern, "b");
  EXPECT_NE(err.find("line 13: unknown directive 'CHECK-NXT'"), std::string::npos) << err;
  EXPECT_NE(err.find("line 14: CHECK has an empty pattern"), std::string::npos) << err;
}

}  // namespace
}  // namespace kiln::test
