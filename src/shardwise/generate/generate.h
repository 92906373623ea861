#pragma once
// Text generation with the GPT-2 of gpt.h or the Llama of llama.h on a dp x tp (x ep x pp) mesh: every rank
// of the mesh constructs a Generator with the same arguments and calls generate() together
// (threads of one process or MPI processes); every rank returns the same tokens.
//
// The graphs are gpt_decode.h's or llama_decode.h's (models.h picks), planned by the same
// completion and lowering as training and run
// by runtime::Runtime, so dp and tp are annotations: dp splits the prompts (the batch is padded to
// a multiple of dp with copies of the first prompt, dropped from the result), tp shards the heads
// (and so the KV cache) and the vocabulary, ep the MoE experts (and the batch, with dp). pp cuts
// the model into stages by layer as training does (embeddings on the first, the head on the last):
// each process plans its stage's graphs on its stage's mesh (the other dims) and holds its layers'
// cache; for each token the stages run in turn, each handing its block of the residual stream
// [B, T, H] to the process at its place in the next stage (a reshard plan from one stage's mesh to
// the next's, run by Runtime::transfer as training's pipeline does), and the last stage's logits
// are broadcast to every rank.
// Each graph is planned once per shape and kept.
//
// With the KV cache (the default): one prefill over the prompts, then one decode step per new
// token, which reads the cached keys and values instead of recomputing the prefix. Each rank holds
// its block of the cache, [B/dp, heads/tp, C, head_dim] per layer for keys and values (Llama:
// its kv heads, kv_heads/tp, or all of them when tp does not divide kv_heads), C =
// the longest prompt + new tokens (at most the model's positions), and writes the step's keys and
// values into it at each sequence's position. Without (`kv_cache = false`): each step runs the
// prefill graph over every token so far (one graph per length), for comparison.
//
// Prompts of different lengths: each sequence keeps its own positions (0, 1, ...); the prefill
// pads on the right (causal attention never looks ahead, so real positions do not see the
// padding) and a decode step masks cache slots at or past its position. So a sequence's tokens are
// those it gets alone; only the GEMM shapes differ, which may change the last float bits.
//
// A sequence stops after `max_new_tokens`, after its eos token (kept in the output), or when it
// reaches positions + 1 tokens (the last token is predicted from the last position and never fed
// back). Sampling: sampling.h, keyed by (seed, prompt index, position).
//
// On a device (Generator's `device`: the fake device of the tests, or a GPU): the weights, the
// constants and the KV cache live there (each copied once), each step's ids, positions and masks
// are copied there, the graphs run the device's kernels (ops/device_kernels.h) on the runtime's
// compute stream, the step's keys and values are written into the cache with device-to-device
// copies, and the host reads one thing a step: the logits [B, 1, V] its sampling needs (one counted
// device-to-host copy per rank and step; on a pp mesh per rank of the last stage, whose first process
// broadcasts them over host memory). Ranks as threads on one device reshard through what device
// tensors have (runtime.h). On a pp mesh each stage's cache is on its ranks' device and the residual
// stream goes from stage to stage as device tensors (Runtime::transfer, on the communication
// stream). A process's graphs all run on one pair of streams (the first graph's), so a step's
// cache writes come before the next step's reads on every stage, whether its host waits or not.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/comm/communicator.h"
#include "shardwise/models/gpt_decode.h"
#include "shardwise/generate/sampling.h"
#include "shardwise/tensor/device.h"

namespace shardwise::runtime {
class Runtime;
}  // namespace shardwise::runtime

namespace shardwise::reshard {
class Resharder;
}  // namespace shardwise::reshard

namespace shardwise::train {

struct GenerateConfig {
  int64_t max_new_tokens = 32;
  SamplingConfig sampling;
  int64_t eos_id = -1;  // -1: none
  // Further ids that end a sequence as eos_id does (generation_config.json's eos_token_id as a list
  // of several ids).
  std::vector<int64_t> more_eos_ids;
  bool kv_cache = true;
  bool keep_logits = false;  // keep the row of logits each new token was chosen from
  // Choose among the first `usable_vocab` ids only (0: every id): a tokenizer's vocabulary inside a
  // model's rounded-up one (train/data_defaults.h), whose padding ids decode to nothing.
  int64_t usable_vocab = 0;
  void validate(const GptConfig& model) const;
};

enum class StopReason { Eos, MaxNewTokens, MaxPositions };
std::string_view stop_reason_name(StopReason reason);  // "eos", "max_new_tokens", "max_positions"

struct GeneratedSequence {
  std::vector<int64_t> tokens;  // the new tokens (the eos token included)
  std::vector<std::vector<float>> logits;  // with keep_logits: per new token, the [vocab] row it came from
  StopReason stop = StopReason::MaxNewTokens;
};

// A sequence's kept logits as one [new tokens, vocab] f32 tensor (a row per new token).
Tensor logits_tensor(const GeneratedSequence& s, int64_t vocab);

struct GenerateStats {
  double plan_seconds = 0;     // building, planning and binding graphs not planned before
  double prefill_seconds = 0;  // the first new token of every sequence
  double decode_seconds = 0;   // every later token
  int64_t new_tokens = 0;      // over the prompts (the padding's not counted)
  int64_t decode_tokens = 0;   // new tokens after the first of each sequence
  int64_t steps = 0;           // graph runs (prefill included)
  // New tokens per second of prefill + decode, and decode tokens per second of decode.
  double tokens_per_second() const;
  double decode_tokens_per_second() const;
};

struct GenerateResult {
  std::vector<GeneratedSequence> sequences;  // one per prompt
  GenerateStats stats;
};

// This process's block of each parameter `specs` names (its global shape and layout), f32.
using WeightSource = std::function<std::map<std::string, Tensor>(std::span<const ckpt::LoadSpec> specs)>;
// From a model directory (train::load_model_weights): every key of the checkpoint must be asked
// for, unless `one_stage` (a pp mesh: a process asks for its stage's parameters only; an asked key
// the checkpoint lacks is still an error, Generator's "the weights hold no ...").
WeightSource checkpoint_weights(const ckpt::fs::path& dir, const GptConfig& model, int64_t process,
                                bool one_stage = false);
// Blocks cut from whole tensors (tests; a model trained in-process).
WeightSource whole_weights(std::map<std::string, Tensor> whole, int64_t process);

// Error naming the prompt (by index) that is empty, holds a token outside [0, vocab) or is longer
// than the model's positions.
void check_prompts(const std::vector<std::vector<int64_t>>& prompts, const GptConfig& model);
// The config.json key that bounds the positions generation may use: "sliding_window" where a
// Mistral's window set the bound (model.seq), else max_position_embeddings (Llama) or n_positions.
std::string_view positions_key(const GptConfig& model);

class Generator {
 public:
  // `strategy`: dims dp, tp, ep and pp; `model` a GPT-2 or a Llama. Weights are read from `weights`
  // as the graphs need them, once per layout (on a pp mesh each process reads its stage's only).
  // A cp dim replicates: the ranks of a cp group each run the whole prompts and cache (the graphs
  // are built with no cp, so nothing is sharded on it), so a model trained on a cp mesh generates
  // on that mesh; the sequence is not split (prefill by the ring is not built).
  // `device`: where the weights, the cache and the graphs' tensors live (the host by default; see above).
  Generator(const GptConfig& model, const Strategy& strategy, std::shared_ptr<comm::Communicator> world,
            WeightSource weights, Device device = {});
  ~Generator();

  GenerateResult generate(const std::vector<std::vector<int64_t>>& prompts, const GenerateConfig& config);

 private:
  struct Compiled;
  struct Batch;
  Compiled& prefill(int64_t sequences, int64_t length);
  Compiled& decode_step(int64_t sequences, int64_t cache_length);
  Compiled& compile(std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Compiled>>& cache,
                    std::pair<int64_t, int64_t> key, bool decode);
  void bind_weights(Compiled& c);
  // Runs `c` on the sequences' current tokens (prefill graph: every token; decode: the last one).
  void run_prefill(Compiled& c, Batch& b);
  void run_decode(Compiled& c, Batch& b);
  // Appends each active sequence's next token, chosen from the logits `c` computed.
  void next_tokens(Compiled& c, Batch& b);
  void write_cache(Compiled& c, Batch& b, bool prefill, const std::vector<int64_t>& fed_position);
  void cut_stages(const Strategy& whole);
  // Runs `c` on this process's one pair of streams (device: the first graph's; host: nothing).
  void share_streams(runtime::Runtime& rt);
  void run_stage(Compiled& c);
  // Binds an input from its global value: this rank's block, copied to the device when there is one.
  void bind_input(runtime::Runtime& rt, std::string_view name, const Tensor& global) const;
  // The logits [B, 1, V] on the host, the same on every rank of the stage.
  Tensor host_logits(Compiled& c);

  GptConfig model_;
  Device device_;
  Strategy strategy_;  // this process's stage's mesh (the whole mesh without pp)
  std::shared_ptr<comm::Communicator> world_;
  WeightSource weights_;
  int64_t process_ = 0;
  std::map<std::string, Tensor> loaded_;  // "<name>|<placements>" -> this process's block
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Compiled>> prefill_, decode_;
  double plan_seconds_ = 0;
  runtime::Runtime* streams_of_ = nullptr;  // on a device: the runtime whose streams every graph runs on
  // On a pp mesh: pp ranks, this stage, its part of the model, the meshes of the stages that hand
  // it the residual stream and take it (empty: none), the last stage's first process (the logits'
  // root), and the resharder moving the stream (on its own communicator over the world).
  int64_t pp_ = 1, stage_ = 0;
  DecodePart part_;
  std::optional<mesh::ProcessMesh> prev_mesh_, next_mesh_;
  int last_root_ = 0;
  std::unique_ptr<reshard::Resharder> resharder_;
};

}  // namespace shardwise::train
