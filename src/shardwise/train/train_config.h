#pragma once
// What a training run is: the Trainer's configuration, in the sections of the `train` command's
// --help and of a config file's tables ([model], [parallel], [optimizer], [data]; the CLI's own
// options add [checkpoint] and [logging]: cli/commands.h TrainOptions). The defaults are `make
// demo`'s run (examples/demo.toml): a small GPT that learns 3-digit addition in about two minutes on
// 4 threads of a 2-core machine.
//
// Batches: the global batch is micro_batch x accumulation x dp sequences (micro_batch counted per
// data-parallel rank); the trainer derives whichever of the three numbers is left out (0) and
// refuses a combination that does not divide. Step k trains on samples
// [k * global_batch, (k + 1) * global_batch) of the dataset, whatever the mesh.
#include <cstdint>
#include <optional>
#include <string>

#include "shardwise/data/data.h"
#include "shardwise/models/gpt.h"
#include "shardwise/models/model_io.h"
#include "shardwise/tensor/device.h"
#include "shardwise/train/optimizer.h"
#include "shardwise/train/sharding.h"

namespace shardwise::train {

inline GptConfig demo_model() {
  GptConfig m;
  m.layers = 2, m.heads = 4, m.hidden = 128, m.seq = 0, m.vocab = 128;
  return m;
}

// [parallel]: the mesh and how the work is spread over it.
struct ParallelConfig {
  std::string mesh = "dp=2,tp=2";  // named dims dp, tp, pp, sp, ep
  // On a mesh with pp: the schedule (fthenb, 1f1b, interleaved, zbh1) over `accumulation`
  // micro-batches, virtual stages per pipeline rank, release of what backward does not need.
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  bool pipeline_release = true;
  bool sequence_parallel = false;
  // Optimizer state (stage 1), gradients (stage 2) and parameters (stage 3) sharded over each
  // parameter's data group (sharding.h).
  ShardingConfig sharding;
  // The dp reduction of the gradients in buckets (grad_buckets.h): `on` starts each bucket's
  // reduction while the backward runs; `after` reduces the same buckets after the backward (the
  // overlap's reference: the same collectives); `off` leaves it to the graph (an all-reduce per
  // gradient per micro-batch) or, at stage 2, to ShardedOptimizer::reduce (one per gradient).
  std::string overlap_grad_reduce = "off";
  double grad_bucket_mb = 25;  // a bucket is closed at this size (MiB of f32 gradients)
  bool operator==(const ParallelConfig&) const = default;
};

// [optimizer]: how long, on which batches, with which updates.
struct OptimizerConfig {
  int64_t steps = 4500;
  int64_t micro_batch = 0, accumulation = 0, global_batch = 64;  // 0: derived (see above)
  double lr = 2e-3, min_lr = 1e-4;
  int64_t warmup = 50;
  AdamWConfig adamw = {0.9, 0.95, 1e-8, 0.01};
  double clip = 1.0;  // global-norm clipping (<= 0: none)
  // A step whose loss or gradient norm is not finite stops the run with an Error before the update
  // (the last checkpoint stays the resume point); with this set, such a step is skipped instead:
  // no update, its samples consumed, counted in Trainer::skipped_steps().
  bool skip_nonfinite = false;
  uint64_t seed = 1234;  // the initial weights, the data order and dropout
  // Fills the derived batch number from the data ranks (dp x ep, named `ways` in the messages);
  // Error naming the numbers that do not fit.
  void resolve_batch(int64_t data_ranks, const std::string& ways = "dp");
  bool operator==(const OptimizerConfig&) const = default;
};

// [data]: what the run reads.
struct DataConfig {
  std::string files;  // --data: "" = the embedded addition task; else a file, a comma-separated list or a glob
  std::string format = "auto";  // --data-format: auto, bytes, u16, u32, llmc (see TokenFormat)
  int digits = 3;  // model.seq 0 = the longest problem (addition) or 256 (a file)
  int64_t eval_samples = 128;
  // Validation of a --data run (not the addition task, which has its own held-out problems): a
  // separate corpus (`val_data`, the same forms and --data-format as `files`), or the last
  // `val_fraction` of `files`' tokens held out (training samples only the rest: CorpusPart). Either
  // gives EvenWindows of up to `val_samples` sequences, the same at every evaluation.
  std::string val_data;
  double val_fraction = 0;  // 0: none; else in (0, 1)
  int64_t val_samples = 64;
  // Raw text through a SentencePiece tokenizer (tokenize.h): `files` and `val_data` are text files,
  // cut into documents (`documents`: file, lines or paragraphs; or at `document_separator`), each
  // followed by the tokenizer's eos (if it has one) and tokenized in memory once per process (under
  // MPI each process tokenizes for itself; the Trainer checks that they agree). `model.vocab` must
  // hold the tokenizer's vocabulary.
  std::string tokenizer;
  std::string documents = "file";
  std::string document_separator;
  // Packing with document boundaries (packing.h): `eos_id` ends a document (-1: the tokenizer's eos
  // when there is one; TrainConfig::check() fills it in). With `document_attention`
  // (--no-cross-document-attention) every token attends only within its document and position ids
  // restart at each document (GPT-2 only: check() refuses it for a Llama model).
  int64_t eos_id = -1;
  bool document_attention = false;
  // The training step's batches (loader.h): each tp group's reader reads and broadcasts
  // (`loader_sync`; false: every rank reads the whole micro-batch), prefetching the next step on a
  // background thread (`loader_prefetch`, --no-prefetch to turn off).
  bool loader_sync = true, loader_prefetch = true;
  // The tokenizer and document options of a --tokenizer run (after check()); nullopt without one.
  std::optional<TextTokens> text_tokens() const;
  bool has_validation() const { return !val_data.empty() || val_fraction != 0; }
  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  // [model]: the architecture, and how it is trained: dropout (GPT-2's embedding, attention and
  // residual dropout), bf16 parameters for the kernels with fp32 masters.
  GptConfig model = demo_model();
  double dropout = 0.0;
  bool bf16 = false;
  // --init-from: the model directory's special-token ids, which its checkpoints keep (config.json
  // and generation_config.json each their own) except those the run sets: a --tokenizer's
  // bos/eos/pad, --eos-id's eos. nullopt: a fresh model (the ids come from the run alone).
  std::optional<StoredTokenIds> init_token_ids;
  // --init-from: the directory's vocab_size (0: a fresh model). A larger model.vocab grows it for
  // tokens added to its tokenizer or --resize-vocab (train/vocab_resize.h): init_from_model keeps
  // the old rows and draws the added ones as transformers' resize_token_embeddings does.
  int64_t init_vocab = 0;
  ParallelConfig parallel;
  OptimizerConfig optimizer;
  DataConfig data;
  // Where the parameters, the optimizer state and every step's tensors live (--device): the host,
  // or a device whose memory and kernels are registered (train/device_checks.h says what runs there).
  Device device;

  // Every check a run makes before it starts (mesh vs. ranks, heads vs. tp, batch sizes, the data
  // file, the vocabulary): one Error with what is wrong. Fills the derived batch number. Without
  // `open_data` the data files are left alone (the Trainer checks them where they are read).
  void check(int64_t ranks, bool open_data = true);
};

}  // namespace shardwise::train
