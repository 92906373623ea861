#include "shardwise/cli/app.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <iostream>
#include <sstream>

#include "shardwise/cli/ckpt_cmd.h"
#include "shardwise/cli/commands.h"
#include "shardwise/cli/device_option.h"
#include "shardwise/cli/plan/calibrate_cmd.h"
#include "shardwise/cli/gemm_cmd.h"
#include "shardwise/cli/help_format.h"
#include "shardwise/cli/train/run_header.h"
#include "shardwise/cli/train/stored_options.h"
#include "shardwise/cli/generate/tokenize_cmd.h"
#include "shardwise/cli/train/train_options.h"
#include "shardwise/cli/train/train_run.h"
#include "shardwise/cli/usage.h"
#include "shardwise/core/error.h"

namespace shardwise::cli {

namespace {

constexpr const char* kConfigHelp =
    "read options from a TOML file: `key = value` lines, keys are the long option names, in the sections below "
    "([model], [parallel], ...) or in none; paths resolve from the file; the command line wins";
constexpr const char* kCpAttentionHelp =
    "with a cp mesh dim, the fused attention's exchange: ring (default; k/v blocks passed around the cp ring) or "
    "gather (k/v all-gathered over cp)";
constexpr const char* kGemmHelp =
    "the f32 GEMM library: auto (the user's OPENBLAS_CORETYPE if set, else SHARDWISE_GEMM, else the choice "
    "`shardwise gemm-check` cached for this machine), openblas, openblas-haswell, openblas-zen, "
    "openblas-skylakex, openblas-cooperlake, blis or onednn";

// Sharding and the dp reduction of the gradients, among `shardwise train`'s options.
void add_sharding_options(CLI::App* t, train::TrainConfig& c) {
  t->add_option("--sharding-stage", c.parallel.sharding.stage,
                 "state sharded over dp: 0 none, 1 optimizer state (moments, fp32 masters), 2 and gradients "
                 "(reduce-scattered), 3 and parameters (FSDP: all-gathered before each use, freed after it)");
  t->add_option("--sharding-layout", c.parallel.sharding.layout,
                "with --sharding-stage 1|2 (stage 3 cuts each parameter by rows): v1 (each parameter's state on one dp rank, balanced by size) or v2 "
                "(split-param: the rank's parameters as one flat buffer cut into equal dp ranges)");
  t->add_option("--prefetch-params", c.parallel.sharding.prefetch_params,
                "with --sharding-stage 3: start the parameter all-gathers of this many layers ahead before a layer "
                "computes, in forward and backward (0: off; each all-gather waits at its use)");
  t->add_option("--overlap-grad-reduce", c.parallel.overlap_grad_reduce,
                "the dp reduction of the gradients: on (in buckets, each started while the backward runs), after "
                "(the same buckets after the backward) or off (one collective per gradient)")
      ->check(CLI::IsMember({"on", "after", "off"}));
  t->add_option("--grad-bucket-mb", c.parallel.grad_bucket_mb,
                "with --overlap-grad-reduce on|after: a gradient bucket's size in MiB (f32)");
}

// When and where `shardwise train` saves, and what a stopped run keeps.
void add_checkpoint_options(CLI::App* t, TrainOptions& o) {
  t->add_option("--save-every", o.checkpoint.save_every, "checkpoint every N steps and at the end (0: never)");
  t->add_option("--save-dir", o.checkpoint.save_dir, "where checkpoints go (empty: <run-dir>/checkpoints)");
  t->add_option("--save-total-limit", o.checkpoint.save_total_limit, "keep the newest N checkpoints (0: all)");
  t->add_flag("--async-save", o.checkpoint.async_save, "write checkpoints in the background");
  t->add_flag("--save-on-interrupt,!--no-save-on-interrupt", o.checkpoint.save_on_interrupt,
              "Ctrl-C or SIGTERM stops the run after its step and saves that step (default: on with --save-every)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  t->add_flag("--save-model-only,--no-optimizer-state", o.checkpoint.save_model_only,
              "checkpoints hold the model (or adapters), its config and tokenizer only: no AdamW moments, fp32 masters "
              "or generator state (a --resume of one needs --skip-optimizer)");
  t->add_flag("--skip-optimizer", o.checkpoint.skip_optimizer,
              "--resume: fresh AdamW moments at the checkpoint's step (its moments, if any, are not read)");
  t->add_option("--init-from", o.checkpoint.init_from,
                "start from the weights of a model directory (transformers save_pretrained or a shardwise checkpoint): "
                "fresh optimizer, step 0, the model configuration from its config.json");
  t->add_option("--ignore-keys", o.checkpoint.ignore_keys, "with --init-from: globs of parameters or file keys not to load")->expected(1, -1);
  t->add_option("--resize-vocab", o.checkpoint.resize_vocab, "with --init-from: grow the embedding and head to N tokens "
                "(resize_token_embeddings(N)); default: the ids of the directory's tokenizer, when more")->type_name("N");
}

}  // namespace

constexpr const char* kLoraTargetsHelp =
    "modules that get adapters (PEFT's target_modules): GPT-2's c_attn, c_proj, c_fc (attn.c_proj, mlp.c_proj); "
    "Llama's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; Mixtral's experts.gate_up_proj, "
    "experts.down_proj (PEFT's target_parameters); or all-linear. Default: PEFT's for the model (c_attn; q_proj,v_proj)";

constexpr const char* kAutoHelp =
    "choose the mesh, --sp, --sharding-stage, --recompute, the batch split, the schedule and --overlap-grad-reduce "
    "as `plan --auto` finds fastest on --ranks devices of this machine's calibration (docs/planner.md); the run "
    "header names the choice";

namespace {

// train's LoRA options (add_train_options).
void add_lora_options(CLI::App* t, TrainOptions& o) {
  auto& lora = o.config.model.lora;
  t->add_option("--lora-rank", lora.rank,
                "train LoRA adapters of rank R on the --init-from model, whose weights stay frozen (0: no LoRA)");
  t->add_option("--lora-alpha", lora.alpha, "LoRA's alpha: the update is scaled by alpha / r");
  t->add_option("--lora-targets", lora.targets, kLoraTargetsHelp)
      ->delimiter(',');
  t->add_option("--lora-dropout", lora.dropout, "dropout on the adapters' input while training");
  t->add_flag("--lora-rslora", lora.rslora, "rank-stabilized LoRA: scale by alpha / sqrt(r)");
  t->add_option("--lora-from", o.checkpoint.lora_from,
                "continue training the adapters of a PEFT adapter directory (its adapter_config.json sets the "
                "--lora-* options; a LoRA checkpoint is one)");
}

}  // namespace

// `shardwise train`'s options, bound to `o` (the help shows the struct's defaults).
void add_train_options(CLI::App& cmd, TrainOptions& o) {
  auto& c = o.config;
  auto* t = &cmd;
  t->add_option("--config", o.config_file, kConfigHelp)->type_name("PATH");
  t->add_flag("--auto", o.auto_plan, kAutoHelp);
  t->add_option("--mesh", c.parallel.mesh, "mesh with named dims dp, tp, pp, ep, cp");
  t->add_option("--gemm", o.gemm, kGemmHelp);
  t->add_option("--device", o.device,
                "where the parameters, optimizer state and every step's tensors live: cpu, cuda or cuda:N (a GPU of a "
                "CUDA build), or fake (the tests' device: host memory standing in for cuda:0, the CPU's kernels; "
                "docs/gpu.md). Off the CPU: one rank, or dp / tp / pp ranks as threads (fake: MPI processes too)");
  t->add_option("--schedule", c.parallel.schedule, "pipeline schedule on a pp mesh: fthenb, 1f1b, interleaved, zbh1");
  t->add_option("--virtual", c.parallel.virtual_stages, "interleaved schedule: stages per pipeline rank");
  t->add_option("--micro-batches", c.optimizer.accumulation, "pipeline micro-batches per step (the same as --accumulation)");
  t->add_flag("--sp", c.parallel.sequence_parallel, "sequence parallelism on the tp dim");
  t->add_option("--ranks", o.ranks, "ranks as threads (0: the mesh's size)");
  t->add_option("--steps", c.optimizer.steps, "optimizer steps (default with --data: one epoch of its training tokens)");
  t->add_option("--epochs", o.epochs, "with --data: steps for this many passes over its training tokens");
  t->add_option("--tokens", o.tokens, "with --data: steps for this many training tokens (global batch x seq a step)");
  t->add_option("--micro-batch", c.optimizer.micro_batch, "sequences per data rank (dp x ep) per micro-batch (0: derived)");
  t->add_option("--accumulation", c.optimizer.accumulation, "micro-batches per step (0: derived)");
  t->add_option("--global-batch", c.optimizer.global_batch, "sequences per step = micro-batch x accumulation x dp x ep (0: derived)");
  t->add_option("--lr", c.optimizer.lr, "peak learning rate");
  t->add_option("--min-lr", c.optimizer.min_lr, "learning rate at the end of the cosine decay");
  t->add_option("--warmup", c.optimizer.warmup, "linear warm-up steps");
  t->add_option("--weight-decay", c.optimizer.adamw.weight_decay, "AdamW weight decay on matrices");
  t->add_option("--beta1", c.optimizer.adamw.beta1, "AdamW beta1");
  t->add_option("--beta2", c.optimizer.adamw.beta2, "AdamW beta2");
  t->add_option("--dropout", c.dropout, "dropout probability on GPT-2's embeddings, attention and residuals, Llama's attention "
                "(with --init-from: the directory's *_pdrop or attention_dropout unless given)");
  t->add_option("--recompute", c.model.recompute,
                "activation recompute: none, full (keep each layer's input, recompute the layer before its backward) "
                "or selective (recompute the attention core: scores, softmax, dropout, probs x V)");
  t->add_option("--recompute-layers", c.model.recompute_layers,
                "recompute only the first N layers of each pipeline stage (default: all)");
  t->add_option("--attention", c.model.attention,
                "attention core: fused (default; tiled causal attention, nothing [S, S] kept for the backward) or "
                "unfused (scores, mask, softmax, dropout and probs x V as separate ops)");
  t->add_option("--cp-attention", c.model.cp_attention, kCpAttentionHelp);
  t->add_option("--lm-head", c.model.lm_head,
                "the training and validation head: fused (default; the [B*T, V] logits computed in row chunks of ~64 MiB "
                "and dropped, recomputed in backward) or unfused (the logits whole, then cross-entropy)");
  t->add_flag("--bf16", c.bf16, "parameters stored in bf16 (fp32 masters; the kernels' dtype is --compute's)");
  t->add_option_function<std::string>(
       "--compute", [&c](const std::string& dtype) { c.model.compute_dtype = parse_dtype(dtype); },
       "the GEMMs' and attention's operands: f32 (default) or bf16 (f32 accumulation; norms, softmax, the loss and "
       "the residual stream stay f32, as autocast)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->default_str("f32");
  add_sharding_options(t, c);
  t->add_flag("--skip-nonfinite-steps", c.optimizer.skip_nonfinite,
              "skip a step whose loss or gradient norm is not finite (counted) instead of stopping the run");
  t->add_option("--clip", c.optimizer.clip, "global gradient-norm clipping, <= 0: none");
  t->add_option("--seed", c.optimizer.seed, "seed of the initial weights and the data order");
  t->add_option("--data", c.data.files,
                "token file(s): a path, a comma-separated list or a glob ('shards/*.bin'), concatenated in sorted "
                "order; default: embedded addition");
  t->add_option("--data-format", c.data.format,
                "auto (llm.c magic -> llmc, other .bin -> u16, else bytes), bytes, u16, u32 or llmc")
      ->check(CLI::IsMember({"auto", "bytes", "u16", "u32", "llmc"}));
  t->add_option("--tokenizer", c.data.tokenizer,
                "a SentencePiece tokenizer.model: --data (and --val-data) are raw text, tokenized in memory at the "
                "start (each document followed by the tokenizer's eos)");
  t->add_option("--documents", c.data.documents,
                "--tokenizer: documents are each file, each non-blank line, or paragraphs separated by blank lines")
      ->check(CLI::IsMember({"file", "lines", "paragraphs"}));
  t->add_option("--document-separator", c.data.document_separator,
                "--tokenizer: documents are the text between occurrences of this string (overrides --documents)");
  t->add_option("--eos-id", c.data.eos_id, "the end-of-text id that ends a document (-1: the tokenizer's eos, or none)");
  t->add_flag("--no-cross-document-attention", c.data.document_attention,
              "tokens attend only within their document and position ids restart at each document (needs an eos id)");
  t->add_flag("!--no-prefetch", c.data.loader_prefetch,
              "each tp group's data reader reads a step's batch when the step starts, not during the step before "
              "(loader_wait_s in metrics.jsonl shows the difference)");
  t->add_option("--val-data", c.data.val_data,
                 "validation token file(s) of a --data run: a path, list or glob in --data's --data-format");
  t->add_option("--val-fraction", c.data.val_fraction,
                "hold out the last F (0 < F < 1) of --data's tokens for validation; training never reads them");
  t->add_option("--val-samples", c.data.val_samples,
                "validation sequences per evaluation (all, if the validation data holds fewer disjoint ones)");
  t->add_option("--digits", c.data.digits, "digits of the embedded addition task");
  t->add_option("--model", c.model.model_type,
                "the architecture: gpt2 (LayerNorm, learned positions, GELU MLP, tied head) or llama (RMSNorm, rotary "
                "positions, SwiGLU MLP, grouped-query attention)")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  t->add_option("--layers", c.model.layers, "transformer layers");
  t->add_option("--heads", c.model.heads, "attention heads");
  t->add_option("--hidden", c.model.hidden, "hidden size");
  t->add_option("--seq", c.model.seq, "sequence length (0: the longest addition problem, or 256 for a file)");
  t->add_option("--vocab", c.model.vocab,
                "vocabulary size (default with --data: the tokenizer's or the data's, rounded up to a multiple of 64)");
  t->add_option("--kv-heads", c.model.kv_heads, "llama: key/value heads, dividing --heads (0: as many as --heads)");
  t->add_option("--head-dim", c.model.head_dim, "llama: each attention head's width (0: hidden / heads; Qwen3 sets its own)");
  t->add_option("--intermediate-size", c.model.intermediate_size, "llama: the SwiGLU MLP's width (0: 4 x hidden)");
  t->add_option("--experts", c.model.experts,
                "llama: experts per MoE MLP (Mixtral's block_sparse_moe; 0: dense MLPs); split over an ep mesh dim");
  t->add_option("--top-k", c.model.top_k, "llama with --experts: experts per token");
  t->add_option("--moe-layers", c.model.moe_layers, "llama with --experts: the MoE layers (default: every layer)")
      ->delimiter(',');
  t->add_option("--aux-loss", c.model.aux_loss, "llama with --experts: the load-balancing loss coefficient");
  t->add_option("--aux-loss-scope", c.model.aux_loss_scope,
                "llama with --experts: layer (one load-balancing term per MoE layer, as Switch and Megatron) or model "
                "(the counts and probabilities of all MoE layers pooled into one term, as transformers' Mixtral)")
      ->check(CLI::IsMember({"layer", "model"}));
  t->add_option("--router-z-loss", c.model.router_z_loss, "llama with --experts: the router z-loss coefficient");
  t->add_option("--capacity-factor", c.model.capacity_factor,
                "llama with --experts: tokens per expert = ceil(factor x tokens x top-k / experts), the rest dropped "
                "(0: dropless)");
  t->add_option("--router", c.model.router,
                "llama with --experts: the gate scores, softmax over the experts (Mixtral) or sigmoid per expert "
                "(DeepSeek-V3), then top-k and renormalisation")
      ->check(CLI::IsMember({"softmax", "sigmoid"}));
  t->add_option("--shared-expert-width", c.model.shared_expert_width,
                "llama with --experts: a Qwen-MoE shared expert of this width on every token, gated by "
                "sigmoid(shared_expert_gate x) (0: none)");
  t->add_option("--rope-theta", c.model.rope_theta, "llama: the rotary embedding's base");
  t->add_option("--rms-norm-eps", c.model.rms_norm_eps, "llama: the RMSNorm epsilon");
  t->add_flag("--tied-head,!--untied-head", c.model.tie_word_embeddings,
              "llama: --untied-head: a separate LM head (lm_head.weight); tied (default; GPT-2: always): the embedding")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  t->add_option("--eval-every", o.logging.eval_every,
                "evaluate every N steps (0: at the end): held-out accuracy (addition) or validation loss (--val-*)");
  t->add_option("--eval-samples", c.data.eval_samples, "held-out problems per evaluation");
  t->add_option("--run-dir", o.logging.run_dir,
                "where metrics.jsonl, loss_curve.svg and checkpoints/ go (default: the run --resume continues, else "
                "a new runs/<config file or model>-<YYYYmmdd-HHMMSS>, named by runs/latest)");
  t->add_option("--loss-axis", o.logging.loss_axis, "loss_curve.svg's loss axis: log (a falling loss stays readable after the first steps) or linear")
      ->check(CLI::IsMember({"linear", "log"}));
  t->add_option("--log-every", o.logging.log_every, "progress line every N steps when not on a terminal");
  t->add_option("--progress", o.logging.progress,
                "auto (a live bar on a terminal, plain lines otherwise and under mpirun), bar, lines or none");
  add_checkpoint_options(t, o);
  t->add_flag("--profile", o.logging.profile, "time every op, reshard, collective and optimizer step: a table at the end and "
              "<run-dir>/trace.json (Chrome trace format: open it in Perfetto)");
  t->add_option("--max-shard-size", o.checkpoint.max_shard_size, "largest safetensors file of a checkpoint");
  t->add_option("--resume", o.checkpoint.resume, "auto (the newest verified checkpoint of --save-dir) or a checkpoint directory");
  t->add_flag("--no-verify-resume", o.checkpoint.no_verify_resume, "--resume DIR: load without checking sizes and checksums");
  t->add_option("--memory-limit", o.memory_limit,
                "refuse a run whose estimated peak memory per process exceeds this: auto (the machine's available "
                "memory), none, or a size (24GiB, 1.5GB)");
  t->add_flag("--dry-run", o.logging.dry_run, "print the per-rank memory plan (plan --memory) and stop before training");
  t->add_flag("--json", o.logging.json, "with --dry-run / plan --memory: the plan as JSON");
  add_lora_options(t, o);
}

namespace {

// `shardwise generate`'s options, bound to `o`.
void add_generate_options(CLI::App& cmd, GenerateOptions& o) {
  cmd.add_option("--gemm", o.gemm, kGemmHelp);
  cmd.add_option("--checkpoint,--init-from", o.checkpoint,
                 "the model: a checkpoint (<save-dir>/checkpoint-<step>) or a model directory with config.json");
  cmd.add_option("--config", o.config_file,
                 "read options from a TOML file: `key = value` lines, keys are the long option names (an optional "
                 "[generate] section); options on the command line win");
  cmd.add_option("--prompt", o.prompts, "a prompt as text (byte vocabularies, or with --tokenizer); repeat for a batch")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--prompt-file", o.prompt_file, "prompts as text, one per non-empty line");
  cmd.add_option("--prompt-ids", o.prompt_ids, "prompts as token ids: 1,2,3 (several separated by ';')");
  cmd.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate per prompt at most");
  cmd.add_option("--temperature", o.temperature,
                 "sampling temperature; 0: greedy (default: greedy, or 1 with --top-k / --top-p)");
  cmd.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)");
  cmd.add_option("--top-p", o.top_p, "sample among the most likely tokens holding this probability, in (0, 1]");
  cmd.add_option("--seed", o.seed, "sampling seed (draws keyed by seed, prompt index and position)");
  cmd.add_option("--eos-id", o.eos_id,
                 "stop a sequence at this token (default: generation_config.json's eos_token_id; -1: never)");
  cmd.add_option("--mesh", o.mesh, "mesh with named dims dp and ep (split the prompts; ep the experts too), tp (shards heads and cache) and pp (stages by layer)");
  cmd.add_option("--ranks", o.ranks, "ranks as threads (0: the mesh's size)");
  cmd.add_flag("--no-kv-cache", o.no_kv_cache, "recompute the whole prefix for every token (for comparison)");
  cmd.add_flag("--json", o.json, "print one JSON object: the tokens, texts, stop reasons and timings");
  cmd.add_option("--tokenizer", o.tokenizer,
                 "a SentencePiece tokenizer.model: text prompts are encoded with it and the output decoded (its eos "
                 "stops a sequence unless --eos-id); default: the checkpoint's tokenizer.model when it has one");
  cmd.add_option("--device", o.device,
                 fmt::format("where the weights, the KV cache and the kernels are: {}; the host reads the logits "
                             "once a step (on a pp mesh: the last stage's ranks)", kDeviceNames))
      ->check(CLI::IsMember({"cpu", "fake", "cuda"}));
  cmd.add_option("--logits-out", o.logits_out,
                 "write the logits each new token came from to a .safetensors file (\"logits.<prompt>\" [new, vocab])");
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"shardwise: auto-parallel training core (SPMD rules, reshard, pipelines, unified checkpoints)"};
  app.formatter(std::make_shared<CleanHelpFormatter>());  // every command inherits it
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardwise 0.1.0");
  RulesOptions rules_opts;
  auto* rules_cmd = app.add_subcommand("rules", "List every SPMD rule with the ops it covers");
  rules_cmd->add_flag("--ops", rules_opts.list_ops, "List the ops with the rule each uses instead");

  InferOptions infer_opts;
  auto* infer_cmd = app.add_subcommand("infer", "Show the placements an op's rule requires and produces");
  infer_cmd->option_defaults()->always_capture_default();  // help shows the options' struct defaults
  infer_cmd->add_option("op", infer_opts.op, "op name (see `shardwise rules --ops`)")->required();
  infer_cmd->add_option("--mesh", infer_opts.mesh, fmt::format("mesh shape, e.g. 2,2 or dp=2,tp=2 (at most {} ranks)",
                                                                kMaxInferRanks))
      ->required();
  infer_cmd->add_option("--shapes", infer_opts.shapes, "input shapes separated by commas, e.g. 8x16,16x4")->required();
  infer_cmd->add_option("--placements", infer_opts.placements,
                        "input placements, one list per input separated by ';', e.g. \"S(0),R;R,S(1)\"")
      ->required();
  infer_cmd->add_option("--dtypes", infer_opts.dtypes, "input dtypes separated by commas (none: f32)");
  infer_cmd->add_option("--attrs", infer_opts.attrs, "op attributes, e.g. axis=[0,1],keepdim=true");
  infer_cmd->add_option("--part", infer_opts.part, "forward, reverse (placements are the outputs') or grad")
      ->check(CLI::IsMember({"forward", "reverse", "grad"}));

  VerifyCliOptions verify_opts;
  auto* verify_cmd = app.add_subcommand("verify", "Prove rules right numerically on simulated meshes");
  verify_cmd->add_option("--op", verify_opts.ops, "ops to verify (none: all)")->delimiter(',');
  verify_cmd->add_option("--mesh", verify_opts.meshes, "meshes (none: 2 3 2,2 2,3)");
  verify_cmd->add_flag("--quiet", verify_opts.quiet, "print only the summary line");
  verify_cmd->add_option("--device", verify_opts.device,
                         fmt::format("where the ranks' kernels run: {}; the reference stays the CPU kernel on one "
                                     "device, checks the device does not compute are counted as skipped (cuda: "
                                     "f64 cases run in f32)", kDeviceNames))
      ->check(CLI::IsMember({"cpu", "fake", "cuda"}))
      ->capture_default_str();

  PlanReshardOptions reshard_opts;
  auto* reshard_cmd = app.add_subcommand("plan-reshard", "Show how a tensor moves from one layout to another, and its cost");
  reshard_cmd->option_defaults()->always_capture_default();
  reshard_cmd->add_option("--shape", reshard_opts.shape, "global shape, e.g. 1024x4096")->required();
  reshard_cmd->add_option("--from", reshard_opts.from, "source layout, e.g. \"mesh=2x2 S(0),P\" (ranks=4-7 to name processes)")
      ->required();
  reshard_cmd->add_option("--to", reshard_opts.to, "target layout, e.g. \"mesh=2x2 R,S(1)\"")->required();
  reshard_cmd->add_option("--dtype", reshard_opts.dtype, "element type");
  reshard_cmd->add_option("--strategy", reshard_opts.strategy, "auto (cheapest), collectives or redistribute")
      ->check(CLI::IsMember({"auto", "collectives", "redistribute"}));
  reshard_cmd->add_option("--alpha-us", reshard_opts.alpha_us, "latency per message in microseconds");
  reshard_cmd->add_option("--bandwidth-gbps", reshard_opts.bandwidth_gbps, "bandwidth in GB/s");
  reshard_cmd->add_option("--dim-bandwidth-gbps", reshard_opts.dim_bandwidth_gbps, "bandwidth per mesh dim, e.g. 100,10")
      ->delimiter(',');

  PlanOptions plan_opts;
  TrainOptions plan_run;
  auto* plan_cmd = app.add_subcommand("plan", "Show how the run `train` describes (its options, --config and defaults) "
                                              "runs on its mesh: placements, reshards, collectives; or its memory");
  plan_cmd->option_defaults()->always_capture_default();  // help shows the options' struct defaults
  add_plan_options(*plan_cmd, plan_run, plan_opts);
  PipelineOptions pipe_opts;
  auto* pipe_cmd = app.add_subcommand("pipeline", "Generate, validate and simulate a pipeline schedule");
  pipe_cmd->option_defaults()->always_capture_default();
  pipe_cmd->add_option("--schedule", pipe_opts.schedule, "fthenb (gpipe), 1f1b, interleaved or zbh1");
  pipe_cmd->add_option("--stages", pipe_opts.stages, fmt::format("pipeline ranks (1 to {})", kMaxPipelineStages));
  pipe_cmd->add_option("--micro-batches", pipe_opts.micro_batches,
                       fmt::format("micro-batches per step (1 to {}; stages x virtual x micro-batches at most {})",
                                   kMaxPipelineMicroBatches, kMaxPipelineWork));
  pipe_cmd->add_option("--virtual", pipe_opts.virtual_stages, "virtual stages per rank, interleaved only (1 to 64)");
  pipe_cmd->add_option("--forward-time", pipe_opts.forward_time, "forward time of a rank's layers");
  pipe_cmd->add_option("--input-grad-time", pipe_opts.backward_input_time, "input-gradient time");
  pipe_cmd->add_option("--weight-grad-time", pipe_opts.backward_weight_time,
                       "weight-gradient time (backward = input + weight)");
  pipe_cmd->add_option("--send-time", pipe_opts.send_time, "time of one send");
  pipe_cmd->add_option("--activation-bytes", pipe_opts.activation_bytes,
                       "activation bytes a micro-batch holds per stage (1: count micro-batches)");
  pipe_cmd->add_option("--weight-grad-bytes", pipe_opts.weight_grad_bytes,
                       "bytes kept from the input gradient to the weight gradient (split schedules)");
  pipe_cmd->add_option("--svg", pipe_opts.svg, "write the simulated timeline as an SVG picture");

  TrainOptions train_opts;
  auto* train_cmd = app.add_subcommand("train", "Train a GPT-2, Llama or Mixtral model on a mesh (threads, or MPI processes under mpirun)");
  train_cmd->option_defaults()->always_capture_default();
  add_train_options(*train_cmd, train_opts);
  group_train_options(*train_cmd);
  GenerateOptions gen_opts;
  auto* gen_cmd = app.add_subcommand("generate", "Continue prompts with a saved model on a dp x tp x ep x pp mesh (KV cache)");
  gen_cmd->option_defaults()->always_capture_default();
  add_generate_options(*gen_cmd, gen_opts);
  auto ckpt_cmds = add_ckpt_commands(app);  // shardwise ckpt inspect|verify|merge|lora-merge|convert
  auto tokenize_cmd = add_tokenize_command(app);  // shardwise tokenize
  GemmCheckOptions gemm_opts;
  auto* gemm_cmd = add_gemm_check_command(app, gemm_opts);
  CalibrateCliOptions calibrate_opts;
  auto* calibrate_cmd = add_calibrate_command(app, calibrate_opts);

  refuse_out_of_range_integers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream unsaid;  // the other processes of an mpirun job: the same status, no second line
    return report_parse_error(app, e, argc, argv, reports_errors() ? std::cerr : unsaid);
  }
  try {
    if (*rules_cmd) return cmd_rules(rules_opts, std::cout);
    if (*infer_cmd) return cmd_infer(infer_opts, std::cout);
    if (*verify_cmd) return cmd_verify(verify_opts, std::cout);
    if (*reshard_cmd) return cmd_plan_reshard(reshard_opts, std::cout);
    if (*plan_cmd) {
      apply_run_sources(*plan_cmd, plan_run, false);  // a plan loads no weights: LoRA needs no base
      return cmd_plan(plan_run, plan_opts, std::cout);
    }
    if (*pipe_cmd) return cmd_pipeline(pipe_opts, std::cout);
    if (*gemm_cmd) return cmd_gemm_check(gemm_opts, std::cout);
    if (*calibrate_cmd) return cmd_calibrate(calibrate_opts, std::cout);
    if (*train_cmd) {
      complete_train_options(*train_cmd, train_opts, std::vector<std::string>(argv, argv + argc));
      return cmd_train(train_opts, std::cout);
    }
    if (*gen_cmd) {
      if (!gen_opts.config_file.empty()) apply_config_file(*gen_cmd, gen_opts.config_file);
      return cmd_generate(gen_opts, std::cout);
    }
    if (ckpt_cmds->chosen()) return ckpt_cmds->run(std::cout);
    if (tokenize_cmd->chosen()) return tokenize_cmd->run(std::cout);
  } catch (const Error& e) {
    // Under mpirun every rank checks the same input before training starts: rank 0 alone says so.
    // One write, so that mpirun's own notice cannot land inside the line.
    if (reports_errors()) std::cerr << fmt::format("shardwise: error: {}\n", e.what()) << std::flush;
    return usage_error_status();
  }
  return 0;
}

}  // namespace shardwise::cli
