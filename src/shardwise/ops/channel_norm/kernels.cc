#include "shardwise/ops/channel_norm/kernels.h"

#include <cmath>
#include <string>
#include <variant>

namespace shardwise::ops {

bool channels_last_format(const Attrs& attrs, std::string_view op) {
  const AttrValue* value = attrs.find("data_format");
  if (value == nullptr) return false;
  const auto* text = std::get_if<std::string>(value);
  SW_CHECK(text != nullptr, "{}: attribute 'data_format' must be a string, got {}", op, attrs.to_string());
  std::string_view f = *text;
  if (f == "NCHW" || f == "NC" || f == "NCL" || f == "NCDHW") return false;
  if (f == "NHWC" || f == "NLC" || f == "NDHWC") return true;
  fail("{}: data_format '{}' is not supported (allowed: NCHW, NC, NCL, NCDHW for channels first; NHWC, NLC, NDHWC "
       "for channels last)",
       op, f);
}

namespace {

// All math is in double: tensors are read into double vectors and written back in their dtype.
std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  SW_DISPATCH(t.dtype(), [&] {
    if constexpr (is_float_v<T>) {
      const T* p = t.data<T>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
    }
  });
  return out;
}

Tensor from_doubles(DType dtype, const Shape& shape, const std::vector<double>& values) {
  Tensor t(dtype, shape);
  SW_DISPATCH(dtype, [&] {
    if constexpr (is_float_v<T>) {
      T* p = t.data<T>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(static_cast<compute_t<T>>(values[i]));
    }
  });
  return t;
}

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

void check_x(std::string_view op, const Tensor& x, const char* name = "x") {
  SW_CHECK(x.defined(), "{}: {} is undefined", op, name);
  SW_CHECK(is_floating(x.dtype()), "{}: {} must be a floating tensor (f32, f64, f16, bf16), got {}", op, name,
           dtype_name(x.dtype()));
  SW_CHECK(x.ndim() >= 2, "{}: {} must have rank >= 2 ([N, C, ...]), got shape {}", op, name,
           x.shape().to_string());
}

// A [C] parameter or statistic: x's dtype, or f32 when x is f16/bf16; all of an op's parameters
// share one dtype (`param_dtype`, taken from scale).
void check_param(std::string_view op, const Tensor& p, const char* name, const Tensor& x, int64_t channels,
                 DType param_dtype) {
  SW_CHECK(p.defined(), "{}: {} is undefined", op, name);
  SW_CHECK(p.ndim() == 1 && p.shape()[0] == channels, "{}: {} must be [{}] (one value per channel of x {}), got {}",
           op, name, channels, x.shape().to_string(), p.shape().to_string());
  SW_CHECK(p.dtype() == param_dtype, "{}: {} holds {} but scale holds {} (the parameters share one dtype)", op, name,
           dtype_name(p.dtype()), dtype_name(param_dtype));
  SW_CHECK(p.dtype() == x.dtype() || (is_half(x.dtype()) && p.dtype() == DType::F32),
           "{}: {} holds {} but x holds {} (allowed: x's dtype, or f32 for an f16/bf16 x)", op, name,
           dtype_name(p.dtype()), dtype_name(x.dtype()));
}

void check_like(std::string_view op, const Tensor& t, const char* name, const Shape& shape, DType dtype) {
  SW_CHECK(t.defined() && t.shape() == shape && t.dtype() == dtype, "{}: {} must be {} {}, got {}", op, name,
           dtype_name(dtype), shape.to_string(),
           t.defined() ? fmt::format("{} {}", dtype_name(t.dtype()), t.shape().to_string()) : "undefined");
}

// x read as [outer, C, inner]: element (o, c, i) is at (o * C + c) * inner + i.
struct Blocks {
  int64_t outer = 1, channels = 0, inner = 1;
};
Blocks channel_blocks(const Shape& s, bool channels_last) {
  int axis = channel_axis(s.ndim(), channels_last);
  Blocks b;
  b.channels = s[axis];
  for (int d = 0; d < axis; ++d) b.outer *= s[d];
  for (int d = axis + 1; d < s.ndim(); ++d) b.inner *= s[d];
  return b;
}

constexpr std::string_view kBatchNorm = "batch_norm";

void check_batch_norm_x(const Tensor& x) {
  check_x(kBatchNorm, x);
  SW_CHECK(x.ndim() <= 5, "batch_norm: x must have rank 2..5, got shape {}", x.shape().to_string());
}

// out = (x - mean) * rstd * scale + bias, per channel.
Tensor normalize_channels(const Tensor& x, const Blocks& b, const std::vector<double>& mean,
                          const std::vector<double>& rstd, const std::vector<double>& scale,
                          const std::vector<double>& bias) {
  std::vector<double> xd = to_doubles(x);
  size_t p = 0;
  for (int64_t o = 0; o < b.outer; ++o) {
    for (size_t c = 0; c < static_cast<size_t>(b.channels); ++c) {
      double k = rstd[c] * scale[c];
      for (int64_t i = 0; i < b.inner; ++i, ++p) xd[p] = (xd[p] - mean[c]) * k + bias[c];
    }
  }
  return from_doubles(x.dtype(), x.shape(), xd);
}

}  // namespace

BatchNormOptions batch_norm_options(const Attrs& attrs) {
  BatchNormOptions o;
  o.momentum = attrs.get_float("momentum", 0.9);
  o.epsilon = attrs.get_float("epsilon", 1e-5);
  o.training = attrs.get_bool("training", true);
  o.channels_last = channels_last_format(attrs, kBatchNorm);
  SW_CHECK(std::isfinite(o.momentum), "batch_norm: momentum must be finite, got {}", o.momentum);
  SW_CHECK(o.epsilon >= 0, "batch_norm: epsilon must be >= 0, got {}", o.epsilon);
  return o;
}

ChannelSums batch_norm_local_sums(const Tensor& x, bool channels_last) {
  check_batch_norm_x(x);
  Blocks b = channel_blocks(x.shape(), channels_last);
  ChannelSums s;
  s.count = b.outer * b.inner;
  s.sum.assign(static_cast<size_t>(b.channels), 0.0);
  s.sum_sq.assign(static_cast<size_t>(b.channels), 0.0);
  std::vector<double> xd = to_doubles(x);
  size_t p = 0;
  for (int64_t o = 0; o < b.outer; ++o) {
    for (size_t c = 0; c < static_cast<size_t>(b.channels); ++c) {
      for (int64_t i = 0; i < b.inner; ++i, ++p) {
        s.sum[c] += xd[p];
        s.sum_sq[c] += xd[p] * xd[p];
      }
    }
  }
  return s;
}

ChannelStats batch_norm_stats(const ChannelSums& sums) {
  ChannelStats st;
  auto n = static_cast<double>(sums.count);
  st.mean.resize(sums.sum.size());
  st.var.resize(sums.sum.size());
  for (size_t c = 0; c < sums.sum.size(); ++c) {
    st.mean[c] = sums.sum[c] / n;  // count 0: NaN
    double var = sums.sum_sq[c] / n - st.mean[c] * st.mean[c];
    st.var[c] = var < 0 ? 0.0 : var;  // rounding can make E[x^2] - E[x]^2 slightly negative
  }
  return st;
}

namespace {

// Checks x and the four [C] tensors (sharing scale's dtype); returns x's channel blocks.
Blocks check_batch_norm_args(std::string_view op, const Tensor& x, const Tensor& scale, const Tensor& bias,
                             const Tensor& running_mean, const Tensor& running_var, bool channels_last) {
  check_x(op, x);
  SW_CHECK(x.ndim() <= 5, "{}: x must have rank 2..5, got shape {}", op, x.shape().to_string());
  Blocks b = channel_blocks(x.shape(), channels_last);
  SW_CHECK(scale.defined(), "{}: scale is undefined", op);
  DType pt = scale.dtype();
  check_param(op, scale, "scale", x, b.channels, pt);
  check_param(op, bias, "bias", x, b.channels, pt);
  check_param(op, running_mean, "running_mean", x, b.channels, pt);
  check_param(op, running_var, "running_var", x, b.channels, pt);
  return b;
}

// out and the saved statistics from per-channel mean and rstd.
void normalize_into(BatchNormOutputs& r, const Tensor& x, const Blocks& b, const Tensor& scale, const Tensor& bias,
                    const std::vector<double>& mean, const std::vector<double>& rstd) {
  r.out = normalize_channels(x, b, mean, rstd, to_doubles(scale), to_doubles(bias));
  r.saved_mean = from_doubles(scale.dtype(), scale.shape(), mean);
  r.saved_rstd = from_doubles(scale.dtype(), scale.shape(), rstd);
}

}  // namespace

ChannelMoments batch_norm_local_moments(const Tensor& x, bool channels_last) {
  check_batch_norm_x(x);
  Blocks b = channel_blocks(x.shape(), channels_last);
  auto nc = static_cast<size_t>(b.channels);
  ChannelMoments m;
  m.count = b.outer * b.inner;
  m.mean.assign(nc, 0.0);
  m.m2.assign(nc, 0.0);
  if (m.count == 0) return m;
  std::vector<double> xd = to_doubles(x);
  for (int pass = 0; pass < 2; ++pass) {
    size_t p = 0;
    for (int64_t o = 0; o < b.outer; ++o) {
      for (size_t c = 0; c < nc; ++c) {
        for (int64_t i = 0; i < b.inner; ++i, ++p) {
          if (pass == 0) {
            m.mean[c] += xd[p];
          } else {
            double d = xd[p] - m.mean[c];
            m.m2[c] += d * d;
          }
        }
      }
    }
    if (pass == 0) {
      for (double& v : m.mean) v /= static_cast<double>(m.count);
    }
  }
  return m;
}

void merge_channel_moments(ChannelMoments& into, const ChannelMoments& part) {
  SW_CHECK(into.mean.size() == part.mean.size() && into.m2.size() == part.m2.size() &&
               part.mean.size() == part.m2.size(),
           "batch_norm: cannot merge the moments of {} channels into those of {}", part.mean.size(),
           into.mean.size());
  if (part.count == 0) return;
  auto na = static_cast<double>(into.count), nb = static_cast<double>(part.count);
  double n = na + nb;
  for (size_t c = 0; c < into.mean.size(); ++c) {
    double delta = part.mean[c] - into.mean[c];
    into.mean[c] += delta * (nb / n);
    into.m2[c] += part.m2[c] + delta * delta * (na * nb / n);
  }
  into.count += part.count;
}

ChannelStats batch_norm_stats(const ChannelMoments& moments) {
  ChannelStats st{moments.mean, moments.m2};
  auto n = static_cast<double>(moments.count);
  for (size_t c = 0; c < st.var.size(); ++c) {
    if (moments.count == 0) st.mean[c] = std::nan("");
    st.var[c] /= n;  // count 0: NaN
  }
  return st;
}

BatchNormOutputs batch_norm_with_stats(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var, const ChannelStats& stats,
                                       int64_t count, const BatchNormOptions& options, std::string_view op) {
  Blocks b = check_batch_norm_args(op, x, scale, bias, running_mean, running_var, options.channels_last);
  auto nc = static_cast<size_t>(b.channels);
  SW_CHECK(stats.mean.size() == nc && stats.var.size() == nc, "{}: {} statistics for {} channels", op,
           stats.mean.size(), nc);
  SW_CHECK(count > 1,
           "{}: training needs more than 1 value per channel to estimate the variance, the batch has {} (x {}; use "
           "training=false, or a larger batch)",
           op, count, x.shape().to_string());
  std::vector<double> rm = to_doubles(running_mean), rv = to_doubles(running_var), rstd(nc);
  auto n = static_cast<double>(count);
  double m = options.momentum;
  for (size_t c = 0; c < nc; ++c) {
    rstd[c] = 1.0 / std::sqrt(stats.var[c] + options.epsilon);
    rm[c] = m * rm[c] + (1.0 - m) * stats.mean[c];
    rv[c] = m * rv[c] + (1.0 - m) * stats.var[c] * n / (n - 1.0);
  }
  BatchNormOutputs r;
  r.running_mean = from_doubles(scale.dtype(), scale.shape(), rm);
  r.running_var = from_doubles(scale.dtype(), scale.shape(), rv);
  normalize_into(r, x, b, scale, bias, stats.mean, rstd);
  return r;
}

BatchNormOutputs batch_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, const BatchNormOptions& options) {
  Blocks b = check_batch_norm_args(kBatchNorm, x, scale, bias, running_mean, running_var, options.channels_last);
  if (options.training) {
    ChannelSums sums = batch_norm_local_sums(x, options.channels_last);
    return batch_norm_with_stats(x, scale, bias, running_mean, running_var, batch_norm_stats(sums), sums.count,
                                 options);
  }
  std::vector<double> rv = to_doubles(running_var), rstd(static_cast<size_t>(b.channels));
  for (size_t c = 0; c < rstd.size(); ++c) rstd[c] = 1.0 / std::sqrt(rv[c] + options.epsilon);
  BatchNormOutputs r;
  r.running_mean = running_mean.clone();
  r.running_var = running_var.clone();
  normalize_into(r, x, b, scale, bias, to_doubles(running_mean), rstd);
  return r;
}

ChannelGradSums batch_norm_local_grad_sums(const Tensor& x, const Tensor& dy, const Tensor& saved_mean,
                                           const Tensor& saved_rstd, bool channels_last) {
  check_batch_norm_x(x);
  Blocks b = channel_blocks(x.shape(), channels_last);
  check_like("batch_norm backward", dy, "dy", x.shape(), x.dtype());
  SW_CHECK(saved_mean.defined(), "batch_norm backward: saved_mean is undefined");
  check_param("batch_norm backward", saved_mean, "saved_mean", x, b.channels, saved_mean.dtype());
  check_param("batch_norm backward", saved_rstd, "saved_rstd", x, b.channels, saved_mean.dtype());
  std::vector<double> xd = to_doubles(x), g = to_doubles(dy);
  std::vector<double> mean = to_doubles(saved_mean), rstd = to_doubles(saved_rstd);
  auto nc = static_cast<size_t>(b.channels);
  ChannelGradSums s;
  s.sum_dy.assign(nc, 0.0);
  s.sum_dy_xhat.assign(nc, 0.0);
  size_t p = 0;
  for (int64_t o = 0; o < b.outer; ++o) {
    for (size_t c = 0; c < nc; ++c) {
      for (int64_t i = 0; i < b.inner; ++i, ++p) {
        s.sum_dy[c] += g[p];
        s.sum_dy_xhat[c] += g[p] * (xd[p] - mean[c]) * rstd[c];
      }
    }
  }
  return s;
}

NormGrads batch_norm_backward_from_sums(const Tensor& x, const Tensor& scale, const Tensor& saved_mean,
                                        const Tensor& saved_rstd, const Tensor& dy, const ChannelGradSums& sums,
                                        int64_t count, const BatchNormOptions& options) {
  check_batch_norm_x(x);
  Blocks b = channel_blocks(x.shape(), options.channels_last);
  SW_CHECK(scale.defined(), "batch_norm backward: scale is undefined");
  DType pt = scale.dtype();
  check_param("batch_norm backward", scale, "scale", x, b.channels, pt);
  check_param("batch_norm backward", saved_mean, "saved_mean", x, b.channels, pt);
  check_param("batch_norm backward", saved_rstd, "saved_rstd", x, b.channels, pt);
  check_like("batch_norm backward", dy, "dy", x.shape(), x.dtype());
  auto nc = static_cast<size_t>(b.channels);
  SW_CHECK(sums.sum_dy.size() == nc && sums.sum_dy_xhat.size() == nc,
           "batch_norm backward: {} gradient sums for {} channels", sums.sum_dy.size(), nc);
  std::vector<double> xd = to_doubles(x), g = to_doubles(dy), sc = to_doubles(scale);
  std::vector<double> mean = to_doubles(saved_mean), rstd = to_doubles(saved_rstd);
  auto n = static_cast<double>(count);
  size_t p = 0;
  for (int64_t o = 0; o < b.outer; ++o) {
    for (size_t c = 0; c < nc; ++c) {
      double k = sc[c] * rstd[c];
      for (int64_t i = 0; i < b.inner; ++i, ++p) {
        if (options.training) {
          double xhat = (xd[p] - mean[c]) * rstd[c];
          g[p] = k / n * (n * g[p] - sums.sum_dy[c] - xhat * sums.sum_dy_xhat[c]);
        } else {
          g[p] = k * g[p];
        }
      }
    }
  }
  NormGrads r;
  r.dx = from_doubles(x.dtype(), x.shape(), g);
  r.dscale = from_doubles(pt, scale.shape(), sums.sum_dy_xhat);
  r.dbias = from_doubles(pt, scale.shape(), sums.sum_dy);
  return r;
}

NormGrads batch_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& saved_mean, const Tensor& saved_rstd,
                              const Tensor& dy, const BatchNormOptions& options) {
  check_batch_norm_x(x);
  ChannelGradSums sums = batch_norm_local_grad_sums(x, dy, saved_mean, saved_rstd, options.channels_last);
  Blocks b = channel_blocks(x.shape(), options.channels_last);
  return batch_norm_backward_from_sums(x, scale, saved_mean, saved_rstd, dy, sums, b.outer * b.inner, options);
}

// ---------------------------------------------------------------------------------------------
// group_norm / instance_norm

namespace {

// x read as [N, A, C, B] (channels first: A = 1, B = spatial; channels last: A = spatial, B = 1):
// element (n, a, c, b) is at ((n * A + a) * C + c) * B + b.
struct GroupLayout {
  int64_t n = 0, a = 1, channels = 0, b = 1;
  int64_t cpg = 1;     // channels per group
  int64_t groups = 0;  // local groups
  int64_t row(int64_t ni, int64_t ai, int64_t c) const { return ((ni * a + ai) * channels + c) * b; }
  double group_size() const { return static_cast<double>(cpg * a * b); }
};

GroupLayout group_layout(std::string_view op, const Tensor& x, bool channels_last, int64_t cpg,
                         const ChannelShard& shard) {
  const Shape& s = x.shape();
  GroupLayout g;
  g.n = s[0];
  int axis = channel_axis(s.ndim(), channels_last);
  g.channels = s[axis];
  for (int d = 1; d < s.ndim(); ++d) {
    if (d == axis) continue;
    (channels_last ? g.a : g.b) *= s[d];
  }
  g.cpg = cpg;
  SW_CHECK(g.channels % cpg == 0 && shard.channel_offset % cpg == 0,
           "{}: x {} holds channels [{}, {}), which do not start and end on group boundaries ({} channels per group)",
           op, s.to_string(), shard.channel_offset, shard.channel_offset + g.channels, cpg);
  g.groups = g.channels / cpg;
  return g;
}

NormOutputs grouped_norm(std::string_view op, const Tensor& x, const Tensor& scale, const Tensor& bias,
                         const GroupLayout& g, double epsilon) {
  SW_CHECK(scale.defined(), "{}: scale is undefined", op);
  DType pt = scale.dtype();
  check_param(op, scale, "scale", x, g.channels, pt);
  check_param(op, bias, "bias", x, g.channels, pt);
  std::vector<double> xd = to_doubles(x), sc = to_doubles(scale), bi = to_doubles(bias);
  auto stats = static_cast<size_t>(g.n * g.groups);
  std::vector<double> mean(stats), rstd(stats);
  for (int64_t ni = 0; ni < g.n; ++ni) {
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      double sum = 0, sum_sq = 0;
      for (int64_t ai = 0; ai < g.a; ++ai) {
        for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c) {
          const double* v = xd.data() + g.row(ni, ai, c);
          for (int64_t bi2 = 0; bi2 < g.b; ++bi2) {
            sum += v[bi2];
            sum_sq += v[bi2] * v[bi2];
          }
        }
      }
      auto k = static_cast<size_t>(ni * g.groups + gi);
      mean[k] = sum / g.group_size();
      double var = sum_sq / g.group_size() - mean[k] * mean[k];
      rstd[k] = 1.0 / std::sqrt((var < 0 ? 0.0 : var) + epsilon);
      for (int64_t ai = 0; ai < g.a; ++ai) {
        for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c) {
          double* v = xd.data() + g.row(ni, ai, c);
          auto cu = static_cast<size_t>(c);
          double mul = rstd[k] * sc[cu];
          for (int64_t bi2 = 0; bi2 < g.b; ++bi2) v[bi2] = (v[bi2] - mean[k]) * mul + bi[cu];
        }
      }
    }
  }
  Shape ss{g.n, g.groups};
  return {from_doubles(x.dtype(), x.shape(), xd), from_doubles(pt, ss, mean), from_doubles(pt, ss, rstd)};
}

NormGrads grouped_norm_backward(std::string_view op, const Tensor& x, const Tensor& scale, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dy, const GroupLayout& g) {
  SW_CHECK(scale.defined(), "{}: scale is undefined", op);
  DType pt = scale.dtype();
  check_param(op, scale, "scale", x, g.channels, pt);
  Shape ss{g.n, g.groups};
  check_like(op, mean, "the saved mean", ss, pt);
  check_like(op, rstd, "the saved rstd", ss, pt);
  check_like(op, dy, "dy", x.shape(), x.dtype());
  std::vector<double> xd = to_doubles(x), dyd = to_doubles(dy), sc = to_doubles(scale);
  std::vector<double> md = to_doubles(mean), rd = to_doubles(rstd);
  std::vector<double> dx(xd.size()), dscale(static_cast<size_t>(g.channels)), dbias(static_cast<size_t>(g.channels));
  for (int64_t ni = 0; ni < g.n; ++ni) {
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      auto k = static_cast<size_t>(ni * g.groups + gi);
      double mu = md[k], r = rd[k];
      // sum(g) and sum(g * xhat) over the group, g = dy * scale.
      double sum_g = 0, sum_g_xhat = 0;
      for (int64_t ai = 0; ai < g.a; ++ai) {
        for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c) {
          int64_t base = g.row(ni, ai, c);
          auto cu = static_cast<size_t>(c);
          for (int64_t j = base; j < base + g.b; ++j) {
            auto ju = static_cast<size_t>(j);
            double xhat = (xd[ju] - mu) * r;
            double gj = dyd[ju] * sc[cu];
            sum_g += gj;
            sum_g_xhat += gj * xhat;
            dscale[cu] += dyd[ju] * xhat;
            dbias[cu] += dyd[ju];
          }
        }
      }
      double mean_g = sum_g / g.group_size(), mean_g_xhat = sum_g_xhat / g.group_size();
      for (int64_t ai = 0; ai < g.a; ++ai) {
        for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c) {
          int64_t base = g.row(ni, ai, c);
          auto cu = static_cast<size_t>(c);
          for (int64_t j = base; j < base + g.b; ++j) {
            auto ju = static_cast<size_t>(j);
            double xhat = (xd[ju] - mu) * r;
            dx[ju] = r * (dyd[ju] * sc[cu] - mean_g - xhat * mean_g_xhat);
          }
        }
      }
    }
  }
  return {from_doubles(x.dtype(), x.shape(), dx), from_doubles(pt, scale.shape(), dscale),
          from_doubles(pt, scale.shape(), dbias)};
}

constexpr std::string_view kGroupNorm = "group_norm";
constexpr std::string_view kInstanceNorm = "instance_norm";

GroupLayout checked_group_layout(const Tensor& x, const GroupNormOptions& o, const ChannelShard& shard) {
  check_x(kGroupNorm, x);
  int64_t local_c = x.shape()[channel_axis(x.ndim(), o.channels_last)];
  int64_t global_c = shard.global_channels < 0 ? local_c : shard.global_channels;
  int64_t cpg = group_norm_channels_per_group(global_c, o.groups);
  SW_CHECK(shard.channel_offset >= 0 && shard.channel_offset + local_c <= global_c,
           "group_norm: x {} holds channels [{}, {}) of {}", x.shape().to_string(), shard.channel_offset,
           shard.channel_offset + local_c, global_c);
  return group_layout(kGroupNorm, x, o.channels_last, cpg, shard);
}

GroupLayout instance_layout(const Tensor& x) {
  check_x(kInstanceNorm, x);
  check_instance_norm_rank(x.ndim());
  return group_layout(kInstanceNorm, x, false, 1, {});
}

}  // namespace

GroupNormOptions group_norm_options(const Attrs& attrs) {
  GroupNormOptions o;
  SW_CHECK(attrs.has("groups"), "group_norm: the attribute 'groups' (number of channel groups) is required");
  o.groups = attrs.get_int("groups");
  o.epsilon = attrs.get_float("epsilon", 1e-5);
  o.channels_last = channels_last_format(attrs, kGroupNorm);
  SW_CHECK(o.epsilon >= 0, "group_norm: epsilon must be >= 0, got {}", o.epsilon);
  return o;
}

int64_t group_norm_channels_per_group(int64_t global_channels, int64_t groups) {
  SW_CHECK(groups >= 1 && global_channels >= groups && global_channels % groups == 0,
           "group_norm: groups = {} must be >= 1 and divide the {} channels of x", groups, global_channels);
  return global_channels / groups;
}

NormOutputs group_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, const GroupNormOptions& options,
                       const ChannelShard& shard) {
  GroupLayout g = checked_group_layout(x, options, shard);
  return grouped_norm(kGroupNorm, x, scale, bias, g, options.epsilon);
}

NormGrads group_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dy, const GroupNormOptions& options, const ChannelShard& shard) {
  GroupLayout g = checked_group_layout(x, options, shard);
  return grouped_norm_backward("group_norm backward", x, scale, mean, rstd, dy, g);
}

void check_instance_norm_rank(int ndim) {
  SW_CHECK(ndim >= 3 && ndim <= 5, "instance_norm: x must have rank 3, 4 or 5 ([N, C, spatial...]), got rank {}",
           ndim);
}

NormOutputs instance_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, double epsilon) {
  SW_CHECK(epsilon >= 0, "instance_norm: epsilon must be >= 0, got {}", epsilon);
  return grouped_norm(kInstanceNorm, x, scale, bias, instance_layout(x), epsilon);
}

NormGrads instance_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& saved_mean,
                                 const Tensor& saved_rstd, const Tensor& dy) {
  return grouped_norm_backward("instance_norm backward", x, scale, saved_mean, saved_rstd, dy, instance_layout(x));
}

}  // namespace shardwise::ops
