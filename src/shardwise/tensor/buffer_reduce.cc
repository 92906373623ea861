#include "shardwise/tensor/buffer_reduce.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "shardwise/core/error.h"

namespace shardwise {
namespace {

// Sum/avg of float or double: the same additions in the same order as the general loop below
// (((in0 + in1) + in2) ...), but buffer by buffer so the compiler vectorizes them.
template <class T>
void sum_buffers(std::span<const void* const> inputs, T* out, int64_t count, bool average) {
  const T* first = static_cast<const T*>(inputs[0]);
  for (int64_t i = 0; i < count; ++i) out[i] = first[i];
  for (size_t r = 1; r < inputs.size(); ++r) {
    const T* in = static_cast<const T*>(inputs[r]);
    for (int64_t i = 0; i < count; ++i) out[i] += in[i];
  }
  if (average) {
    const T n = static_cast<T>(inputs.size());
    for (int64_t i = 0; i < count; ++i) out[i] /= n;
  }
}

template <class T>
void reduce_typed(std::span<const void* const> inputs, T* out, int64_t count, BufferReduce op) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (op == BufferReduce::Sum || op == BufferReduce::Avg) return sum_buffers(inputs, out, count, op == BufferReduce::Avg);
  }
  using C = std::conditional_t<std::is_same_v<T, bool>, bool, compute_t<T>>;
  auto at = [&](size_t r, int64_t i) { return static_cast<C>(static_cast<const T*>(inputs[r])[i]); };
  for (int64_t i = 0; i < count; ++i) {
    C acc = at(0, i);
    for (size_t r = 1; r < inputs.size(); ++r) {
      C v = at(r, i);
      switch (op) {
        case BufferReduce::Sum:
        case BufferReduce::Avg:
          if constexpr (std::is_same_v<C, bool>) acc = acc || v;
          else acc = static_cast<C>(acc + v);
          break;
        case BufferReduce::Prod:
          if constexpr (std::is_same_v<C, bool>) acc = acc && v;
          else acc = static_cast<C>(acc * v);
          break;
        case BufferReduce::Max:
          if constexpr (std::is_floating_point_v<C>) {
            if (std::isnan(v) || std::isnan(acc)) { acc = std::numeric_limits<C>::quiet_NaN(); break; }
            // max(-0, +0) = +0 in either order: the result must not depend on the operand order.
            if (v == acc && std::signbit(acc)) acc = v;
          }
          acc = v > acc ? v : acc;
          break;
        case BufferReduce::Min:
          if constexpr (std::is_floating_point_v<C>) {
            if (std::isnan(v) || std::isnan(acc)) { acc = std::numeric_limits<C>::quiet_NaN(); break; }
            if (v == acc && std::signbit(v)) acc = v;  // min(-0, +0) = -0 in either order
          }
          acc = v < acc ? v : acc;
          break;
      }
    }
    if (op == BufferReduce::Avg) {
      if constexpr (!std::is_same_v<C, bool>) acc = static_cast<C>(acc / static_cast<C>(inputs.size()));
    }
    out[i] = static_cast<T>(acc);
  }
}

}  // namespace

void reduce_buffers(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, BufferReduce op) {
  SW_CHECK(!inputs.empty(), "reduce of no buffers");
  SW_DISPATCH(dtype, [&] { reduce_typed<T>(inputs, static_cast<T*>(out), count, op); });
}

}  // namespace shardwise
