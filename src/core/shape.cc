#include "core/shape.h"

#include "core/error.h"

namespace kiln {

void throw_rank_error(size_t rank) {
  fail_kind(ErrorKind::NotSupported, "tensor rank {} exceeds Kiln's maximum rank of {}", rank,
            kMaxRank);
}

Shape to_shape(const Dims& d) {
  Shape s;
  for (int64_t v : d) s.push_back(SymInt(v));
  return s;
}

Dims to_dims(const Shape& s, const char* what) {
  Dims d;
  for (SymInt v : s) {
    KILN_CHECK(v.is_concrete(), "{} {} has a symbolic dimension '{}'; bind it to a value first",
               what, to_string(s), v.str());
    d.push_back(v.raw());
  }
  return d;
}

bool is_concrete(const Shape& s) {
  for (SymInt v : s)
    if (v.is_symbolic()) return false;
  return true;
}

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

SymInt numel(const Shape& s) {
  SymInt n = 1;
  for (SymInt v : s) n = n * v;
  return n;
}

Dims contiguous_strides(const Dims& sizes) {
  Dims st;
  st.resize(sizes.size());
  int64_t s = 1;
  for (int i = int(sizes.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= sizes[i] > 0 ? sizes[i] : 1;
  }
  return st;
}

std::string to_string(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + "]";
}

std::string to_string(const Shape& sh) {
  std::string s = "[";
  for (size_t i = 0; i < sh.size(); ++i) {
    if (i) s += ", ";
    s += sh[i].str();
  }
  return s + "]";
}

int normalize_axis(int64_t axis, int rank, const char* what) {
  int64_t r = rank == 0 ? 1 : rank;  // scalars accept axis 0/-1 like NumPy reductions
  KILN_CHECK(axis >= -r && axis < r, "{} {} is out of range for a tensor of rank {}", what, axis,
             rank);
  return int(axis < 0 ? axis + r : axis);
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out;
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    SymInt da = i < n - a.size() ? SymInt(1) : a[i - (n - a.size())];
    SymInt db = i < n - b.size() ? SymInt(1) : b[i - (n - b.size())];
    if (da == db || db == SymInt(1)) out[i] = da;
    else if (da == SymInt(1)) out[i] = db;
    else
      fail("shapes {} and {} cannot be broadcast: dimension {} is {} vs {}", to_string(a),
           to_string(b), i, da.str(), db.str());
  }
  return out;
}

}  // namespace kiln
