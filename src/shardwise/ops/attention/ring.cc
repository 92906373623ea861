#include "shardwise/ops/attention/ring.h"

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "shardwise/core/error.h"

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
class Transfer {
 public:
  Transfer(comm::Communicator& ring, const Tensor& send, int64_t rows, int tag)
      : sent_(send), got_(Tensor::uninitialized(send.dtype(), with_rows(send.shape(), rows))) {
    const int n = ring.size(), r = ring.rank();
    auto start_send = [&] {
      if (sent_.numel() > 0) requests_.push_back(ring.start_send(sent_.raw(), sent_.numel(), sent_.dtype(), (r + 1) % n, tag));
    };
    auto start_recv = [&] {
      if (got_.numel() > 0) requests_.push_back(ring.start_recv(got_.raw(), got_.numel(), got_.dtype(), (r + n - 1) % n, tag));
    };
    if (r % 2 == 0) start_send(), start_recv();
    else start_recv(), start_send();
  }
  // The previous rank's block (`rows` rows).
  Tensor finish() {
    for (auto& request : requests_) request->wait();
    requests_.clear();
    sent_ = Tensor();
    return got_;
  }

 private:
  Tensor sent_, got_;  // alive until the transfer is done
  std::vector<std::unique_ptr<comm::Request>> requests_;
};
enum Tag : int { kKeys = 1, kValues = 2, kKeyGrads = 3, kValueGrads = 4 };

// The compute type's copy of t (f64 for f64, else f32).
Tensor compute(const Tensor& t) {
  const DType c = attention_lse_dtype(t.dtype());
  return t.to(c);
}

// acc += x (both of the compute type, f32 or f64, one shape).
template <class C>
void add_typed(Tensor& acc, const Tensor& x) {
  C* a = acc.data<C>();
  const C* b = x.data<C>();
  for (int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
}
void add_into(Tensor& acc, const Tensor& x) {
  if (acc.dtype() == DType::F64) return add_typed<double>(acc, x);
  add_typed<float>(acc, x);
}

// Merges a block's (out_b, lse_b) into the running (out, lse): lse' = logaddexp(lse, lse_b),
// out' = exp(lse - lse') out + exp(lse_b - lse') out_b; a row without visible keys has lse -inf.
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

}  // namespace

AttentionOutputs ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                const AttentionArgs& args, const AttentionCoords& coords, comm::Communicator* ring) {
  if (ring == nullptr || ring->size() == 1) return flash_attention(q, k, v, doc, args, coords);
  const int n = ring->size(), r = ring->rank();
  const int64_t rows = q.shape()[q.shape().ndim() - 2], D = q.shape()[q.shape().ndim() - 1];
  const Blocks blocks = gather_blocks(*ring, coords.query0, rows);
  SW_CHECK(k.shape()[k.shape().ndim() - 2] == rows,
           "ring_attention: the local k holds {} rows of the sequence, q {}: they must be sharded alike",
           k.shape()[k.shape().ndim() - 2], rows);
  Tensor out = Tensor::full(attention_lse_dtype(q.dtype()), q.shape(), 0.0);
  Tensor lse = Tensor::full(attention_lse_dtype(q.dtype()), attention_lse_shape(q.shape()),
                            -std::numeric_limits<double>::infinity());
  Tensor kb = k, vb = v;
  for (int t = 0; t < n; ++t) {
    const int owner = (r + n - t) % n;
    // The next step's block travels while this one is computed.
    std::optional<Transfer> next_k, next_v;
    if (t + 1 < n) {
      const int64_t next_rows = blocks.size[static_cast<size_t>((owner + n - 1) % n)];
      next_k.emplace(*ring, kb, next_rows, kKeys);
      next_v.emplace(*ring, vb, next_rows, kValues);
    }
    if (rows > 0 && blocks.size[static_cast<size_t>(owner)] > 0) {
      AttentionCoords at = coords;
      at.key0 = blocks.offset[static_cast<size_t>(owner)];
      const AttentionOutputs o = flash_attention(q, kb, vb, doc, args, at);
      const Tensor ob = compute(o.out);
      if (out.dtype() == DType::F64) {
        merge<double>(out.data<double>(), lse.data<double>(), ob.data<double>(), o.lse.data<double>(), lse.numel(), D);
      } else {
        merge<float>(out.data<float>(), lse.data<float>(), ob.data<float>(), o.lse.data<float>(), lse.numel(), D);
      }
    }
    if (t + 1 == n) break;
    kb = next_k->finish();
    vb = next_v->finish();
  }
  return AttentionOutputs{out.to(q.dtype()), lse};
}

AttentionGrads ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       const AttentionArgs& args, const AttentionCoords& coords,
                                       comm::Communicator* ring) {
  if (ring == nullptr || ring->size() == 1) return flash_attention_backward(q, k, v, doc, out, lse, dout, args, coords);
  const int n = ring->size(), r = ring->rank();
  const int64_t rows = q.shape()[q.shape().ndim() - 2];
  const Blocks blocks = gather_blocks(*ring, coords.query0, rows);
  const DType c = attention_lse_dtype(q.dtype());
  Tensor dq = Tensor::full(c, q.shape(), 0.0);
  Tensor kb = k, vb = v, dkb = Tensor::full(c, k.shape(), 0.0), dvb = Tensor::full(c, v.shape(), 0.0);
  std::optional<Transfer> grad_k, grad_v;  // the travelling block's gradient, passed at the step before
  for (int t = 0; t < n; ++t) {
    const int owner = (r + n - t) % n;
    const int64_t next_rows = blocks.size[static_cast<size_t>((owner + n - 1) % n)];
    // The next step's k and v travel while this step computes; the previous step's gradients
    // arrive meanwhile too and are added to once this step's share is computed.
    std::optional<Transfer> next_k, next_v;
    if (t + 1 < n) {
      next_k.emplace(*ring, kb, next_rows, kKeys);
      next_v.emplace(*ring, vb, next_rows, kValues);
    }
    std::optional<AttentionGrads> g;
    if (rows > 0 && blocks.size[static_cast<size_t>(owner)] > 0) {
      AttentionCoords at = coords;
      at.key0 = blocks.offset[static_cast<size_t>(owner)];
      g = flash_attention_backward(q, kb, vb, doc, out, lse, dout, args, at);
    }
    if (grad_k) dkb = grad_k->finish(), dvb = grad_v->finish();
    if (g) {
      add_into(dq, compute(g->dq));
      add_into(dkb, compute(g->dk));
      add_into(dvb, compute(g->dv));
    }
    // The block's gradient so far goes on with it to the next rank; after the last step only the
    // gradient travels, home to its owner.
    grad_k.emplace(*ring, dkb, next_rows, kKeyGrads);
    grad_v.emplace(*ring, dvb, next_rows, kValueGrads);
    if (t + 1 < n) kb = next_k->finish(), vb = next_v->finish();
  }
  dkb = grad_k->finish();
  dvb = grad_v->finish();
  return AttentionGrads{dq.to(q.dtype()), dkb.to(k.dtype()), dvb.to(v.dtype())};
}

}  // namespace shardwise::ops
