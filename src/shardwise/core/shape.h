#pragma once
// A tensor shape: up to kMaxDims extents stored inline, so shapes never allocate.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace shardwise {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  size_t size() const { return static_cast<size_t>(ndim_); }
  bool empty() const { return ndim_ == 0; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  int64_t* begin() { return dims_.data(); }
  int64_t* end() { return dims_.data() + ndim_; }
  std::span<const int64_t> span() const { return {dims_.data(), size()}; }
  int64_t back() const { return dims_[static_cast<size_t>(ndim_ - 1)]; }

  void push_back(int64_t extent);
  int64_t numel() const;  // product of extents (1 for a scalar); checks for overflow
  std::string to_string() const;  // "8x16"; "scalar" for ndim 0

  // Normalizes a possibly negative axis into [0, ndim); throws naming the axis and the rank.
  int axis(int64_t axis) const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.ndim_ != b.ndim_) return false;
    for (int i = 0; i < a.ndim_; ++i) {
      if (a.dims_[static_cast<size_t>(i)] != b.dims_[static_cast<size_t>(i)]) return false;
    }
    return true;
  }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

// Parses "8x16", "8,16", "[8,16]", or "scalar"/"" for a 0-d shape.
Shape parse_shape(std::string_view text);

// Row-major strides (in elements) of a contiguous tensor of this shape.
std::array<int64_t, kMaxDims> contiguous_strides(const Shape& shape);

}  // namespace shardwise
