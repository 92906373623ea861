#include "shardwise/core/shape.h"

#include <charconv>

#include "shardwise/core/error.h"

namespace shardwise {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

Shape::Shape(std::span<const int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t extent) {
  SW_CHECK(ndim_ < kMaxDims, "a shape with more than {} dims: shardwise supports at most {}", kMaxDims, kMaxDims);
  SW_CHECK(extent >= 0, "shape extent {} is negative", extent);
  dims_[static_cast<size_t>(ndim_++)] = extent;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : *this) {
    SW_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} has more elements than fit in 64 bits",
             to_string());
  }
  return n;
}

std::string Shape::to_string() const {
  if (ndim_ == 0) return "scalar";
  std::string out;
  for (int i = 0; i < ndim_; ++i) {
    if (i) out += 'x';
    out += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return out;
}

int Shape::axis(int64_t axis) const {
  SW_CHECK(axis >= -ndim_ && axis < (ndim_ == 0 ? 1 : ndim_),
           "axis {} is out of range for a tensor of rank {} (allowed: {} .. {})", axis, ndim_, -ndim_,
           ndim_ - 1);
  return static_cast<int>(axis < 0 ? axis + ndim_ : axis);
}

Shape parse_shape(std::string_view text) {
  if (!text.empty() && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  Shape shape;
  if (text.empty() || text == "scalar") return shape;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find_first_of("x,", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(pos, end - pos);
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    SW_CHECK(ec == std::errc() && ptr == part.data() + part.size() && !part.empty(),
             "cannot read shape '{}': '{}' is not a non-negative integer (write shapes as 8x16)", text,
             part);
    shape.push_back(value);
    pos = end + 1;
  }
  return shape;
}

std::array<int64_t, kMaxDims> contiguous_strides(const Shape& shape) {
  std::array<int64_t, kMaxDims> strides{};
  int64_t s = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = s;
    s *= shape[i];
  }
  return strides;
}

}  // namespace shardwise
