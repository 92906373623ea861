#include "shardwise/ops/fake_device_kernels.h"

#include <algorithm>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/attention/ring.h"
#include "shardwise/ops/fake_device_moe.h"
#include "shardwise/ops/fake_host_window.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::ops {

namespace {

// Runs the op's own (CPU) dispatch on host views; run_forward does not come back here (no view is on a device).
std::vector<Tensor> fake_forward(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                                 const KernelContext* context) {
  HostWindow w(first_on_device(inputs)->device());
  w.note_launch();
  std::vector<Tensor> in = w.views(inputs);
  return w.to_device(run_forward(op, in, attrs, context));
}

std::vector<Tensor> fake_backward(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                  std::span<const Tensor> out_grads, const Attrs& attrs, const KernelContext* context,
                                  std::span<const bool> wanted) {
  const Tensor* d = first_on_device(inputs);
  if (!d) d = first_on_device(outputs);
  if (!d) d = first_on_device(out_grads);
  HostWindow w(d->device());
  w.note_launch();
  std::vector<Tensor> in = w.views(inputs), out = w.views(outputs), dout = w.views(out_grads);
  return w.to_device(run_backward(op, in, out, dout, attrs, context, wanted));
}

Tensor fake_fill(DType dtype, const Shape& shape, double value, Device device) {
  if (value == 0.0) return zeros_on(dtype, shape, device, current_stream());
  HostWindow w(device);
  return w.to_device(Tensor::full(dtype, shape, value));
}

// The optimizer's CPU kernels (train_kernels.h) on host views of the fake device's memory: the
// CPU's bits, in place.
void fake_adamw(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWHyper& h,
                Tensor* bf16_param) {
  HostWindow w(master.device());
  w.note_launch();
  Tensor wv = w.view(master, true), m = w.view(exp_avg, true), v = w.view(exp_avg_sq, true), g = w.view(grad, false);
  adamw_update(wv.data<float>(), m.data<float>(), v.data<float>(), g.data<float>(), wv.numel(), h);
  if (bf16_param) {
    Tensor p = w.view(*bf16_param, true);
    const Tensor rounded = wv.to(p.dtype());
    std::copy_n(rounded.raw(), rounded.nbytes(), p.raw());
  }
}

Tensor fake_squares(std::span<const Tensor> grads) {
  HostWindow w(grads[0].device());
  w.note_launch();
  std::vector<double> sums;
  for (const Tensor& g : grads) {
    Tensor v = w.view(g, false);
    sums.push_back(sum_of_squares(v.data<float>(), v.numel()));
  }
  return w.to_device(Tensor::from<double>(Shape{static_cast<int64_t>(sums.size())}, sums));
}

void fake_scale(Tensor& t, float s) {
  HostWindow w(t.device());
  w.note_launch();
  Tensor v = w.view(t, true);
  scale_in_place(v.data<float>(), v.numel(), s);
}

// As pipeline::accumulate_grad: an f32 copy of the first, then f32 sums in index order.
void fake_accumulate(Tensor& sum, const Tensor& g) {
  HostWindow w(g.device());
  w.note_launch();
  const Tensor add = g.dtype() == DType::F32 ? w.view(g, false) : w.view(g, false).to(DType::F32);
  if (!sum.defined()) {  // a copy in fresh device memory (a view would alias g)
    sum = w.to_device(g.dtype() == DType::F32 ? add.clone() : add);
    return;
  }
  Tensor acc = w.view(sum, true);
  SW_CHECK(acc.dtype() == DType::F32 && acc.numel() == add.numel(), "gradient sum: {} {} += {} {}",
           dtype_name(acc.dtype()), acc.shape().to_string(), dtype_name(g.dtype()), g.shape().to_string());
  float* a = acc.data<float>();
  const float* in = add.data<float>();
  for (int64_t j = 0; j < add.numel(); ++j) a[j] += in[j];
}

// Ring attention's pieces (ops/attention/ring.h) on the fake device: each a launch of the CPU
// piece on host views of the fake device's memory (the CPU's bits), the blocks passed between the
// ranks as device buffers by the ring itself.
RingKernels fake_ring_kernels(Device device) {
  RingKernels k;
  k.device = device;
  k.forward = [](const Tensor& q, const Tensor& kb, const Tensor& vb, const Tensor& doc, const AttentionArgs& a,
                 const AttentionCoords& c) {
    HostWindow w(q.device());
    w.note_launch();
    const std::vector<Tensor> in = w.views(std::vector<Tensor>{q, kb, vb, doc});
    const AttentionOutputs o = flash_attention(in[0], in[1], in[2], in[3], a, c);
    return AttentionOutputs{w.to_device(o.out), w.to_device(o.lse)};
  };
  k.backward = [](const Tensor& q, const Tensor& kb, const Tensor& vb, const Tensor& doc, const Tensor& out,
                  const Tensor& lse, const Tensor& dout, const AttentionArgs& a, const AttentionCoords& c) {
    HostWindow w(q.device());
    w.note_launch();
    const std::vector<Tensor> in = w.views(std::vector<Tensor>{q, kb, vb, doc, out, lse, dout});
    const AttentionGrads g = flash_attention_backward(in[0], in[1], in[2], in[3], in[4], in[5], in[6], a, c);
    return AttentionGrads{w.to_device(g.dq), w.to_device(g.dk), w.to_device(g.dv)};
  };
  k.merge = [](Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
    HostWindow w(out.device());
    w.note_launch();
    Tensor o = w.view(out, true), l = w.view(lse, true);
    merge_block(o, l, w.view(out_b, false), w.view(lse_b, false));
  };
  k.add = [](Tensor& acc, const Tensor& x) {
    HostWindow w(acc.device());
    w.note_launch();
    Tensor a = w.view(acc, true);
    add_block(a, w.view(x, false));
  };
  k.cast = [](const Tensor& t, DType dtype) {
    HostWindow w(t.device());
    w.note_launch();
    return w.to_device(w.view(t, false).to(dtype));
  };
  k.full = [device](DType dtype, const Shape& shape, double value) { return fake_fill(dtype, shape, value, device); };
  return k;
}

void add_fake_ring(DeviceKernelTable& table, const char* name, bool docs) {
  table.add_forward(name, [docs](const OpDef&, std::span<const Tensor> in, const Attrs& attrs,
                                 const KernelContext* ctx) {
    const RingPlace at = ring_place(in, ctx);
    const AttentionOutputs r = ring_attention(in[0], in[1], in[2], docs ? in[3] : Tensor(), attention_args(attrs),
                                              at.coords, at.ring, fake_ring_kernels(in[0].device()));
    return std::vector<Tensor>{r.out, r.lse};
  });
  table.add_backward(name, [docs](const OpDef&, std::span<const Tensor> in, std::span<const Tensor> out,
                                  std::span<const Tensor> dout, const Attrs& attrs, const KernelContext* ctx,
                                  std::span<const bool>) {
    const RingPlace at = ring_place(in, ctx);
    const AttentionGrads g = ring_attention_backward(in[0], in[1], in[2], docs ? in[3] : Tensor(), out[0], out[1],
                                                     dout[0], attention_args(attrs), at.coords, at.ring,
                                                     fake_ring_kernels(in[0].device()));
    std::vector<Tensor> r{g.dq, g.dk, g.dv};
    if (docs) r.emplace_back();
    return r;
  });
}

}  // namespace

std::shared_ptr<const DeviceKernelTable> fake_device_kernels() {
  auto table = std::make_shared<DeviceKernelTable>("fake");
  table->set_fallback(fake_forward, fake_backward);
  bind_fake_moe(*table);
  table->set_fill(fake_fill);
  table->set_train_kernels({fake_adamw, fake_squares, fake_scale, fake_accumulate});
  add_fake_ring(*table, "ring_attention", false);
  add_fake_ring(*table, "ring_attention_docs", true);
  return table;
}

}  // namespace shardwise::ops
