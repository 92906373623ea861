#include "shardwise/train/grad_buckets.h"


#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/train/device_ranges.h"

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

// Copies `n` floats of `src` from element `from` into `dst` at element `to` (device_ranges.h).
void copy_floats(Tensor& dst, int64_t to, const Tensor& src, int64_t from, int64_t n) {
  const auto f = sizeof(float);
  copy_bytes(dst, static_cast<size_t>(to) * f, src, static_cast<size_t>(from) * f, static_cast<size_t>(n) * f);
}

}  // namespace

// Packs the sums into one buffer (by device copies on the caller's stream, the backward's compute
// stream, for sums on a device) and starts the group's collective on it (on device memory there).
void GradBuckets::start(Bucket& b) {
  comm::Communicator& group = *g_.comms[b.group];
  const Device d = b.sums.front().device();
  int64_t total = 0;
  for (const Tensor& s : b.sums) {
    SW_CHECK(s.device() == d, "gradient buckets: sums on {} and {}", d.to_string(), s.device().to_string());
    total += s.numel();
  }
  b.buffer = uninitialized_like(b.sums.front(), DType::F32, Shape{total});
  hold(static_cast<int64_t>(b.buffer.nbytes()));
  int64_t at = 0;
  // All-reduce: the sums one after another. Reduce-scatter: rank r's block is its range of each
  // parameter, in bucket order.
  std::vector<int64_t> counts(static_cast<size_t>(group.size()), 0);
  for (size_t r = 0; r < (plan_ ? counts.size() : 1); ++r) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      int64_t begin = 0, n = b.sums[k].numel();
      if (plan_) {
        const std::vector<int64_t>& c = plan_->counts[b.params[k]];
        for (size_t q = 0; q < r; ++q) begin += c[q];
        n = c[r];
        counts[r] += n;
      }
      copy_floats(b.buffer, at, b.sums[k], begin, n);
      at += n;
    }
  }
  b.sums.clear();  // the full sums go once packed
  hold(-b.bytes);
  const BuffersOf on_device(b.buffer);
  void* buffer = buffer_of(b.buffer);
  if (!plan_) {
    b.request = group.start_all_reduce(buffer, buffer, total, DType::F32, comm::Reduce::Sum);
    return;
  }
  b.out = uninitialized_like(b.buffer, DType::F32, Shape{counts[static_cast<size_t>(group.rank())]});
  hold(static_cast<int64_t>(b.out.nbytes()));
  b.request = group.start_reduce_scatter_v(buffer, buffer_of(b.out), counts, DType::F32, comm::Reduce::Sum);
}

void GradBuckets::wait_oldest() {
  SW_CHECK(started_ > 0, "internal: gradient buckets: none in flight");
  std::unique_ptr<Bucket> b = std::move(closed_.front());
  closed_.pop_front();
  --started_;
  b->request->wait();
  // Each parameter's reduced sum (or range) copied out of the bucket, on the device for device sums.
  const Tensor& reduced = plan_ ? b->out : b->buffer;
  int64_t at = 0;
  for (size_t k = 0; k < b->params.size(); ++k) {
    const size_t p = b->params[k];
    results_[p] = uninitialized_like(reduced, DType::F32, plan_ ? Shape{plan_->count(p)} : b->shapes[k]);
    copy_floats(results_[p], 0, reduced, at, results_[p].numel());
    at += results_[p].numel();
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
