#pragma once
// The logistic sigmoid the CPU kernels share (swiglu, the unary sigmoid and silu, the MoE router
// and experts): 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, so only a non-positive number
// is ever exponentiated (no overflow). Written as e = exp(-|x|) and a select of the numerator, not
// a branch on x's sign: over values of random signs (a model's gate on random tokens) a branch is
// mispredicted about every other element, which made swiglu 2.5x slower on such data than on text
// (calibrate's reference runs against training's); the result is the branch's, bit for bit.
#include <cmath>

namespace shardwise::ops {

// The numerator is 1 for x >= 0 and e below, formed arithmetically (a select the compiler may turn
// back into a branch is not enough): e + (1 - e) rounds to exactly 1 for every e in [0, 1] (the
// difference is exact from 1/2 up, and below it off by at most a quarter of 1's ulp), e + 0 is e.
template <class C>
inline C sigmoid_of(C x) {
  const C e = std::exp(-std::abs(x));
  const C numerator = e + static_cast<C>(x >= 0) * (C(1) - e);
  return numerator / (C(1) + e);
}

}  // namespace shardwise::ops
