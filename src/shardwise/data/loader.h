#pragma once
// The training step's batches, synchronized and prefetched. Sample i is still the dataset's
// `f(seed, i)`: only who reads it changes, so every rank binds the same bits as when each read the
// whole micro-batch, and resuming by consumed samples holds on any mesh.
//
// Readers. The ranks that bind a micro-batch are those of the first stage (ids) and of the last
// (labels); with packed documents (GptConfig::document_mask) every stage (its attention mask comes
// from the ids). The rows a rank binds lie in its data-parallel block of the micro-batch (ids and
// labels are S(0) on dp), sequences [d x rows, (d + 1) x rows) with rows = sequences / dp. The ranks
// that differ only in their tp and cp coordinates bind the same rows (cp ranks then cut their own
// blocks of the sequences): in each such tp x cp group the rank with tp and cp coordinates 0 is the
// reader. It alone calls Dataset::sample, for its block's rows only, and
// broadcasts what the group needs (ids and/or labels) over the group's communicator; the others
// never touch the dataset (the Trainer opens the data files on the readers only: reader() &&
// needs_data()). Ranks that need nothing (middle pipeline stages without packing) do nothing.
// Validation batches take the same path (a loader of their own, without prefetch): samples from
// `limit` on are padding, ids 0 and labels -100 (ignored by the cross-entropy).
//
// Prefetch. After handing out a step's rows, a reader starts reading the next step's (samples
// first + micro_batches x sequences on) on a background thread, which runs while the step runs.
// The broadcasts stay on the calling thread, before the step's collectives, so no two collectives
// ever run at once on one communicator. A take() for other samples (a resume, a restored position)
// drops the prefetched rows and reads what it was asked for.
//
// Test hook: SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1,3 (world ranks) makes every read on those ranks
// an Error, as does opening a data file there (data.h: DataRankScope); a run with the non-readers
// listed still trains.
#include <cstdint>
#include <climits>
#include <future>
#include <memory>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/data/data.h"
#include "shardwise/mesh/strategy.h"

namespace shardwise::train {

using mesh::Strategy;

struct LoaderOptions {
  // false: every rank that binds a micro-batch reads the whole of it itself (the earlier path,
  // kept as the reference the tests compare against).
  bool synchronized = true;
  bool prefetch = true;  // a reader reads the next step while this one runs
};

// This rank's rows [row0, row0 + rows) of one micro-batch's sequences.
struct RowBatch {
  int64_t row0 = 0;
  Tensor ids, labels;  // [rows, seq] i64; undefined where this rank needs none
};

class BatchLoader {
 public:
  // `process`: this rank's process id in strategy.mesh; `needs_ids` / `needs_labels`: what it binds
  // (the same on every rank of its tp group). Collective: creates the tp group's communicator.
  BatchLoader(const Strategy& strategy, int64_t process, std::shared_ptr<comm::Communicator> world,
              int64_t sequences, int micro_batches, int64_t seq, bool needs_ids, bool needs_labels,
              LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // This rank's rows of each micro-batch of the step on samples [first, first + micro_batches x
  // sequences) of `data` (which must outlive the loader: a prefetch may still be reading it; null
  // on a rank that reads nothing). Samples from `limit` on are padding: ids 0, labels -100.
  // Collective over the rank's tp group.
  std::vector<RowBatch> take(const Dataset* data, int64_t first, int64_t limit = INT64_MAX);
  // Seconds the last take() blocked: waiting for the read (a prefetch not finished, or a read
  // without one) and the broadcasts.
  double last_wait_s() const { return wait_s_; }
  // Of that, seconds a reader waited for its rows to be read (0 on the others): what prefetch hides.
  double last_read_wait_s() const { return read_wait_s_; }
  bool reader() const { return reader_; }
  bool needs_data() const { return needs_ids_ || needs_labels_; }

 private:
  // The tokens [rows, seq + 1] of each micro-batch of the step at `first` (the reader's rows).
  std::vector<Tensor> read(const Dataset& data, int64_t first, int64_t limit) const;

  int64_t sequences_, seq_, row0_ = 0, rows_ = 0;
  int micro_batches_;
  bool needs_ids_, needs_labels_, reader_ = false, unreadable_ = false;
  LoaderOptions options_;
  int world_rank_ = 0;
  std::shared_ptr<comm::Communicator> group_;  // the tp x cp group (null when alone in it)
  // The prefetched step: its first sample, its dataset, its rows.
  int64_t pending_first_ = -1;
  const Dataset* pending_data_ = nullptr;
  std::future<std::vector<Tensor>> pending_;
  double wait_s_ = 0, read_wait_s_ = 0;
};

}  // namespace shardwise::train
