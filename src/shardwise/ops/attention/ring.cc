#include "shardwise/ops/attention/ring.h"

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::ops {
namespace {

// Every ring rank's block: its first sequence index and length.
struct Blocks {
  std::vector<int64_t> offset, size;
};
Blocks gather_blocks(comm::Communicator& ring, int64_t offset, int64_t size) {
  const int n = ring.size();
  int64_t mine[2] = {offset, size};
  std::vector<int64_t> all(static_cast<size_t>(2 * n));
  ring.all_gather(mine, all.data(), 2, DType::I64);
  Blocks b;
  for (int r = 0; r < n; ++r) b.offset.push_back(all[static_cast<size_t>(2 * r)]), b.size.push_back(all[static_cast<size_t>(2 * r + 1)]);
  return b;
}

// s with its sequence dim (the second to last) holding `rows`.
Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out[out.ndim() - 2] = rows;
  return out;
}

// A block passed to the next ring rank while the previous one's block comes in: both started,
// the caller computes meanwhile, finish() waits. Even ranks wait for their send first, odd ones
// for their receive, so that a backend whose started calls are made at the wait (the base class's
// default) makes them in an order without a deadlock. One tag per kind of block (k, v, dk, dv).
// Device tensors travel as device buffers (a DeviceBuffers scope on the current stream at the
// start and at the wait), the received block in fresh device memory.
class Transfer {
 public:
  Transfer(comm::Communicator& ring, const Tensor& send, int64_t rows, int tag, Device device)
      : sent_(send), got_(empty_block(send.dtype(), with_rows(send.shape(), rows), device)), device_(device) {
    const int n = ring.size(), r = ring.rank();
    const std::optional<comm::DeviceBuffers> scope = scope_of(device_);
    auto start_send = [&] {
      if (sent_.numel() > 0) requests_.push_back(ring.start_send(bytes_of(sent_), sent_.numel(), sent_.dtype(), (r + 1) % n, tag));
    };
    auto start_recv = [&] {
      if (got_.numel() > 0) requests_.push_back(ring.start_recv(bytes_of(got_), got_.numel(), got_.dtype(), (r + n - 1) % n, tag));
    };
    if (r % 2 == 0) start_send(), start_recv();
    else start_recv(), start_send();
  }
  // The previous rank's block (`rows` rows).
  Tensor finish() {
    const std::optional<comm::DeviceBuffers> scope = scope_of(device_);
    for (auto& request : requests_) request->wait();
    requests_.clear();
    sent_ = Tensor();
    return got_;
  }

 private:
  static Tensor empty_block(DType dtype, const Shape& shape, Device device) {
    return device.is_host() ? Tensor::uninitialized(dtype, shape) : empty_on(dtype, shape, device, current_stream());
  }
  static std::optional<comm::DeviceBuffers> scope_of(Device device) {
    if (device.is_host()) return std::nullopt;
    return std::optional<comm::DeviceBuffers>(std::in_place, device, current_stream());
  }
  static void* bytes_of(Tensor& t) { return t.on_device() ? t.device_ptr() : t.raw(); }
  static const void* bytes_of(const Tensor& t) { return t.on_device() ? t.device_ptr() : t.raw(); }
  Tensor sent_, got_;  // alive until the transfer is done
  Device device_;
  std::vector<std::unique_ptr<comm::Request>> requests_;
};
enum Tag : int { kKeys = 1, kValues = 2, kKeyGrads = 3, kValueGrads = 4 };

// acc += x (both of the compute type, f32 or f64, one shape).
template <class C>
void add_typed(Tensor& acc, const Tensor& x) {
  C* a = acc.data<C>();
  const C* b = x.data<C>();
  for (int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
}

template <class C>
void merge(C* out, C* lse, const C* out_b, const C* lse_b, int64_t rows, int64_t D) {
  for (int64_t i = 0; i < rows; ++i) {
    const C a = lse[i], b = lse_b[i];
    if (std::isinf(b) && b < 0) continue;
    const C m = std::max(a, b);
    const C l = m + std::log(std::exp(a - m) + std::exp(b - m));
    const C wa = std::exp(a - l), wb = std::exp(b - l);
    for (int64_t d = 0; d < D; ++d) out[i * D + d] = wa * out[i * D + d] + wb * out_b[i * D + d];
    lse[i] = l;
  }
}

RingKernels make_host_kernels() {
  RingKernels k;
  k.device = Device::host();
  k.forward = [](const Tensor& q, const Tensor& kb, const Tensor& vb, const Tensor& doc, const AttentionArgs& a,
                 const AttentionCoords& c) { return flash_attention(q, kb, vb, doc, a, c); };
  k.backward = [](const Tensor& q, const Tensor& kb, const Tensor& vb, const Tensor& doc, const Tensor& out,
                  const Tensor& lse, const Tensor& dout, const AttentionArgs& a, const AttentionCoords& c) {
    return flash_attention_backward(q, kb, vb, doc, out, lse, dout, a, c);
  };
  k.merge = merge_block;
  k.add = add_block;
  k.cast = [](const Tensor& t, DType d) { return t.to(d); };
  k.full = [](DType d, const Shape& s, double v) { return Tensor::full(d, s, v); };
  return k;
}

}  // namespace

void add_block(Tensor& acc, const Tensor& x) {
  SW_CHECK(acc.dtype() == x.dtype() && acc.numel() == x.numel(), "ring attention: a sum {} {} += {} {}",
           dtype_name(acc.dtype()), acc.shape().to_string(), dtype_name(x.dtype()), x.shape().to_string());
  if (acc.dtype() == DType::F64) return add_typed<double>(acc, x);
  add_typed<float>(acc, x);
}

void merge_block(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t D = out.shape()[out.shape().ndim() - 1];
  if (out.dtype() == DType::F64) {
    return merge<double>(out.data<double>(), lse.data<double>(), out_b.data<double>(), lse_b.data<double>(), lse.numel(), D);
  }
  merge<float>(out.data<float>(), lse.data<float>(), out_b.data<float>(), lse_b.data<float>(), lse.numel(), D);
}

const RingKernels& host_ring_kernels() {
  static const RingKernels k = make_host_kernels();
  return k;
}

AttentionOutputs ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                const AttentionArgs& args, const AttentionCoords& coords, comm::Communicator* ring,
                                const RingKernels& kernels) {
  if (ring == nullptr || ring->size() == 1) return kernels.forward(q, k, v, doc, args, coords);
  const int n = ring->size(), r = ring->rank();
  const int64_t rows = q.shape()[q.shape().ndim() - 2];
  const Blocks blocks = gather_blocks(*ring, coords.query0, rows);
  SW_CHECK(k.shape()[k.shape().ndim() - 2] == rows,
           "ring_attention: the local k holds {} rows of the sequence, q {}: they must be sharded alike",
           k.shape()[k.shape().ndim() - 2], rows);
  Tensor out = kernels.full(attention_lse_dtype(q.dtype()), q.shape(), 0.0);
  Tensor lse = kernels.full(attention_lse_dtype(q.dtype()), attention_lse_shape(q.shape()),
                            -std::numeric_limits<double>::infinity());
  Tensor kb = k, vb = v;
  for (int t = 0; t < n; ++t) {
    const int owner = (r + n - t) % n;
    // The next step's block travels while this one is computed.
    std::optional<Transfer> next_k, next_v;
    if (t + 1 < n) {
      const int64_t next_rows = blocks.size[static_cast<size_t>((owner + n - 1) % n)];
      next_k.emplace(*ring, kb, next_rows, kKeys, kernels.device);
      next_v.emplace(*ring, vb, next_rows, kValues, kernels.device);
    }
    if (rows > 0 && blocks.size[static_cast<size_t>(owner)] > 0) {
      AttentionCoords at = coords;
      at.key0 = blocks.offset[static_cast<size_t>(owner)];
      const AttentionOutputs o = kernels.forward(q, kb, vb, doc, args, at);
      kernels.merge(out, lse, kernels.cast(o.out, out.dtype()), o.lse);
    }
    if (t + 1 == n) break;
    kb = next_k->finish();
    vb = next_v->finish();
  }
  return AttentionOutputs{kernels.cast(out, q.dtype()), lse};
}

AttentionGrads ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       const AttentionArgs& args, const AttentionCoords& coords,
                                       comm::Communicator* ring, const RingKernels& kernels) {
  if (ring == nullptr || ring->size() == 1) return kernels.backward(q, k, v, doc, out, lse, dout, args, coords);
  const int n = ring->size(), r = ring->rank();
  const int64_t rows = q.shape()[q.shape().ndim() - 2];
  const Blocks blocks = gather_blocks(*ring, coords.query0, rows);
  const DType c = attention_lse_dtype(q.dtype());
  Tensor dq = kernels.full(c, q.shape(), 0.0);
  Tensor kb = k, vb = v, dkb = kernels.full(c, k.shape(), 0.0), dvb = kernels.full(c, v.shape(), 0.0);
  std::optional<Transfer> grad_k, grad_v;  // the travelling block's gradient, passed at the step before
  for (int t = 0; t < n; ++t) {
    const int owner = (r + n - t) % n;
    const int64_t next_rows = blocks.size[static_cast<size_t>((owner + n - 1) % n)];
    // The next step's k and v travel while this step computes; the previous step's gradients
    // arrive meanwhile too and are added to once this step's share is computed.
    std::optional<Transfer> next_k, next_v;
    if (t + 1 < n) {
      next_k.emplace(*ring, kb, next_rows, kKeys, kernels.device);
      next_v.emplace(*ring, vb, next_rows, kValues, kernels.device);
    }
    std::optional<AttentionGrads> g;
    if (rows > 0 && blocks.size[static_cast<size_t>(owner)] > 0) {
      AttentionCoords at = coords;
      at.key0 = blocks.offset[static_cast<size_t>(owner)];
      g = kernels.backward(q, kb, vb, doc, out, lse, dout, args, at);
    }
    if (grad_k) dkb = grad_k->finish(), dvb = grad_v->finish();
    if (g) {
      kernels.add(dq, kernels.cast(g->dq, c));
      kernels.add(dkb, kernels.cast(g->dk, c));
      kernels.add(dvb, kernels.cast(g->dv, c));
    }
    // The block's gradient so far goes on with it to the next rank; after the last step only the
    // gradient travels, home to its owner.
    grad_k.emplace(*ring, dkb, next_rows, kKeyGrads, kernels.device);
    grad_v.emplace(*ring, dvb, next_rows, kValueGrads, kernels.device);
    if (t + 1 < n) kb = next_k->finish(), vb = next_v->finish();
  }
  dkb = grad_k->finish();
  dvb = grad_v->finish();
  return AttentionGrads{kernels.cast(dq, q.dtype()), kernels.cast(dkb, k.dtype()), kernels.cast(dvb, v.dtype())};
}

}  // namespace shardwise::ops
