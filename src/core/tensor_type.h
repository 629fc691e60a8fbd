// TensorType: what the IR and shape inference know about a value: dtype, (symbolic) shape,
// device and, when not contiguous, strides.
#pragma once
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace kiln {

struct TensorType {
  DType dtype = DType::Float32;
  Shape shape;
  Device device;
  // Empty means contiguous row-major. Strides are in elements.
  Shape strides;

  TensorType() = default;
  TensorType(DType d, Shape s, Device dev = Device::cpu()) : dtype(d), shape(s), device(dev) {}

  int rank() const { return int(shape.size()); }
  bool is_contiguous() const { return strides.empty(); }
  friend bool operator==(const TensorType& a, const TensorType& b) {
    return a.dtype == b.dtype && a.shape == b.shape && a.device == b.device &&
           a.strides == b.strides;
  }
  friend bool operator!=(const TensorType& a, const TensorType& b) { return !(a == b); }
  // IR text form: "f32[1, 3, batch]" (device suffix " @cuda:0" when not CPU).
  std::string str() const;
};

}  // namespace kiln
