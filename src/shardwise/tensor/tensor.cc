#include "shardwise/tensor/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "shardwise/tensor/allocator.h"

namespace shardwise {

Tensor::Tensor(DType dtype, const Shape& shape) : dtype_(dtype), shape_(shape), numel_(shape.numel()) {
  storage_ = allocate_storage(nbytes(), /*zero=*/true);
}

Tensor Tensor::adopt(DType dtype, const Shape& shape, std::shared_ptr<std::byte[]> storage) {
  SW_CHECK(storage != nullptr, "Tensor::adopt: no storage for a {} tensor of shape {}", dtype_name(dtype),
           shape.to_string());
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = shape.numel();
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::uninitialized(DType dtype, const Shape& shape, bool huge_pages) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = shape.numel();
  t.storage_ = allocate_storage(t.nbytes(), /*zero=*/false, huge_pages);
  return t;
}

Tensor Tensor::uninitialized_at(DType dtype, const Shape& shape, bool huge_pages, size_t lead) {
  if (lead == 0) return uninitialized(dtype, shape, huge_pages);
  SW_CHECK(lead % dtype_size(dtype) == 0, "storage lead of {} bytes is not a multiple of the {} element size", lead,
           dtype_name(dtype));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = shape.numel();
  std::shared_ptr<std::byte[]> block = allocate_storage(t.nbytes() + lead, /*zero=*/false, huge_pages);
  t.storage_ = std::shared_ptr<std::byte[]>(block, block.get() + lead);  // shares the block's ownership
  return t;
}

Tensor Tensor::full(DType dtype, const Shape& shape, double value) {
  Tensor t = uninitialized(dtype, shape);
  SW_DISPATCH(dtype, [&] {
    T* p = t.data<T>();
    T v = static_cast<T>(static_cast<compute_t<T>>(value));
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = v;
  });
  return t;
}

Tensor Tensor::adopt_device(DType dtype, const Shape& shape, Device device, std::shared_ptr<std::byte[]> storage) {
  SW_CHECK(!device.is_host(), "Tensor::adopt_device: {} is not a device", device.to_string());
  Tensor t = adopt(dtype, shape, std::move(storage));
  t.device_ = device;
  return t;
}

void Tensor::fail_host_access(const char* what) const {
  fail("host code asked for the data of a device tensor ({} {} on {}) through {}: copy it with to_host() "
       "(tensor/device_copy.h) first", dtype_name(dtype_), shape_.to_string(), device_.to_string(), what);
}

void* Tensor::device_ptr() {
  SW_CHECK(on_device(), "device_ptr() of a host tensor ({} {})", dtype_name(dtype_), shape_.to_string());
  return storage_.get();
}

const void* Tensor::device_ptr() const { return const_cast<Tensor*>(this)->device_ptr(); }

void Tensor::check_type(DType requested) const {
  SW_CHECK(defined(), "tensor is undefined");
  check_host("data()");
  SW_CHECK(requested == dtype_, "tensor holds {} but was read as {}", dtype_name(dtype_),
           dtype_name(requested));
}

double Tensor::at(int64_t i) const {
  SW_CHECK(i >= 0 && i < numel_, "element {} is out of range for a tensor of {} elements", i, numel_);
  return SW_DISPATCH(dtype_, [&]() -> double {
    return static_cast<double>(static_cast<compute_t<T>>(data<T>()[i]));
  });
}

void Tensor::set_at(int64_t i, double value) {
  SW_CHECK(i >= 0 && i < numel_, "element {} is out of range for a tensor of {} elements", i, numel_);
  SW_DISPATCH(dtype_, [&] { data<T>()[i] = static_cast<T>(static_cast<compute_t<T>>(value)); });
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  Tensor t = uninitialized(dtype_, shape_);
  std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  if (is_storage_only(dtype_) || is_storage_only(dtype)) {
    const std::string what = fmt::format("converting {} to {}", dtype_name(dtype_), dtype_name(dtype));
    check_computable(dtype_, what);
    check_computable(dtype, what);
  }
  Tensor out = uninitialized(dtype, shape_);
  SW_DISPATCH(dtype_, [&] {
    using Src = T;
    const Src* src = data<Src>();
    SW_DISPATCH(dtype, [&] {
      T* dst = out.data<T>();
      for (int64_t i = 0; i < numel_; ++i) {
        if constexpr (std::is_same_v<T, bool>) {
          dst[i] = static_cast<compute_t<Src>>(src[i]) != 0;
        } else {
          dst[i] = static_cast<T>(static_cast<compute_t<T>>(static_cast<compute_t<Src>>(src[i])));
        }
      }
    });
  });
  return out;
}

Tensor Tensor::reshaped(const Shape& shape) const {
  SW_CHECK(shape.numel() == numel_, "cannot view a tensor of shape {} as {}", shape_.to_string(),
           shape.to_string());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

namespace {

// Copies a rectangular block between two contiguous tensors of the same element size:
// dst[dst_off + i] = src[src_off + i] for i over `sizes`. Innermost dim copied with memcpy.
void copy_block(const std::byte* src, const Shape& src_shape, std::span<const int64_t> src_off,
                std::byte* dst, const Shape& dst_shape, std::span<const int64_t> dst_off,
                const Shape& sizes, size_t elem) {
  int nd = sizes.ndim();
  if (sizes.numel() == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  auto ss = contiguous_strides(src_shape);
  auto ds = contiguous_strides(dst_shape);
  int64_t row = sizes[nd - 1];
  std::array<int64_t, kMaxDims> idx{};
  while (true) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < nd; ++d) {
      so += (src_off[d] + idx[d]) * ss[d];
      doff += (dst_off[d] + idx[d]) * ds[d];
    }
    std::memcpy(dst + doff * static_cast<int64_t>(elem), src + so * static_cast<int64_t>(elem),
                static_cast<size_t>(row) * elem);
    int d = nd - 2;
    while (d >= 0 && ++idx[d] == sizes[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

void check_block(const Shape& shape, std::span<const int64_t> offsets, const Shape& sizes, const char* what) {
  SW_CHECK(static_cast<int>(offsets.size()) == shape.ndim() && sizes.ndim() == shape.ndim(),
           "{}: block rank {} does not match tensor rank {}", what, sizes.ndim(), shape.ndim());
  for (int d = 0; d < shape.ndim(); ++d) {
    SW_CHECK(offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] + sizes[d] <= shape[d],
             "{}: block [{}, {}) exceeds extent {} of dim {}", what, offsets[d], offsets[d] + sizes[d],
             shape[d], d);
  }
}

}  // namespace

Tensor Tensor::slice(std::span<const int64_t> offsets, const Shape& sizes) const {
  check_block(shape_, offsets, sizes, "slice");
  Tensor out = uninitialized(dtype_, sizes);  // copy_block writes every element
  std::array<int64_t, kMaxDims> zero{};
  copy_block(raw(), shape_, offsets, out.raw(), sizes, {zero.data(), sizes.size()}, sizes,
             dtype_size(dtype_));
  return out;
}

void Tensor::paste(const Tensor& block, std::span<const int64_t> offsets) {
  SW_CHECK(block.dtype() == dtype_, "paste: block holds {} but the tensor holds {}",
           dtype_name(block.dtype()), dtype_name(dtype_));
  check_block(shape_, offsets, block.shape(), "paste");
  std::array<int64_t, kMaxDims> zero{};
  copy_block(block.raw(), block.shape(), {zero.data(), block.shape().size()}, raw(), shape_, offsets,
             block.shape(), dtype_size(dtype_));
}

std::string Tensor::to_string(int max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  if (on_device()) return fmt::format("Tensor({}, {}, on {})", dtype_name(dtype_), shape_.to_string(), device_.to_string());
  std::string out = fmt::format("Tensor({}, {}, [", dtype_name(dtype_), shape_.to_string());
  for (int64_t i = 0; i < numel_ && i < max_elements; ++i) {
    out += fmt::format("{}{}", i ? ", " : "", at(i));
  }
  if (numel_ > max_elements) out += ", ...";
  return out + "])";
}

CompareResult compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  CompareResult r;
  if (!actual.defined() || !expected.defined()) {
    r.equal = actual.defined() == expected.defined();
    if (!r.equal) r.message = "one tensor is undefined";
    return r;
  }
  if (actual.dtype() != expected.dtype() || !(actual.shape() == expected.shape())) {
    r.equal = false;
    r.message = fmt::format("got {} {}, expected {} {}", dtype_name(actual.dtype()),
                            actual.shape().to_string(), dtype_name(expected.dtype()),
                            expected.shape().to_string());
    return r;
  }
  bool exact = !is_floating(actual.dtype());
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = actual.at(i), e = expected.at(i);
    bool ok;
    if (std::isnan(a) || std::isnan(e)) {
      ok = std::isnan(a) && std::isnan(e);
    } else if (exact || std::isinf(e) || std::isinf(a)) {
      ok = a == e;
    } else {
      double diff = std::fabs(a - e);
      r.max_abs_diff = std::max(r.max_abs_diff, diff);
      ok = diff <= atol + rtol * std::fabs(e);
    }
    if (!ok && r.equal) {
      r.equal = false;
      r.first_bad = i;
      r.actual = a;
      r.expected = e;
    }
  }
  if (!r.equal) {
    r.message = fmt::format("element {} of {}: got {}, expected {} (rtol {}, atol {})", r.first_bad,
                            actual.shape().to_string(), r.actual, r.expected, rtol, atol);
  }
  return r;
}

}  // namespace shardwise
