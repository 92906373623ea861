#pragma once
// A contiguous, row-major tensor. Copies share storage (like a handle); clone() copies data.
// Its storage lives on the host (the default) or on a device (device.h): a device tensor is made by
// device_copy.h's explicit copies, and host code that asks it for its data (data, raw, storage, and
// everything built on them) gets an error naming the tensor; device kernels take device_ptr().
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/core/dtype.h"
#include "shardwise/core/error.h"
#include "shardwise/core/shape.h"
#include "shardwise/tensor/device.h"

namespace shardwise {

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  Tensor(DType dtype, const Shape& shape);  // zero-filled
  // Storage left uninitialized: for kernels that write every element (no zero-fill pass).
  // `huge_pages`: a large buffer filled once (a checkpoint read) asks for transparent huge pages.
  static Tensor uninitialized(DType dtype, const Shape& shape, bool huge_pages = false);
  // Same, with the data starting `lead` bytes into a fresh block (a multiple of the element size):
  // a checkpoint read with O_DIRECT lands the file's bytes where their offset modulo the disk's
  // block size matches the address's.
  static Tensor uninitialized_at(DType dtype, const Shape& shape, bool huge_pages, size_t lead);

  // A tensor over memory someone else owns (a NumPy array, a DLPack capsule): no copy. `storage`
  // holds at least nbytes() bytes, row-major; its deleter releases the owner.
  static Tensor adopt(DType dtype, const Shape& shape, std::shared_ptr<std::byte[]> storage);
  // The storage block, shared: whoever holds it keeps the data alive (a NumPy array returned
  // without a copy holds it).
  const std::shared_ptr<std::byte[]>& storage() const {
    check_host("storage()");
    return storage_;
  }
  // A tensor over device memory (device_copy.h makes them): `storage` is a device pointer whose
  // deleter gives it back to its allocator.
  static Tensor adopt_device(DType dtype, const Shape& shape, Device device, std::shared_ptr<std::byte[]> storage);
  Device device() const { return device_; }
  bool on_device() const { return !device_.is_host(); }
  // The device address of a device tensor's data, for copies and device kernels only (an error on
  // a host tensor). Host code never dereferences it.
  void* device_ptr();
  const void* device_ptr() const;
  template <class T>
  static Tensor from(const Shape& shape, std::span<const T> values) {
    Tensor t(dtype_v<T>, shape);
    SW_CHECK(static_cast<int64_t>(values.size()) == t.numel(),
             "tensor of shape {} needs {} values, got {}", shape.to_string(), t.numel(), values.size());
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }
  template <class T>
  static Tensor from(const Shape& shape, const std::vector<T>& values) {
    return from<T>(shape, std::span<const T>(values));
  }
  template <class T>
  static Tensor scalar(T value) {
    return from<T>(Shape{}, std::vector<T>{value});
  }
  static Tensor full(DType dtype, const Shape& shape, double value);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  template <class T>
  T* data() {
    check_type(dtype_v<T>);
    return reinterpret_cast<T*>(storage_.get());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_v<T>);
    return reinterpret_cast<const T*>(storage_.get());
  }
  std::byte* raw() {
    check_host("raw()");
    return storage_.get();
  }
  const std::byte* raw() const {
    check_host("raw()");
    return storage_.get();
  }

  // Slow element access through double, for tests and the verifier.
  double at(int64_t flat_index) const;
  void set_at(int64_t flat_index, double value);

  Tensor clone() const;
  Tensor to(DType dtype) const;  // converting copy (C++ conversion rules; bool is value != 0)
  // Same data, new shape with the same element count (shares storage).
  Tensor reshaped(const Shape& shape) const;

  // Copy of the block [offsets, offsets + sizes) of this tensor.
  Tensor slice(std::span<const int64_t> offsets, const Shape& sizes) const;
  // Writes `block` into this tensor at `offsets`.
  void paste(const Tensor& block, std::span<const int64_t> offsets);

  std::string to_string(int max_elements = 16) const;

 private:
  void check_type(DType requested) const;
  void check_host(const char* what) const {
    if (!device_.is_host()) [[unlikely]] fail_host_access(what);
  }
  [[noreturn]] void fail_host_access(const char* what) const;

  DType dtype_ = DType::F32;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<std::byte[]> storage_;
  Device device_;
};

// True when both have the same shape and dtype and every element is equal (NaN == NaN), bit for
// bit for integers and within `atol + rtol * |expected|` for floats.
struct CompareResult {
  bool equal = true;
  int64_t first_bad = -1;
  double actual = 0, expected = 0, max_abs_diff = 0;
  std::string message;  // filled when !equal
};
CompareResult compare(const Tensor& actual, const Tensor& expected, double rtol = 0, double atol = 0);

}  // namespace shardwise
