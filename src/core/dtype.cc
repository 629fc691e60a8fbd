#include "core/dtype.h"

#include <cmath>
#include <iterator>
#include <limits>

namespace kiln {

const DTypeInfo kDTypeInfo[kNumDTypes] = {
#define KILN_DTYPE(E, T, N, S, SZ, K) {N, S, SZ, K},
#include "core/dtype.def"
#undef KILN_DTYPE
};

#define KILN_DTYPE(E, T, N, S, SZ, K) static_assert(sizeof(T) == SZ, "dtype size mismatch: " N);
#include "core/dtype.def"
#undef KILN_DTYPE

uint16_t Half::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) {                                // overflow to inf (rounded)
    return uint16_t(sign | 0x7c00u);
  }
  if (absx < 0x38800000u) {  // subnormal or zero in half
    // value = absx as float; half subnormal unit = 2^-24
    float af;
    std::memcpy(&af, &absx, 4);
    float scaled = af * 16777216.0f;  // / 2^-24
    uint32_t m = uint32_t(std::nearbyint(scaled));  // round-to-nearest-even (default FE mode)
    return uint16_t(sign | m);
  }
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t mant = absx & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;
  return uint16_t(sign | h);
}

float Half::to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {
      float v = float(mant) * (1.0f / 16777216.0f);
      std::memcpy(&out, &v, 4);
      out |= sign;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

bool parse_dtype(std::string_view s, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (s == kDTypeInfo[i].name || s == kDTypeInfo[i].short_name) {
      *out = DType(i);
      return true;
    }
  }
  return false;
}

static int category(DType d) {
  switch (info(d).kind) {
    case 'b': return 0;
    case 'i':
    case 'u': return 1;
    default: return 2;
  }
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
    if (a == DType::Float32 || b == DType::Float32) return DType::Float32;
    return DType::Float32;  // f16 with bf16
  }
  // integers
  bool ua = info(a).kind == 'u', ub = info(b).kind == 'u';
  if (ua != ub) {
    DType s = ua ? b : a;  // the signed one
    if (s == DType::Int8) return DType::Int32;  // int16 does not exist in Kiln; widen
    return s;
  }
  return dtype_size(a) >= dtype_size(b) ? a : b;
}

double load_f64(const void* p, DType d) {
  switch (d) {
    case DType::Float32: return *static_cast<const float*>(p);
    case DType::Float16: return float(*static_cast<const Half*>(p));
    case DType::BFloat16: return float(*static_cast<const BFloat16*>(p));
    case DType::Float64: return *static_cast<const double*>(p);
    case DType::Int64: return double(*static_cast<const int64_t*>(p));
    case DType::Int32: return *static_cast<const int32_t*>(p);
    case DType::Int8: return *static_cast<const int8_t*>(p);
    case DType::UInt8: return *static_cast<const uint8_t*>(p);
    case DType::Bool: return *static_cast<const bool*>(p) ? 1.0 : 0.0;
  }
  return 0;
}

// Float -> integer conversions saturate and map NaN to 0 so that they are defined behaviour.
template <typename I>
static I sat_cast(double v) {
  if (std::isnan(v)) return 0;
  double lo = double(std::numeric_limits<I>::min()), hi = double(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return I(v);
}

void store_f64(void* p, DType d, double v) {
  switch (d) {
    case DType::Float32: *static_cast<float*>(p) = float(v); return;
    case DType::Float16: *static_cast<Half*>(p) = Half(float(v)); return;
    case DType::BFloat16: *static_cast<BFloat16*>(p) = BFloat16(float(v)); return;
    case DType::Float64: *static_cast<double*>(p) = v; return;
    case DType::Int64: *static_cast<int64_t*>(p) = sat_cast<int64_t>(v); return;
    case DType::Int32: *static_cast<int32_t*>(p) = sat_cast<int32_t>(v); return;
    case DType::Int8: *static_cast<int8_t*>(p) = sat_cast<int8_t>(v); return;
    case DType::UInt8: *static_cast<uint8_t*>(p) = sat_cast<uint8_t>(v); return;
    case DType::Bool: *static_cast<bool*>(p) = v != 0.0; return;
  }
}

int64_t load_i64(const void* p, DType d) {
  switch (d) {
    case DType::Int64: return *static_cast<const int64_t*>(p);
    case DType::Int32: return *static_cast<const int32_t*>(p);
    case DType::Int8: return *static_cast<const int8_t*>(p);
    case DType::UInt8: return *static_cast<const uint8_t*>(p);
    case DType::Bool: return *static_cast<const bool*>(p) ? 1 : 0;
    default: return sat_cast<int64_t>(load_f64(p, d));
  }
}

void store_i64(void* p, DType d, int64_t v) {
  switch (d) {
    case DType::Int64: *static_cast<int64_t*>(p) = v; return;
    case DType::Int32: *static_cast<int32_t*>(p) = int32_t(uint32_t(uint64_t(v))); return;  // wraps
    case DType::Int8: *static_cast<int8_t*>(p) = int8_t(uint8_t(uint64_t(v))); return;
    case DType::UInt8: *static_cast<uint8_t*>(p) = uint8_t(uint64_t(v)); return;
    case DType::Bool: *static_cast<bool*>(p) = v != 0; return;
    default: store_f64(p, d, double(v)); return;
  }
}

}  // namespace kiln
