// moe_mlp on the fake device: the CPU kernel (ops/moe/kernels.h) on host views of its inputs, as
// the table's fallback runs every op, but with the kernel's exchanges on the device (MoeMoves,
// ops/moe/moves.h): the router's block sums written to device memory, all-gathered on device
// buffers and read on the host by one counted copy (device_copy_stats); the rows packed into
// device memory and moved by all_to_all_pieces on device buffers, under a comm::DeviceBuffers
// scope on the current stream. So a device run with experts or tokens over ranks proves the
// device-buffer calls a GPU makes, and reads on the host what a GPU must: the counts.
#include "shardwise/ops/fake_device_moe.h"

#include <algorithm>
#include <memory>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/ops/fake_host_window.h"
#include "shardwise/ops/moe/kernels.h"

namespace shardwise::ops {

namespace {

// Fake-device memory of `bytes` (at least one), open for the host while it lives.
class FakeRows : public MoeMoves::Rows {
 public:
  FakeRows(FakeDeviceMemory& fake, Device device, size_t bytes)
      : fake_(fake),
        block_(empty_on(DType::U8, Shape{static_cast<int64_t>(std::max<size_t>(bytes, 1))}, device, current_stream())) {
    fake_.open_for_host(block_.device_ptr(), block_.nbytes());
  }
  ~FakeRows() override { fake_.close_for_host(block_.device_ptr()); }
  FakeRows(const FakeRows&) = delete;
  FakeRows& operator=(const FakeRows&) = delete;
  std::byte* data() override { return static_cast<std::byte*>(block_.device_ptr()); }

 private:
  FakeDeviceMemory& fake_;
  Tensor block_;
};

class FakeMoves : public MoeMoves {
 public:
  explicit FakeMoves(const HostWindow& w) : fake_(w.memory()), device_(w.device()) {}

  void gather_sums(comm::Communicator& group, std::span<const double> mine, std::span<double> gathered) const override {
    Tensor all = empty_on(DType::F64, Shape{static_cast<int64_t>(gathered.size())}, device_, current_stream());
    {
      FakeRows in(fake_, device_, mine.size_bytes());  // what the router's kernel writes on a GPU
      std::copy(mine.begin(), mine.end(), reinterpret_cast<double*>(in.data()));
      comm::DeviceBuffers on_device(device_, current_stream());
      group.all_gather(in.data(), all.device_ptr(), static_cast<int64_t>(mine.size()), DType::F64);
    }
    copy_to_host(all, std::as_writable_bytes(gathered), current_stream());
  }

  std::unique_ptr<Rows> rows(size_t bytes) const override { return std::make_unique<FakeRows>(fake_, device_, bytes); }

  void exchange(comm::Communicator& group, const void* in, const comm::Pieces& send, void* out, const comm::Pieces& recv,
                DType dtype) const override {
    comm::DeviceBuffers on_device(device_, current_stream());
    group.all_to_all_pieces(in, send, out, recv, dtype);
  }

 private:
  FakeDeviceMemory& fake_;
  Device device_;
};

// The call's shard (moe_device_shard_of: groups of one rank dropped) with the device's moves.
MoeShard shard_on(const KernelContext* ctx, const MoeMoves& moves) {
  MoeShard s = moe_device_shard_of(ctx);
  s.moves = &moves;
  return s;
}

std::vector<Tensor> forward(const OpDef&, std::span<const Tensor> inputs, const Attrs& attrs, const KernelContext* ctx) {
  HostWindow w(first_on_device(inputs)->device());
  w.note_launch();
  const std::vector<Tensor> in = w.views(inputs);
  const FakeMoves moves(w);
  return w.to_device(moe_forward(in, moe_config(attrs, in[1].shape()[0]), shard_on(ctx, moves)));
}

std::vector<Tensor> backward(const OpDef&, std::span<const Tensor> inputs, std::span<const Tensor>,
                             std::span<const Tensor> out_grads, const Attrs& attrs, const KernelContext* ctx,
                             std::span<const bool>) {
  HostWindow w(first_on_device(inputs)->device());
  w.note_launch();
  const std::vector<Tensor> in = w.views(inputs), dout = w.views(out_grads);
  const FakeMoves moves(w);
  MoeGrads g = moe_backward(in, dout[0], dout[1], dout[2], moe_config(attrs, in[1].shape()[0]), shard_on(ctx, moves));
  return w.to_device({g.dx, g.dgate, g.dw1, g.dw3, g.dw2});
}

}  // namespace

std::unique_ptr<MoeMoves> fake_moe_moves(const HostWindow& window) { return std::make_unique<FakeMoves>(window); }

void bind_fake_moe(DeviceKernelTable& table) {
  table.add_forward("moe_mlp", forward);
  table.add_backward("moe_mlp", backward);
}

}  // namespace shardwise::ops
