#include "shardwise/data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "shardwise/core/error.h"

namespace shardwise::train {
namespace {

int world_index(const comm::Communicator& world, int64_t process) {
  const auto& m = world.members();
  auto it = std::find(m.begin(), m.end(), static_cast<int>(process));
  SW_CHECK(it != m.end(), "loader: process {} is not in the communicator", process);
  return static_cast<int>(it - m.begin());
}

// Columns [from, from + seq) of every row of `tokens` [rows, seq + 1].
Tensor columns(const Tensor& tokens, int64_t from, int64_t seq) {
  const int64_t offsets[2] = {0, from};
  return tokens.slice(offsets, Shape{tokens.shape()[0], seq});
}

}  // namespace

BatchLoader::BatchLoader(const Strategy& strategy, int64_t process, std::shared_ptr<comm::Communicator> world,
                         int64_t sequences, int micro_batches, int64_t seq, bool needs_ids, bool needs_labels,
                         LoaderOptions options)
    : sequences_(sequences),
      seq_(seq),
      micro_batches_(micro_batches),
      needs_ids_(needs_ids),
      needs_labels_(needs_labels),
      options_(options),
      world_rank_(world->rank()) {
  unreadable_ = data_unreadable_for_rank(world_rank_);
  rows_ = sequences_;
  if (!needs_data()) return;
  if (!options_.synchronized) {  // every rank reads the whole micro-batch
    reader_ = true;
    return;
  }
  const mesh::ProcessMesh& m = strategy.mesh;
  std::vector<int64_t> coords = m.coords(m.rank_index_of_process(process));
  const int64_t ways = strategy.data_size();  // dp x ep: each data rank its own rows
  SW_CHECK(sequences_ % ways == 0, "loader: {} sequences per micro-batch do not divide over {} data ranks (dp x ep)",
           sequences_, ways);
  rows_ = sequences_ / ways;
  row0_ = strategy.data_index(coords) * rows_;
  // The ranks that bind the same rows: the tp x cp group (cp ranks cut their own blocks of the
  // same sequences); its rank with tp and cp coordinates 0 reads.
  std::vector<int> dims;
  for (int d : {strategy.tp, strategy.cp})
    if (d >= 0 && m.dim_size(d) > 1) dims.push_back(d);
  reader_ = true;
  for (int d : dims) reader_ = reader_ && coords[static_cast<size_t>(d)] == 0;
  if (dims.empty()) return;
  std::vector<int> members;  // row-major over (tp, cp) coordinates: the reader is group rank 0
  for (int64_t p : m.processes_along(process, dims)) members.push_back(world_index(*world, p));
  group_ = world->group(members);
}

BatchLoader::~BatchLoader() {
  if (pending_.valid()) pending_.wait();  // the prefetch reads a dataset the caller owns
}

std::vector<Tensor> BatchLoader::read(const Dataset& data, int64_t first, int64_t limit) const {
  SW_CHECK(!unreadable_,
           "rank {} read the training data, which is unreadable there (test hook "
           "SHARDWISE_TEST_UNREADABLE_FOR_RANKS={}): only each tp group's reader may read",
           world_rank_, std::getenv("SHARDWISE_TEST_UNREADABLE_FOR_RANKS"));
  std::vector<Tensor> out;
  for (int mb = 0; mb < micro_batches_; ++mb) {
    Tensor tokens(DType::I64, Shape{rows_, seq_ + 1});  // zeros: padding rows stay 0
    for (int64_t r = 0; r < rows_; ++r) {
      if (first + mb * sequences_ + row0_ + r >= limit) break;
      data.sample(first + mb * sequences_ + row0_ + r,
                  std::span<int64_t>(tokens.data<int64_t>() + r * (seq_ + 1), static_cast<size_t>(seq_ + 1)));
    }
    out.push_back(std::move(tokens));
  }
  return out;
}

std::vector<RowBatch> BatchLoader::take(const Dataset* data, int64_t first, int64_t limit) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<RowBatch> out(static_cast<size_t>(micro_batches_));
  read_wait_s_ = 0;
  if (!needs_data()) {
    wait_s_ = 0;
    return out;
  }
  std::vector<Tensor> tokens;
  if (reader_) {
    SW_CHECK(data != nullptr, "loader: rank {} reads the data but has none open", world_rank_);
    if (pending_.valid()) {
      if (pending_first_ == first && pending_data_ == data && limit == INT64_MAX) {
        tokens = pending_.get();  // the prefetch's error, if any, is this step's
      } else {
        try {  // other samples were asked for (a restored position): the prefetch is not used
          pending_.get();
        } catch (const std::exception&) {
        }
      }
    }
    if (tokens.empty()) tokens = read(*data, first, limit);
    read_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options_.prefetch) {
      pending_first_ = first + micro_batches_ * sequences_;
      pending_data_ = data;
      pending_ = std::async(std::launch::async,
                            [this, data, next = pending_first_] { return read(*data, next, INT64_MAX); });
    }
  }
  for (int mb = 0; mb < micro_batches_; ++mb) {
    RowBatch& b = out[static_cast<size_t>(mb)];
    b.row0 = row0_;
    if (needs_ids_) b.ids = reader_ ? columns(tokens[static_cast<size_t>(mb)], 0, seq_) : Tensor(DType::I64, Shape{rows_, seq_});
    if (needs_labels_)
      b.labels = reader_ ? columns(tokens[static_cast<size_t>(mb)], 1, seq_) : Tensor(DType::I64, Shape{rows_, seq_});
    if (reader_ && needs_labels_) {  // padding rows: every label ignored
      const int64_t real = std::clamp<int64_t>(limit - (first + mb * sequences_ + row0_), 0, rows_);
      std::fill(b.labels.data<int64_t>() + real * seq_, b.labels.data<int64_t>() + rows_ * seq_, int64_t{-100});
    }
    if (group_) {
      if (needs_ids_) group_->broadcast(b.ids, 0);
      if (needs_labels_) group_->broadcast(b.labels, 0);
    }
  }
  wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace shardwise::train
