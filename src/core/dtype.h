// Kiln dtypes: one X-macro list (dtype.def), 16-bit float storage types, promotion rules.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

// IEEE binary16 storage. Arithmetic happens in float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// bfloat16 storage (upper half of a float32, round-to-nearest-even).
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

enum class DType : uint8_t {
#define KILN_DTYPE(E, T, N, S, SZ, K) E,
#include "core/dtype.def"
#undef KILN_DTYPE
};

inline constexpr int kNumDTypes = 0
#define KILN_DTYPE(E, T, N, S, SZ, K) +1
#include "core/dtype.def"
#undef KILN_DTYPE
    ;

struct DTypeInfo {
  const char* name;        // "float32"
  const char* short_name;  // "f32" (IR text)
  int size;
  char kind;
};
extern const DTypeInfo kDTypeInfo[kNumDTypes];

inline const DTypeInfo& info(DType d) { return kDTypeInfo[int(d)]; }
inline const char* dtype_name(DType d) { return info(d).name; }
inline int dtype_size(DType d) { return info(d).size; }
inline bool is_floating(DType d) { return info(d).kind == 'f'; }
inline bool is_integral(DType d) { return info(d).kind == 'i' || info(d).kind == 'u'; }
inline bool is_bool(DType d) { return d == DType::Bool; }

// Parses "float32" or "f32". Returns false if unknown.
bool parse_dtype(std::string_view s, DType* out);

// Type promotion for binary ops: bool < integers < floats (NumPy/PyTorch category rules).
// Within floats: f16+bf16 -> f32; otherwise the wider. Within integers: the wider signed type;
// uint8 with a signed type -> the signed type (at least int16 semantics -> int32 when int8).
DType promote_types(DType a, DType b);

template <typename T> struct DTypeOf;
#define KILN_DTYPE(E, T, N, S, SZ, K) \
  template <> struct DTypeOf<T> { static constexpr DType value = DType::E; };
#include "core/dtype.def"
#undef KILN_DTYPE

// Element access through a dtype tag: used by reference kernels, which compute in float64
// (floats) or int64 (integers) so they are the obviously correct oracle for every dtype.
double load_f64(const void* p, DType d);
void store_f64(void* p, DType d, double v);
int64_t load_i64(const void* p, DType d);
void store_i64(void* p, DType d, int64_t v);

// Visits a functor with the C++ type of a dtype: visit_dtype(d, [&]<typename T>() {...}).
template <typename F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
#define KILN_DTYPE(E, T, N, S, SZ, K) \
  case DType::E: return f.template operator()<T>();
#include "core/dtype.def"
#undef KILN_DTYPE
  }
  return f.template operator()<float>();
}

}  // namespace kiln
