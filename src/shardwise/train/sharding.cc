#include "shardwise/train/sharding.h"

#include <algorithm>
#include <numeric>

#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/train/device_ranges.h"

namespace shardwise::train {

Tensor flat_range(const Tensor& t, int64_t begin, int64_t n) {
  const size_t bytes = dtype_size(t.dtype());
  Tensor out = uninitialized_like(t, t.dtype(), Shape{n});  // on a device, a copy on the current stream
  copy_bytes(out, 0, t, static_cast<size_t>(begin) * bytes, static_cast<size_t>(n) * bytes);
  return out;
}

void ShardingConfig::check() const {
  SW_CHECK(stage >= 0 && stage <= 3,
           "--sharding-stage must be 0 (none), 1 (optimizer state), 2 (and gradients) or 3 (and parameters), got {}",
           stage);
  SW_CHECK(layout == "v1" || layout == "v2",
           "--sharding-layout must be v1 (each parameter's state on one dp rank) or v2 (split-param: a flat buffer "
           "cut into equal dp ranges), got '{}'",
           layout);
  SW_CHECK(prefetch_params >= 0, "--prefetch-params must be 0 (off) or a number of layers, got {}", prefetch_params);
  SW_CHECK(prefetch_params == 0 || stage == 3,
           "--prefetch-params {} prefetches stage 3's parameter all-gathers: it needs --sharding-stage 3 (got stage {})",
           prefetch_params, stage);
}

std::vector<int> data_group_dims(const mesh::DistAttr& dist, std::span<const int> data_dims) {
  std::vector<int> out;
  for (int d : data_dims)
    if (d >= 0 && dist[d].is_replicate()) out.push_back(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool DataGroups::any_shared() const {
  return std::any_of(comms.begin(), comms.end(), [](const auto& c) { return c->size() > 1; });
}

int64_t ShardPlan::begin(size_t i) const {
  int64_t b = 0;
  for (int r = 0; r < ranks[i]; ++r) b += counts[i][static_cast<size_t>(r)];
  return b;
}

int64_t ShardPlan::owned_elements() const {
  int64_t n = 0;
  for (size_t i = 0; i < counts.size(); ++i) n += count(i);
  return n;
}

ShardPlan plan_shards(const std::string& layout, const std::vector<int64_t>& numels, int dp, int rank) {
  SW_CHECK(dp >= 1 && rank >= 0 && rank < dp, "sharding: rank {} of a dp group of {}", rank, dp);
  ShardPlan plan;
  plan.ranks.assign(numels.size(), rank);
  plan.counts.assign(numels.size(), std::vector<int64_t>(static_cast<size_t>(dp), 0));
  if (layout == "v1") {
    std::vector<size_t> order(numels.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
    std::vector<int64_t> load(static_cast<size_t>(dp), 0);
    for (size_t i : order) {
      const size_t owner = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      plan.counts[i][owner] = numels[i];
      load[owner] += numels[i];
    }
    return plan;
  }
  SW_CHECK(layout == "v2", "sharding: unknown layout '{}'", layout);
  const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
  int64_t offset = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    for (int r = 0; r < dp; ++r) {
      const int64_t lo = total * r / dp, hi = total * (r + 1) / dp;
      plan.counts[i][static_cast<size_t>(r)] = std::max<int64_t>(0, std::min(offset + numels[i], hi) - std::max(offset, lo));
    }
    offset += numels[i];
  }
  return plan;
}

ShardPlan plan_shards(const std::string& layout, const std::vector<int64_t>& numels, const std::vector<int>& group_of,
                      const std::vector<int>& sizes, const std::vector<int>& ranks) {
  SW_CHECK(group_of.size() == numels.size() && sizes.size() == ranks.size(),
           "sharding: {} groups for {} parameters, {} sizes for {} ranks", group_of.size(), numels.size(), sizes.size(),
           ranks.size());
  ShardPlan plan;
  plan.counts.resize(numels.size());
  plan.ranks.resize(numels.size());
  for (size_t g = 0; g < sizes.size(); ++g) {
    std::vector<size_t> members;
    std::vector<int64_t> sub;
    for (size_t i = 0; i < numels.size(); ++i)
      if (group_of[i] == static_cast<int>(g)) members.push_back(i), sub.push_back(numels[i]);
    ShardPlan one = plan_shards(layout, sub, sizes[g], ranks[g]);
    for (size_t k = 0; k < members.size(); ++k) {
      plan.counts[members[k]] = std::move(one.counts[k]);
      plan.ranks[members[k]] = ranks[g];
    }
  }
  return plan;
}

ShardedOptimizer::ShardedOptimizer(ShardingConfig config, std::vector<ParamState>& params, DataGroups groups)
    : c_(std::move(config)), g_(std::move(groups)) {
  c_.check();
  SW_CHECK(g_.of.size() == params.size(), "sharding: data groups for {} parameters, {} given", g_.of.size(),
           params.size());
  std::vector<int64_t> numels;
  for (const ParamState& p : params) numels.push_back(p.param.numel());
  std::vector<int> sizes, ranks;
  for (size_t g = 0; g < g_.comms.size(); ++g) {
    // Every rank of a group must cut the same blocks: compare the element counts.
    int64_t mine[2] = {0, 0};
    for (size_t i = 0; i < numels.size(); ++i)
      if (g_.of[i] == static_cast<int>(g)) mine[0] += 1, mine[1] += numels[i];
    int64_t low[2], high[2];
    g_.comms[g]->all_reduce(mine, low, 2, DType::I64, comm::Reduce::Min);
    g_.comms[g]->all_reduce(mine, high, 2, DType::I64, comm::Reduce::Max);
    SW_CHECK(low[0] == high[0] && low[1] == high[1],
             "sharding: the ranks of a data group hold different parameter blocks ({}..{} parameters, {}..{} elements)",
             low[0], high[0], low[1], high[1]);
    sizes.push_back(g_.comms[g]->size());
    ranks.push_back(g_.comms[g]->rank());
  }
  plan_ = plan_shards(c_.layout, numels, g_.of, sizes, ranks);
  for (size_t i = 0; i < params.size(); ++i) {
    // Fresh moments are zero: allocated here at the shard's size when the model left them out.
    ParamState& p = params[i];
    const int64_t n = plan_.count(i), b = plan_.begin(i);
    auto fresh = [&] {  // where the parameter lives
      return p.param.on_device() ? zeros_on(DType::F32, Shape{n}, p.param.device(), current_stream())
                                 : Tensor(DType::F32, Shape{n});
    };
    p.exp_avg = p.exp_avg.defined() ? flat_range(p.exp_avg, b, n) : fresh();
    p.exp_avg_sq = p.exp_avg_sq.defined() ? flat_range(p.exp_avg_sq, b, n) : fresh();
    p.master = p.param.dtype() == DType::F32 ? Tensor() : flat_range(p.master, b, n);
  }
}

std::vector<Tensor> ShardedOptimizer::reduce(std::vector<Tensor>& grads, const std::vector<bool>& partial) {
  SW_CHECK(grads.size() == plan_.counts.size(), "sharding: {} gradients for {} parameters", grads.size(),
           plan_.counts.size());
  std::vector<Tensor> owned(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t n = plan_.count(i);
    if (c_.stage >= 2 && partial[i]) {  // a device's sums on the device, queued on the current stream
      owned[i] = uninitialized_like(grads[i], DType::F32, Shape{n});
      const BuffersOf on_device(grads[i]);
      group_of(i).reduce_scatter_v(buffer_of(grads[i]), buffer_of(owned[i]), plan_.counts[i], DType::F32,
                                   comm::Reduce::Sum);
      grads[i] = Tensor();  // the full sum goes as soon as it is reduced
    } else {
      owned[i] = flat_range(grads[i], plan_.begin(i), n);
    }
  }
  if (c_.stage >= 2) grads.clear();
  return owned;
}

void ShardedOptimizer::step(const AdamW& adamw, std::vector<ParamState>& params, const std::vector<Tensor>& owned,
                            double lr, int64_t step) {
  SW_CHECK(step >= 1, "AdamW: steps count from 1, got {}", step);
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState& p = params[i];
    if (p.param.on_device()) {
      step_on_device(adamw, i, p, owned[i], lr, step);
      continue;
    }
    const int64_t n = plan_.count(i), b = plan_.begin(i);
    const bool f32 = p.param.dtype() == DType::F32;
    if (n > 0) {
      float* w = f32 ? p.param.data<float>() + b : p.master.data<float>();
      adamw.update(w, p.exp_avg.data<float>(), p.exp_avg_sq.data<float>(), owned[i].data<float>(), n, p.decay, lr, step);
    }
    // Every rank's updated range into every rank of the group's parameter (the kernels' dtype).
    Tensor piece = f32 ? flat_range(p.param, b, n) : p.master.to(p.param.dtype());
    Tensor out = f32 ? p.param : Tensor::uninitialized(p.param.dtype(), p.param.shape());
    group_of(i).all_gather_v(piece.raw(), out.raw(), plan_.counts[i], p.param.dtype());
    p.param = out;  // a bf16 parameter is a new tensor after each update, as unsharded
  }
}

// The same numbers on a device: an f32 parameter's range is copied out of `param`, updated by the
// device's AdamW kernel and gathered back into `param` (the host updates it in place, then gathers a
// copy of it); a bf16 parameter's master range is updated with its bf16 copy in the same kernel.
void ShardedOptimizer::step_on_device(const AdamW& adamw, size_t i, ParamState& p, const Tensor& owned, double lr,
                                      int64_t step) {
  const int64_t n = plan_.count(i);
  const bool f32 = p.param.dtype() == DType::F32;
  const Device d = p.param.device();
  Tensor master = f32 ? flat_range(p.param, plan_.begin(i), n) : p.master;
  Tensor piece = f32 ? master : empty_on(p.param.dtype(), Shape{n}, d, current_stream());
  if (n > 0) ops::adamw_on_device(master, p.exp_avg, p.exp_avg_sq, owned, adamw.hyper(p.decay, lr, step), f32 ? nullptr : &piece);
  Tensor out = f32 ? p.param : empty_on(p.param.dtype(), p.param.shape(), d, current_stream());
  const BuffersOf on_device(out);
  group_of(i).all_gather_v(piece.device_ptr(), out.device_ptr(), plan_.counts[i], p.param.dtype());
  p.param = out;
}

Tensor ShardedOptimizer::whole(size_t i, const Tensor& piece, const Shape& block_shape) {
  Tensor out = uninitialized_like(piece, piece.dtype(), block_shape), in = piece;
  const BuffersOf on_device(piece);
  group_of(i).all_gather_v(buffer_of(in), buffer_of(out), plan_.counts[i], piece.dtype());
  return out;
}

void ShardedOptimizer::gather_params(std::vector<ParamState>& params) {
  SW_CHECK(params.size() == plan_.counts.size(), "sharding: {} parameters for a plan of {}", params.size(),
           plan_.counts.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState& p = params[i];
    if (p.param.dtype() == DType::F32) continue;
    SW_CHECK(!p.master.on_device(), "sharding: '{}' on {}: a checkpoint load rebuilds the parameters on the host "
             "(load_on_host), before the state goes back to the device", p.name, p.master.device().to_string());
    SW_CHECK(p.master.numel() == plan_.count(i), "sharding: '{}' holds {} master elements, its range has {}", p.name,
             p.master.numel(), plan_.count(i));
    Tensor out = Tensor::uninitialized(p.param.dtype(), p.param.shape());
    group_of(i).all_gather_v(p.master.to(p.param.dtype()).raw(), out.raw(), plan_.counts[i], p.param.dtype());
    p.param = out;
  }
}

}  // namespace shardwise::train
