// NaN-safe differences for tests that keep the largest error: std::max(err, NaN) keeps err, so a
// kernel returning NaN would pass a loop of `err = std::max(err, std::fabs(a - b))`.
#pragma once

#include <cmath>
#include <limits>

namespace kiln::test {

// |a - b|; +infinity when either side is NaN (every bound fails); 0 for equal infinities.
inline double abs_diff(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  if (a == b) return 0;
  return std::fabs(a - b);
}

}  // namespace kiln::test
