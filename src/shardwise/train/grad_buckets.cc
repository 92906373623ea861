#include "shardwise/train/grad_buckets.h"

#include <cstring>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::train {

void check_bucket_options(const std::string& mode, double bucket_mb) {
  SW_CHECK(mode == "on" || mode == "off" || mode == "after",
           "--overlap-grad-reduce must be on (reduce gradient buckets during the backward), after (the same buckets "
           "after it) or off, got '{}'",
           mode);
  SW_CHECK(bucket_mb > 0 && bucket_mb * (1 << 20) < 9.0e18, "--grad-bucket-mb must be a positive size in MiB, got {}",
           bucket_mb);
}

struct GradBuckets::Bucket {
  size_t group = 0;
  std::vector<size_t> params;
  std::vector<Shape> shapes;
  std::vector<Tensor> sums;  // until packed
  int64_t bytes = 0;
  Tensor buffer, out;  // the packed sums (all-reduce: reduced in place); reduce-scatter: this rank's ranges
  std::unique_ptr<comm::Request> request;
};

GradBuckets::GradBuckets(DataGroups groups, const ShardPlan* plan, BucketOptions options)
    : g_(std::move(groups)), plan_(plan), o_(options), open_(g_.comms.size()), results_(g_.of.size()) {
  const size_t params = g_.of.size();
  SW_CHECK(o_.bucket_bytes > 0, "--grad-bucket-mb must be positive, got {} bytes", o_.bucket_bytes);
  SW_CHECK(o_.max_in_flight >= 1, "gradient buckets: at least one in flight, got {}", o_.max_in_flight);
  SW_CHECK(!plan_ || plan_->counts.size() == params, "gradient buckets: a plan of {} parameters for {}",
           plan_ ? plan_->counts.size() : 0, params);
}

GradBuckets::~GradBuckets() = default;

void GradBuckets::ready(size_t p, Tensor& sum) {
  SW_CHECK(p < results_.size() && sum.defined() && sum.dtype() == DType::F32,
           "gradient buckets: parameter {} of {} handed over without an f32 sum", p, results_.size());
  const auto g = static_cast<size_t>(g_.of[p]);
  std::unique_ptr<Bucket>& open = open_[g];
  if (!open) open = std::make_unique<Bucket>(), open->group = g;
  open->params.push_back(p);
  open->shapes.push_back(sum.shape());
  open->bytes += static_cast<int64_t>(sum.nbytes());
  hold(static_cast<int64_t>(sum.nbytes()));
  open->sums.push_back(std::move(sum));
  sum = Tensor();
  if (open->bytes >= o_.bucket_bytes) close(g);
}

void GradBuckets::hold(int64_t bytes) {
  held_ += bytes;
  peak_ = std::max(peak_, held_);
}

void GradBuckets::close(size_t group) {
  std::unique_ptr<Bucket>& open = open_[group];
  if (!open || open->params.empty()) return;
  buckets_.push_back(open->params);
  closed_.push_back(std::move(open));
  if (!o_.overlap) return;
  while (started_ >= static_cast<size_t>(o_.max_in_flight)) wait_oldest();
  start(*closed_[started_]);
  ++started_;
  ++early_;
}

namespace {

// Copies `bytes` between device tensors' memory at byte offsets, on the thread's current stream.
void copy_bytes(const Tensor& dst, size_t dst_at, const Tensor& src, size_t src_at, size_t bytes) {
  if (bytes == 0) return;
  device_memory(dst.device()).copy_on_device(static_cast<std::byte*>(const_cast<void*>(dst.device_ptr())) + dst_at,
                                             static_cast<const std::byte*>(src.device_ptr()) + src_at, bytes,
                                             current_stream());
}

}  // namespace

// Sums on a device (all-reduce buckets): packed by device copies on the caller's stream (the
// backward's compute stream), reduced by the group's collective on device memory.
void GradBuckets::start_on_device(Bucket& b, int64_t total) {
  const Device d = b.sums.front().device();
  b.buffer = empty_on(DType::F32, Shape{total}, d, current_stream());
  hold(static_cast<int64_t>(b.buffer.nbytes()));
  size_t at = 0;
  for (const Tensor& s : b.sums) {
    SW_CHECK(s.device() == d, "gradient buckets: sums on {} and {}", d.to_string(), s.device().to_string());
    copy_bytes(b.buffer, at, s, 0, s.nbytes());
    at += s.nbytes();
  }
  b.sums.clear();
  hold(-b.bytes);
  const comm::DeviceBuffers on_device(d, current_stream());
  void* buffer = b.buffer.device_ptr();
  b.request = g_.comms[b.group]->start_all_reduce(buffer, buffer, total, DType::F32, comm::Reduce::Sum);
}

void GradBuckets::start(Bucket& b) {
  comm::Communicator& group = *g_.comms[b.group];
  int64_t total = 0;
  for (const Tensor& s : b.sums) total += s.numel();
  if (b.sums.front().on_device()) {
    SW_CHECK(!plan_, "gradient buckets: reduce-scatter buckets (sharding stage 2) on {} are not built yet",
             b.sums.front().device().to_string());
    return start_on_device(b, total);
  }
  b.buffer = Tensor::uninitialized(DType::F32, Shape{total});
  hold(static_cast<int64_t>(b.buffer.nbytes()));
  float* dst = b.buffer.data<float>();
  if (!plan_) {
    for (const Tensor& s : b.sums) {
      std::memcpy(dst, s.data<float>(), s.nbytes());
      dst += s.numel();
    }
    b.sums.clear();  // the full sums go once packed
    hold(-b.bytes);
    b.request = group.start_all_reduce(b.buffer.raw(), b.buffer.raw(), total, DType::F32, comm::Reduce::Sum);
    return;
  }
  // Rank r's block: its range of each parameter, in bucket order.
  std::vector<int64_t> counts(static_cast<size_t>(group.size()), 0);
  for (size_t r = 0; r < counts.size(); ++r) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      const std::vector<int64_t>& c = plan_->counts[b.params[k]];
      int64_t begin = 0;
      for (size_t q = 0; q < r; ++q) begin += c[q];
      std::memcpy(dst, b.sums[k].data<float>() + begin, static_cast<size_t>(c[r]) * sizeof(float));
      dst += c[r];
      counts[r] += c[r];
    }
  }
  b.sums.clear();
  hold(-b.bytes);
  b.out = Tensor::uninitialized(DType::F32, Shape{counts[static_cast<size_t>(group.rank())]});
  hold(static_cast<int64_t>(b.out.nbytes()));
  b.request = group.start_reduce_scatter_v(b.buffer.raw(), b.out.raw(), counts, DType::F32, comm::Reduce::Sum);
}

void GradBuckets::wait_oldest() {
  SW_CHECK(started_ > 0, "internal: gradient buckets: none in flight");
  std::unique_ptr<Bucket> b = std::move(closed_.front());
  closed_.pop_front();
  --started_;
  b->request->wait();
  if (b->buffer.on_device()) {  // each parameter's reduced sum copied out of the bucket on the device
    size_t at = 0;
    for (size_t k = 0; k < b->params.size(); ++k) {
      Tensor& r = results_[b->params[k]];
      r = empty_on(DType::F32, b->shapes[k], b->buffer.device(), current_stream());
      copy_bytes(r, 0, b->buffer, at, r.nbytes());
      at += r.nbytes();
      hold(static_cast<int64_t>(r.nbytes()));
    }
    hold(-static_cast<int64_t>(b->buffer.nbytes()));
    return;
  }
  const float* src = (plan_ ? b->out : b->buffer).data<float>();
  for (size_t k = 0; k < b->params.size(); ++k) {
    const size_t p = b->params[k];
    const Shape shape = plan_ ? Shape{plan_->count(p)} : b->shapes[k];
    results_[p] = Tensor::uninitialized(DType::F32, shape);
    std::memcpy(results_[p].raw(), src, results_[p].nbytes());
    src += results_[p].numel();
    hold(static_cast<int64_t>(results_[p].nbytes()));
  }
  hold(-static_cast<int64_t>(b->buffer.nbytes() + (b->out.defined() ? b->out.nbytes() : 0)));
}

std::vector<Tensor> GradBuckets::finish(std::vector<Tensor>& grads, const std::vector<bool>& reduce) {
  SW_CHECK(grads.size() == results_.size() && reduce.size() == results_.size(),
           "gradient buckets: {} gradients and {} flags for {} parameters", grads.size(), reduce.size(),
           results_.size());
  last_early_ = early_;  // the buckets the backward started, before the late sums join
  for (size_t p = 0; p < grads.size(); ++p)
    if (reduce[p] && grads[p].defined()) ready(p, grads[p]);
  for (size_t g = 0; g < open_.size(); ++g) close(g);  // the groups' last buckets, in group order
  while (!closed_.empty()) {  // what is not started yet (overlap off: everything), at most max_in_flight at a time
    if (started_ < closed_.size() && started_ < static_cast<size_t>(o_.max_in_flight)) {
      start(*closed_[started_]);
      ++started_;
    } else {
      wait_oldest();
    }
  }
  last_buckets_ = std::move(buckets_);
  buckets_.clear();
  std::vector<Tensor> out;
  for (size_t p = 0; p < grads.size(); ++p) {
    SW_CHECK(!reduce[p] || results_[p].defined(), "gradient buckets: parameter {}'s gradient was never handed over", p);
  }
  if (!plan_) {
    for (size_t p = 0; p < grads.size(); ++p)
      if (reduce[p]) grads[p] = std::move(results_[p]);
  } else {
    out.resize(grads.size());
    for (size_t p = 0; p < grads.size(); ++p)
      out[p] = reduce[p] ? std::move(results_[p]) : flat_range(grads[p], plan_->begin(p), plan_->count(p));
    grads.clear();
  }
  results_.assign(results_.size(), Tensor());
  early_ = 0;
  last_peak_ = peak_;
  held_ = peak_ = 0;
  return out;
}

}  // namespace shardwise::train
