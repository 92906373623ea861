#pragma once
// Pipeline schedules as per-rank ordered action lists.
//
// p pipeline ranks hold S = p * v stages (v virtual stages per rank): stage s lives on rank s % p
// (Megatron's interleaving; v = 1 gives stage s on rank s). Each of m micro-batches passes every
// stage forward (F) and then backward, either in one action (B: input and weight gradients) or
// split (ZB: BackwardInput computes the input gradient, BackwardWeight the weight gradients).
// Between stages on different ranks, activations travel forward and gradients backward as
// matched point-to-point actions:
//   SendActivation(s, mb)  rank of s  -> rank of s+1   matched by RecvActivation(s+1, mb)
//   SendGrad(s, mb)        rank of s  -> rank of s-1   matched by RecvGrad(s-1, mb)
// (the action names the stage that runs on the acting rank). Stages on the same rank hand over
// without messages. Every list ends with the optimizer step.
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::pipeline {

enum class ActionKind {
  Forward,
  Backward,        // input and weight gradients together
  BackwardInput,   // the input gradient only (zero-bubble schedules)
  BackwardWeight,  // the weight gradients only
  SendActivation,
  RecvActivation,
  SendGrad,
  RecvGrad,
  OptimizerStep,
};
std::string_view action_kind_name(ActionKind kind);
bool is_compute(ActionKind kind);  // Forward, Backward, BackwardInput, BackwardWeight
bool is_send(ActionKind kind);
bool is_recv(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = -1;        // the stage on the acting rank (-1: optimizer step)
  int micro_batch = -1;  // -1: optimizer step
  int peer = -1;         // send/recv: the other pipeline rank
  // Compact text: "F3" (micro-batch 3), "F3.s5" when the rank holds several stages, "B3", "Bi3",
  // "W3", "sendA3>1", "recvA3<0", "sendG3>0", "recvG3<1", "step".
  std::string to_string(bool show_stage = false) const;
  friend bool operator==(const Action&, const Action&) = default;
};

enum class ScheduleKind { FThenB, OneFOneB, Interleaved, ZeroBubbleH1 };
std::string_view schedule_kind_name(ScheduleKind kind);  // "fthenb", "1f1b", "interleaved", "zbh1"
// Parses those names (and "gpipe", "interleaved-1f1b", "zb-h1"); Error listing them otherwise.
ScheduleKind parse_schedule_kind(std::string_view name);

struct Schedule {
  std::string name;
  int ranks = 1;           // p
  int virtual_stages = 1;  // v
  int micro_batches = 1;   // m
  bool split_backward = false;
  bool forward_only = false;  // no backward actions (evaluation); not a training schedule
  std::vector<std::vector<Action>> actions;  // per pipeline rank, in execution order

  int stages() const { return ranks * virtual_stages; }
  int rank_of(int stage) const { return stage % ranks; }
  std::vector<int> stages_of(int rank) const;  // ascending
  std::string to_string() const;               // one line per rank
};

// The generators. Each Errors with the numbers when the configuration is impossible: fewer than
// one rank or micro-batch, interleaving with m not a multiple of p (Megatron's grouping of p
// micro-batches per virtual-stage round) or with v < 2, zero bubble with m < p.
Schedule fthenb(int ranks, int micro_batches);                        // GPipe: every F, then every B
Schedule one_f_one_b(int ranks, int micro_batches);                   // PipeDream-flush 1F1B
Schedule interleaved_1f1b(int ranks, int virtual_stages, int micro_batches);  // Megatron-LM
Schedule zero_bubble_h1(int ranks, int micro_batches);                // ZB-H1 (Qi et al. 2023)
Schedule make_schedule(ScheduleKind kind, int ranks, int micro_batches, int virtual_stages = 1);
// Forwards only (evaluation): each rank runs its stages for micro-batch 0, 1, ... in turn.
Schedule forward_only(int ranks, int virtual_stages, int micro_batches);

// Adds the send/recv actions to lists of compute actions (and the optimizer step). The messages
// are placed where an execution with unit action times (F = B_input = W = 1, B = 2) would pass
// them, as one global sequence of which every rank's list is the projection, and in which a send
// and its receive are adjacent: so the lists cannot deadlock under blocking point-to-point, and
// every pair of ranks sees its messages in the same order.
void add_communication(Schedule& s);

// The layers [begin, end) of each of `stages` stages (with virtual stages, the p x v chunks in
// pipeline order): balanced; the remainder goes to the middle stages first (the first stage also
// holds the embeddings, the last the head and loss), so the first and the last stage hold fewer, as
// Llama 3's 126 layers on 16 ranks x 4 virtual stages. Error when a stage would get no layer.
struct LayerRange {
  int begin = 0, end = 0;
};
std::vector<LayerRange> split_layers(int layers, int stages, int virtual_stages = 1);

}  // namespace shardwise::pipeline
