#include "shardwise/cuda_ops/moe_ranks.h"

#include <span>
#include <utility>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/moe/dispatch.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda_ops {

namespace md = ops::moe_detail;

namespace {

// Every token block's row of the router's sums, gathered on device memory and read on the host once.
md::Routing gathered_sums(const cuda::MoeRouting& r, const ops::MoeShard& shard, int64_t local_experts) {
  md::Routing h;
  h.tokens = r.probs.shape()[0], h.experts = r.probs.shape()[1], h.top_k = r.config.top_k;
  h.tokens_total = shard.tokens_total < 0 ? h.tokens : shard.tokens_total;
  h.blocks = shard.token_group ? shard.token_group->size() : 1;
  h.capacity = -1;
  const Tensor mine = cuda::moe_block_sums(r, shard.token_offset, shard.expert_offset, local_experts, current_stream());
  Tensor all = mine;
  if (shard.token_group) {
    all = empty_on(DType::F64, Shape{mine.numel() * h.blocks}, mine.device(), current_stream());
    comm::DeviceBuffers on_device(mine.device(), current_stream());
    shard.token_group->all_gather(mine.device_ptr(), all.device_ptr(), mine.numel(), DType::F64);
  }
  h.block_sums.resize(static_cast<size_t>(all.numel()));
  copy_to_host(all, std::as_writable_bytes(std::span<double>(h.block_sums)), current_stream());
  md::sum_blocks(h);
  return h;
}

// This rank's rows for each of the E experts (dropless: every assignment), from its own block's row.
std::vector<int64_t> my_rows(const md::Routing& h, const ops::MoeShard& shard) {
  const int block = shard.token_group ? shard.token_group->rank() : 0;
  const size_t width = h.block_sums.size() / static_cast<size_t>(h.blocks);
  const double* row = &h.block_sums[static_cast<size_t>(block) * width];
  std::vector<int64_t> rows(static_cast<size_t>(h.experts), 0);
  for (int64_t s = 0; s < h.top_k; ++s) {
    for (int64_t e = 0; e < h.experts; ++e) rows[static_cast<size_t>(e)] += static_cast<int64_t>(row[3 + s * h.experts + e]);
  }
  return rows;
}

template <class T>
Tensor on_device(std::vector<T> values, const Shape& shape, Device device) {
  return to_device(Tensor::from<T>(shape, values), device, current_stream());
}

// The rows of `from` (pieces `sent`) to `to` (pieces `got`) over the expert group, on device buffers.
Tensor exchange(const MoeRouted& routed, const Tensor& from, const md::RowPieces& sent, const md::RowPieces& got,
                int64_t rows) {
  comm::Communicator* group = routed.ranks->shard.expert_group;
  Tensor to = empty_on(DType::F32, Shape{rows, from.shape()[1]}, from.device(), current_stream());
  comm::DeviceBuffers on_device(from.device(), current_stream());
  comm::CheckedByCaller checked(group);  // after the counts' all-gather, which carried every size
  group->all_to_all_pieces(from.device_ptr(), sent.view(), to.device_ptr(), got.view(), DType::F32);
  return to;
}

}  // namespace

MoeRouted moe_route_call(const OpDef& op, In in, const Tensor& x32,
                         const cuda::MoeRouterConfig& config, const KernelContext* ctx) {
  MoeRouted out;
  const ops::MoeShard shard = ops::moe_device_shard_of(ctx);
  if (!shard.token_group && !shard.expert_group) {
    out.r = cuda::moe_route(x32, in[1], config, current_stream());
    out.d = cuda::moe_plan(out.r, current_stream());
    out.expert_rows = out.d.expert_rows;
    return out;
  }
  if (config.capacity_factor > 0) {
    unsupported(op, in[0],
                "capacity_factor > 0 with the tokens over ranks (each expert's capacity positions after the earlier "
                "token blocks' assignments): not built on CUDA; use a dropless router (capacity_factor 0)");
  }
  out.r = cuda::moe_route(x32, in[1], config, current_stream());
  const int64_t local_experts = in[2].shape()[0];
  const md::Routing h = gathered_sums(out.r, shard, local_experts);
  out.ranks = MoeRanks{shard, md::plan_sizes(h, local_experts, shard)};
  out.d = cuda::moe_plan(out.r, my_rows(h, shard), current_stream());
  out.expert_rows = out.ranks->plan.expert_rows;
  // The global figures, as the CPU computes them (f32 losses from the f64 sums).
  const Device dev = x32.device();
  std::vector<int64_t> counts(h.count_total.begin(), h.count_total.end());
  out.r.expert_tokens = on_device(std::move(counts), Shape{h.experts}, dev);
  out.r.aux_loss = on_device(std::vector<float>{static_cast<float>(md::aux_loss_of(h))}, Shape{}, dev);
  out.r.z_loss = on_device(std::vector<float>{static_cast<float>(md::z_loss_of(h))}, Shape{}, dev);
  out.r.dropped = zeros_on(DType::I64, Shape{}, dev, current_stream());  // dropless
  out.r.tokens_total = h.tokens_total;
  return out;
}

Tensor moe_to_experts(const MoeRouted& routed, const Tensor& rows) {
  if (!routed.ranks || !routed.ranks->shard.expert_group) return rows;
  const md::DispatchPlan& plan = routed.ranks->plan;
  const int64_t w = rows.shape()[1];
  return exchange(routed, rows, md::send_order(plan, w), md::expert_major(plan, w), md::total_rows(plan.recv_rows));
}

Tensor moe_from_experts(const MoeRouted& routed, const Tensor& rows) {
  if (!routed.ranks || !routed.ranks->shard.expert_group) return rows;
  const md::DispatchPlan& plan = routed.ranks->plan;
  const int64_t w = rows.shape()[1];
  return exchange(routed, rows, md::expert_major(plan, w), md::send_order(plan, w), md::total_rows(plan.send_rows));
}

}  // namespace shardwise::cuda_ops
