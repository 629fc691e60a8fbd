#include <gtest/gtest.h>

#include "core/symint.h"

using kiln::SymInt;
TEST(SymInt, ConcreteArithmetic) { EXPECT_EQ((SymInt(3) + SymInt(4)).value(), 7); }
