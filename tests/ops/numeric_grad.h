#pragma once
// Central differences of L = sum(w * out()) with respect to every element of `t` (t is perturbed
// in place and restored), for checking analytic backward kernels in f64.
#include <functional>
#include <vector>

#include "shardwise/tensor/tensor.h"

namespace shardwise::testing_util {

inline std::vector<double> numeric_grad(Tensor& t, const Tensor& w, const std::function<Tensor()>& out) {
  const double h = 1e-6;
  std::vector<double> g;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.at(i);
    auto loss = [&](double at) {
      t.set_at(i, at);
      Tensor o = out();
      double l = 0;
      for (int64_t j = 0; j < o.numel(); ++j) l += o.at(j) * w.at(j);
      return l;
    };
    double up = loss(v + h), down = loss(v - h);
    t.set_at(i, v);
    g.push_back((up - down) / (2 * h));
  }
  return g;
}

}  // namespace shardwise::testing_util
