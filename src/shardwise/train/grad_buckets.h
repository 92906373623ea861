#pragma once
// Gradient buckets: the data-parallel reduction of the parameter gradients, started while the
// backward still runs (`--overlap-grad-reduce on`, TrainConfig::overlap_grad_reduce).
//
// The graph leaves the gradients Partial(sum) over dp (pipeline::StageSpec::partial_grad_dims),
// the runner sums them over the micro-batches, and StagedGpt hands each parameter's sum on as soon
// as the step's last micro-batch computed it (StagedGpt::set_grad_ready): in the order the backward
// completes them, the reverse of their use in the forward. Each sum joins the open bucket of its
// parameter's data group (sharding.h DataGroups: dense parameters dp x ep, experts dp; one bucket
// open per group); a bucket of at least `bucket_bytes` is closed and its reduction started over its
// group (Communicator::start_*):
//   - all-reduce (sharding stage 0 and 1): the bucket's sums packed back to back, reduced in place;
//   - reduce-scatter (stage 2, a ShardPlan): the sums packed rank by rank (rank r's block holds
//     r's ranges of the bucket's parameters, in bucket order), each rank receiving its ranges.
// Packing copies the sums, which go at once; the packed buffer goes when the reduction is waited
// for. At most `max_in_flight` buckets are in flight: closing another first waits for the oldest
// (this bounds the gradient bytes held during the backward; the local backend makes its calls
// there). finish() adds the sums handed over after the backward (a tied embedding exchanged
// between pipeline ranks), closes the last bucket and waits for every bucket in start order.
//
// Every rank of a data group holds the same blocks and runs the same programs and schedule, so it
// sees the same hand-over sequence, forms the same buckets and starts the same collectives in the
// same order. Sums on a device are packed and unpacked by device copies on the caller's stream and
// reduced by the collectives on device memory (comm/device_buffers.h), both kinds. With `overlap` false the same buckets are started in finish(), after the backward:
// the same collectives on the same buffers, so the same bits (the overlap's reference).
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/train/sharding.h"

namespace shardwise::train {

// Error naming the option: `mode` on, after or off; `bucket_mb` positive.
void check_bucket_options(const std::string& mode, double bucket_mb);

struct BucketOptions {
  int64_t bucket_bytes = 25ll << 20;  // --grad-bucket-mb
  bool overlap = true;                // start buckets as they fill (else in finish())
  int max_in_flight = 2;
};

class GradBuckets {
 public:
  // `groups`: each parameter's data group (the ranks holding the same block); `plan`: reduce-scatter
  // into its ranges (stage 2), else null: all-reduce.
  GradBuckets(DataGroups groups, const ShardPlan* plan, BucketOptions options);
  ~GradBuckets();

  // Takes parameter p's f32 sum over the micro-batches (Partial over dp): `sum` is left undefined.
  void ready(size_t p, Tensor& sum);
  // Ends the step. `grads`: per parameter, the sums not handed over (undefined where they were);
  // `reduce`: the parameters to reduce (Partial over dp). All-reduce: each grads[p] to reduce
  // becomes its reduced sum (the block's shape); returns nothing. Reduce-scatter: returns every
  // parameter's range (reduced, or copied where not to reduce) and empties `grads`.
  std::vector<Tensor> finish(std::vector<Tensor>& grads, const std::vector<bool>& reduce);

  // The last finished step's buckets (the parameters of each, in hand-over order).
  const std::vector<std::vector<size_t>>& last_buckets() const { return last_buckets_; }
  // Of them, how many were started before finish() (while the backward ran).
  int64_t last_started_early() const { return last_early_; }
  // The most bytes held at once during the last finished step: the sums handed over and not yet
  // packed, the packed buffers and received ranges of the buckets in flight, the results so far.
  int64_t last_peak_bytes() const { return last_peak_; }

 private:
  struct Bucket;
  void close(size_t group);  // starts the group's open bucket's reduction
  void start(Bucket& b);    // packs and starts
  void wait_oldest();       // waits for the oldest bucket in flight and unpacks it
  DataGroups g_;
  const ShardPlan* plan_;
  BucketOptions o_;
  std::vector<std::unique_ptr<Bucket>> open_;  // per group
  std::deque<std::unique_ptr<Bucket>> closed_;  // closed, in close order (started, or waiting for finish())
  size_t started_ = 0;                          // of closed_, the first `started_` are in flight
  std::vector<Tensor> results_;                 // per parameter: the reduced sum or this rank's range
  std::vector<std::vector<size_t>> buckets_, last_buckets_;
  int64_t early_ = 0, last_early_ = 0;
  int64_t held_ = 0, peak_ = 0, last_peak_ = 0;  // bytes (last_peak_bytes)
  void hold(int64_t bytes);                      // held_ += bytes, the peak follows
};

}  // namespace shardwise::train
