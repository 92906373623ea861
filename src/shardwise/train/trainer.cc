#include "shardwise/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "shardwise/ckpt/checksum.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"
#include "shardwise/pipeline/schedule.h"
#include "shardwise/runtime/profiler.h"
#include "shardwise/train/context_parallel.h"
#include "shardwise/train/data_defaults.h"
#include "shardwise/train/device_checks.h"
#include "shardwise/models/custom.h"
#include "shardwise/models/models.h"
#include "shardwise/core/plural.h"
#include "shardwise/core/rank_failure.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::train {

namespace {

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024)); }

// Refuses a model whose largest parameter alone exceeds the machine's physical memory, before
// anything is built, naming the tensor and the bytes. The whole run's bytes (every part, per rank,
// against --memory-limit) are the memory plan's (memory_plan.h), which the command line checks.
void check_largest_parameter(const GptConfig& m) {
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (physical <= 0) return;
  const auto [largest, largest_elements] = largest_parameter(m);
  const double largest_bytes = 4 * largest_elements;
  SW_CHECK(largest_bytes <= physical, "parameter {} needs {} in f32; this machine has {} of memory (--hidden {}, --vocab {})",
           largest, gib(largest_bytes), gib(physical), m.hidden, m.vocab);
}

// The option that sets the model's vocabulary: --vocab, or for an --init-from model --resize-vocab.
const char* vocab_option(const TrainConfig& c) { return c.init_vocab > 0 ? "--resize-vocab" : "--vocab"; }

// --tokenizer, --documents, --eos-id and --no-cross-document-attention against each other and the
// model; fills the eos id from the tokenizer.
void check_text_options(TrainConfig& c) {
  if (!c.data.tokenizer.empty()) {
    SW_CHECK(!c.data.files.empty(), "--tokenizer {} reads --data as raw text: give --data text.txt (the embedded addition "
             "task has its own byte tokens)", c.data.tokenizer);
    SW_CHECK(c.data.format == "auto", "--tokenizer reads --data as raw text; --data-format {} names a token file "
             "format: leave it out, or drop --tokenizer to read token files", c.data.format);
    const Tokenizer t(c.data.tokenizer);
    SW_CHECK(t.vocab_size() <= c.model.vocab, "--tokenizer {} has a vocabulary of {} ids; the model's {} {} must hold "
             "it (use {} {} or more)", c.data.tokenizer, t.vocab_size(), vocab_option(c), c.model.vocab, vocab_option(c),
             t.vocab_size());
    SW_CHECK(c.data.eos_id < 0 || c.data.eos_id == t.eos_id(),
             "--eos-id {} contradicts --tokenizer {}, which ends documents with its eos id {}: leave --eos-id out",
             c.data.eos_id, c.data.tokenizer, t.eos_id());
    c.data.eos_id = t.eos_id();
    parse_document_split(c.data.documents);
  } else {
    SW_CHECK(c.data.documents == "file" && c.data.document_separator.empty(),
             "--documents and --document-separator cut raw text for --tokenizer; without one --data holds tokens "
             "(their end-of-text ids mark documents: --eos-id)");
  }
  SW_CHECK(c.data.eos_id >= -1 && c.data.eos_id < c.model.vocab, "--eos-id {} is outside the vocabulary of {} ids (--vocab)",
           c.data.eos_id, c.model.vocab);
  if (c.data.document_attention) {
    SW_CHECK(!c.data.files.empty(),
             "--no-cross-document-attention needs --data: the embedded addition task has no documents");
    SW_CHECK(c.data.eos_id >= 0, "--no-cross-document-attention needs an end-of-text id to find documents: --eos-id N, "
             "or a --tokenizer whose model defines eos");
  }
}

// The tokens each reader tokenized --tokenizer's text into (null without a tokenizer): every reader
// must hold the same (compared by Trainer::open_data).
nlohmann::json tokenized_files(const TrainConfig& c) {
  const std::optional<TextTokens> text = c.data.text_tokens();
  if (!text) return nullptr;
  nlohmann::json mine = nlohmann::json::array();
  for (const std::string& spec : {c.data.files, c.data.val_data}) {
    if (spec.empty()) continue;
    for (const std::string& path : data_files(spec)) {
      auto t = tokenize_file_cached(text->tokenizer, path, text->documents);
      mine.push_back({{"file", path}, {"tokens", t->tokens.size()}, {"xxh64", t->digest}});
    }
  }
  return mine;
}

// What the run reads, to refuse a resume on other data: the file's size and the xxh64 of its first
// and last MiB (its path only for the message), or the embedded task's digits and sequence length.
// Several files (a list or a glob): the sorted file names (without their folder) and sizes.
nlohmann::json file_fingerprint(const TrainConfig& c) {
  if (c.data.files.empty()) return {{"kind", "addition"}, {"digits", c.data.digits}, {"seq", c.model.seq}};
  check_data_readable(c.data.files);
  if (const std::vector<std::string> files = data_files(c.data.files); files.size() > 1) {
    nlohmann::json list = nlohmann::json::array();
    for (const std::string& file : files) {
      std::error_code ec;
      const auto size = static_cast<int64_t>(std::filesystem::file_size(file, ec));
      SW_CHECK(!ec, "cannot read the data file '{}'", file);
      list.push_back({{"name", std::filesystem::path(file).filename().string()}, {"size", size}});
    }
    return {{"kind", "files"}, {"path", c.data.files}, {"files", list}};
  }
  const ckpt::FileSample f = ckpt::sample_file(data_files(c.data.files).front());
  return {{"kind", "file"}, {"path", c.data.files}, {"size", f.size}, {"head_xxh64", f.head_xxh64},
          {"tail_xxh64", f.tail_xxh64}};
}

}  // namespace

nlohmann::json data_fingerprint(const TrainConfig& c) {
  nlohmann::json f = file_fingerprint(c);
  // --val-fraction holds out the corpus' tail: another fraction trains on other windows. (Absent
  // without one, so checkpoints from before it still match.)
  if (c.data.val_fraction != 0) f["val_fraction"] = c.data.val_fraction;
  // Text read through a tokenizer is other tokens than its bytes (absent without --tokenizer).
  if (const auto text = c.data.text_tokens()) f["tokenizer"] = tokenizer_fingerprint(text->tokenizer, text->documents);
  return f;
}

std::optional<TextTokens> DataConfig::text_tokens() const {
  if (tokenizer.empty()) return std::nullopt;
  // check() has set eos_id to the tokenizer's (-1 when its model defines none: no eos between documents).
  TextTokens t{tokenizer, {parse_document_split(documents), document_separator, eos_id >= 0}};
  return t;
}

void OptimizerConfig::resolve_batch(int64_t ranks, const std::string& ways) {
  int unknown = (micro_batch == 0) + (accumulation == 0) + (global_batch == 0);
  SW_CHECK(micro_batch >= 0 && accumulation >= 0 && global_batch >= 0,
           "batch sizes must not be negative (micro-batch {}, accumulation {}, global batch {})", micro_batch,
           accumulation, global_batch);
  if (unknown == 3) micro_batch = 8, accumulation = 1, unknown = 1;
  if (unknown == 2) {
    if (accumulation == 0) accumulation = 1;
    else micro_batch = 8;
    unknown = (micro_batch == 0) + (accumulation == 0) + (global_batch == 0);
  }
  if (global_batch == 0) global_batch = micro_batch * accumulation * ranks;
  if (accumulation == 0) {
    SW_CHECK(global_batch % (micro_batch * ranks) == 0,
             "global batch {} is not a multiple of micro-batch {} x {} {}: no whole number of accumulation steps",
             global_batch, micro_batch, ways, ranks);
    accumulation = global_batch / (micro_batch * ranks);
  }
  if (micro_batch == 0) {
    SW_CHECK(global_batch % (accumulation * ranks) == 0,
             "global batch {} does not divide into {} accumulation steps x {} {}", global_batch, accumulation, ways,
             ranks);
    micro_batch = global_batch / (accumulation * ranks);
  }
  SW_CHECK(micro_batch * accumulation * ranks == global_batch,
           "global batch {} must equal micro-batch {} x accumulation {} x {} {} (= {})", global_batch, micro_batch,
           accumulation, ways, ranks, micro_batch * accumulation * ranks);
  SW_CHECK(micro_batch >= 1 && accumulation >= 1, "micro-batch and accumulation must be at least 1");
}

void TrainConfig::check(int64_t ranks, bool open_data) {
  Strategy s = Strategy::from_mesh(mesh::parse_mesh(parallel.mesh), parallel.sequence_parallel);
  SW_CHECK(s.mesh.size() == ranks, "mesh {} has {} but {} run (use --ranks {} or mpirun -np {})",
           s.mesh.to_string(), counted(s.mesh.size(), "rank"), counted(ranks, "rank"), s.mesh.size(), s.mesh.size());
  if (model.seq == 0) model.seq = data.files.empty() ? AdditionTask::max_length(data.digits) - 1 : kDefaultFileSeq;
  model.validate();
  check_context_parallel(s, model, data.document_attention);
  SW_CHECK(dropout >= 0 && dropout < 1, "dropout must be in [0, 1), got {}", dropout);
  SW_CHECK(model.heads % s.tp_size() == 0, "{} cannot be split over tp={} (each tp rank needs whole heads)",
           counted(model.heads, "head"), s.tp_size());
  SW_CHECK(optimizer.steps >= 1, "steps must be at least 1, got {}", optimizer.steps);
  SW_CHECK(optimizer.lr > 0 && optimizer.min_lr >= 0 && optimizer.min_lr <= optimizer.lr, "learning rates must satisfy 0 <= min_lr <= lr and lr > 0 (lr {}, min_lr {})",
           optimizer.lr, optimizer.min_lr);
  SW_CHECK(optimizer.warmup >= 0, "warm-up steps must not be negative, got {}", optimizer.warmup);
  check_text_options(*this);
  parallel.sharding.check();
  check_device_run(*this, s);
  check_bucket_options(parallel.overlap_grad_reduce, parallel.grad_bucket_mb);
  SW_CHECK(parallel.overlap_grad_reduce == "off" || !parallel.sharding.shards_params(),
           "--overlap-grad-reduce {} does not combine with --sharding-stage 3: stage 3 reduce-scatters each gradient "
           "in the graph as soon as its backward made it (the buckets serve stages 0-2); use --overlap-grad-reduce off",
           parallel.overlap_grad_reduce);
  // A pipeline's micro-batches, when no batch split is given: as many as pipeline ranks (torchtitan's
  // default), the fewest every schedule accepts (zbh1 needs at least pp, interleaved a multiple of pp)
  // and what keeps every rank busy in the steady phase; when the global batch divides into them.
  if (s.pp >= 0 && optimizer.accumulation == 0 && optimizer.micro_batch == 0 &&
      optimizer.global_batch % (s.mesh.dim_size(s.pp) * s.data_size()) == 0)
    optimizer.accumulation = s.mesh.dim_size(s.pp);
  optimizer.resolve_batch(s.data_size(), s.ep < 0 ? "dp" : "dp x ep");
  check_largest_parameter(model);
  pipeline::parse_schedule_kind(parallel.schedule);  // an unknown name is refused on any mesh
  SW_CHECK(s.pp >= 0 || (parallel.schedule == "1f1b" && parallel.virtual_stages == 1),
           "--schedule {} --virtual {} need a pipeline: mesh {} has no pp dim (add pp=N to --mesh, or leave "
           "--schedule and --virtual out)",
           parallel.schedule, parallel.virtual_stages, s.mesh.to_string());
  if (s.pp >= 0) {  // the schedule's and the stages' constraints, with their numbers
    const int pp = static_cast<int>(s.mesh.dim_size(s.pp));
    pipeline::make_schedule(pipeline::parse_schedule_kind(parallel.schedule), pp, static_cast<int>(optimizer.accumulation), parallel.virtual_stages);
    pipeline::split_layers(static_cast<int>(model.layers), pp * parallel.virtual_stages, parallel.virtual_stages);
  }
  if (open_data) check_vocabulary(*this, *open_training_data(*this), open_validation_data(*this).get());
}

void check_vocabulary(const TrainConfig& c, const Dataset& data, const EvenWindows* val) {
  SW_CHECK(data.vocab_needed() <= c.model.vocab, "{} needs a vocabulary of {} tokens, the model has {} ({}{})",
           data.describe(), data.vocab_needed(), c.model.vocab, vocab_option(c),
           c.init_vocab > 0 ? fmt::format(" {} grows an --init-from model's", data.vocab_needed()) : "");
  if (val) {
    SW_CHECK(val->vocab_needed() <= c.model.vocab,
             "--val-data {} needs a vocabulary of {} tokens, the model has {} (--vocab): validation text must use the "
             "training tokenizer",
             val->corpus().describe(), val->vocab_needed(), c.model.vocab);
  }
}

std::unique_ptr<Dataset> open_training_data(const TrainConfig& c) {
  CorpusPart part;
  if (c.data.val_fraction != 0) part = {CorpusPart::Side::Training, c.data.val_fraction};
  return raising(ErrorKind::Data, [&] {  // a file that cannot be read or tokenized: a data error
    const std::optional<TextTokens> text = c.data.text_tokens();
    return open_dataset(c.data.files, c.data.digits, c.model.seq, c.optimizer.seed, parse_token_format(c.data.format), part,
                        text ? &*text : nullptr);
  });
}

std::unique_ptr<EvenWindows> open_validation_data(const TrainConfig& c) {
  if (!c.data.has_validation()) return nullptr;
  SW_CHECK(c.data.val_data.empty() || c.data.val_fraction == 0,
           "--val-data '{}' and --val-fraction {} both name a validation set: give one of them", c.data.val_data,
           c.data.val_fraction);
  SW_CHECK(!c.data.files.empty(),
           "{} needs --data: the embedded addition task has its own held-out problems (--eval-every, --eval-samples)",
           c.data.val_data.empty() ? "--val-fraction" : "--val-data");
  SW_CHECK(c.data.val_fraction == 0 || (c.data.val_fraction > 0 && c.data.val_fraction < 1),
           "--val-fraction must be in (0, 1) (the share of --data's tokens held out), got {}", c.data.val_fraction);
  SW_CHECK(c.data.val_samples >= 1, "--val-samples must be at least 1, got {}", c.data.val_samples);
  return raising(ErrorKind::Data, [&]() -> std::unique_ptr<EvenWindows> {
    const TokenFormat format = parse_token_format(c.data.format);
    const std::optional<TextTokens> text_tokens = c.data.text_tokens();
    const TextTokens* text = text_tokens ? &*text_tokens : nullptr;
    if (c.data.val_data.empty()) {
      auto held_out = std::make_unique<TokenFile>(c.data.files, c.model.seq, c.optimizer.seed, format,
                                                  CorpusPart{CorpusPart::Side::HeldOut, c.data.val_fraction}, text);
      return std::make_unique<EvenWindows>(std::move(held_out), c.data.val_samples);
    }
    try {  // the file errors say --data: say which option named the file
      return std::make_unique<EvenWindows>(
          std::make_unique<TokenFile>(c.data.val_data, c.model.seq, c.optimizer.seed, format, CorpusPart{}, text), c.data.val_samples);
    } catch (const Error& e) {
      fail("--val-data: {}", e.what());
    }
  });
}

GptConfig kernel_model(const TrainConfig& c) {
  GptConfig model = c.model;
  model.param_dtype = c.bf16 ? DType::BF16 : DType::F32;
  model.dropout = c.dropout;
  model.dropout_seed = c.optimizer.seed;
  model.document_mask = c.data.document_attention;
  model.eos_id = c.data.eos_id;
  model.cp_order = Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), c.parallel.sequence_parallel).cp_size();
  return model;
}

PipelineConfig pipeline_config(const TrainConfig& c) {
  return PipelineConfig{c.parallel.schedule, c.parallel.virtual_stages, c.parallel.pipeline_release, false,
                        LoaderOptions{c.data.loader_sync, c.data.loader_prefetch},
                        c.parallel.sharding.stage == 2 || (c.parallel.overlap_grad_reduce != "off" && !c.parallel.sharding.shards_params()),
                        c.parallel.sharding.shards_optimizer(), c.parallel.sharding.shards_params(), c.parallel.sharding.prefetch_params,
                        c.device};
}

Trainer::Trainer(TrainConfig config, std::shared_ptr<comm::Communicator> world)
    : c_(std::move(config)), world_(std::move(world)), data_rank_(world_->rank()), adamw_(c_.optimizer.adamw) {
  c_.check(world_->size(), false);  // the data: open_data(), where it is read
  strategy_ = Strategy::from_mesh(mesh::parse_mesh(c_.parallel.mesh), c_.parallel.sequence_parallel);
  schedule_ = {c_.optimizer.lr, c_.optimizer.min_lr, c_.optimizer.warmup, c_.optimizer.steps};
  // The [S, S] causal mask only for a graph that reads it (unfused attention): the fused attention
  // masks by index, and at 8 K tokens the mask alone is 256 MiB.
  const GptConfig kernels = kernel_model(c_);
  const std::vector<std::string> constants = model_constant_names(kernels);
  const bool reads_mask = std::find(constants.begin(), constants.end(), "causal_mask") != constants.end();
  model_ = std::make_unique<StagedGpt>(kernels, strategy_, pipeline_config(c_),
                                       c_.optimizer.micro_batch * strategy_.data_size(), static_cast<int>(c_.optimizer.accumulation), c_.optimizer.seed,
                                       reads_mask ? causal_mask(c_.model.seq, strategy_.cp_size()) : Tensor(), world_);
  if (c_.parallel.sharding.shards_optimizer()) {  // each parameter's state over its data group (dense dp x ep, experts dp)
    StreamScope on_compute(model_->stream());  // on a device, its fresh moments are filled where the update reads them
    sharded_ = std::make_unique<ShardedOptimizer>(c_.parallel.sharding, model_->params(), model_->data_groups());
    partial_grads_ = model_->grads_partial();
  }
  if (c_.parallel.overlap_grad_reduce != "off" && model_->data_groups().any_shared()) {
    partial_grads_ = model_->grads_partial();
    BucketOptions o;
    o.bucket_bytes = static_cast<int64_t>(c_.parallel.grad_bucket_mb * (1 << 20));
    o.overlap = c_.parallel.overlap_grad_reduce == "on";
    const ShardPlan* plan = sharded_ && c_.parallel.sharding.stage >= 2 ? &sharded_->plan() : nullptr;
    buckets_ = std::make_unique<GradBuckets>(model_->data_groups(), plan, o);
    model_->set_grad_ready(partial_grads_, [this](size_t p, Tensor& sum) { buckets_->ready(p, sum); });
  }
  open_data();
}

void Trainer::open_data() {
  // The embedded addition task is no file: every rank holds it (evaluation reads its problems).
  const bool reads = c_.data.files.empty() || model_->reads_data();
  nlohmann::json mine = nullptr;
  if (reads) {
    try {
      data_ = open_training_data(c_);
      val_ = open_validation_data(c_);
      check_vocabulary(c_, *data_, val_.get());
      mine = {{"data", data_->describe()},
              {"validation", val_ ? val_->describe() : ""},
              {"val_size", val_ ? val_->size() : 0},
              {"fingerprint", train::data_fingerprint(c_)},
              {"tokens", tokenized_files(c_)}};
    } catch (const Error& e) {
      mine = {{"error", e.what()}};
    }
  }
  // Every rank learns what the readers found, and fails alike on an error (no rank is left waiting).
  const std::vector<nlohmann::json> all = comm::all_gather_object(*world_, mine);
  size_t f = all.size();  // the first reader
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].is_null()) continue;
    if (all[r].contains("error"))
      throw RankFailure(static_cast<int64_t>(r), all[r]["error"].get<std::string>(), ErrorKind::Data);
    if (f == all.size()) f = r;
  }
  SW_CHECK(f < all.size(), "no rank reads the data (mesh {})", strategy_.mesh.to_string());
  const nlohmann::json* first = &all[f];
  // Under MPI every reader tokenizes the text itself: all must hold the same tokens.
  for (size_t r = 0; r < all.size(); ++r) {
    SW_CHECK(all[r].is_null() || all[r]["tokens"] == (*first)["tokens"],
             "--tokenizer {}: rank {} tokenized --data into {}, rank {} into {}: every process must read the same "
             "text files and tokenizer model",
             c_.data.tokenizer, r, all[r]["tokens"].dump(), f, (*first)["tokens"].dump());
  }
  data_description_ = (*first)["data"].get<std::string>();
  validation_description_ = (*first)["validation"].get<std::string>();
  val_size_ = (*first)["val_size"].get<int64_t>();
  data_fingerprint_ = (*first)["fingerprint"];
}

const Dataset& Trainer::dataset() const {
  SW_CHECK(data_ != nullptr, "rank {} does not read the data (only the loader's readers open it)", world_->rank());
  return *data_;
}

Trainer::~Trainer() = default;

namespace {

void scale_grads(std::vector<Tensor>& grads, int64_t accumulation) {
  if (accumulation <= 1) return;  // the mean over the micro-batches
  train::scale_grads(grads, 1.0f / static_cast<float>(accumulation));
}

}  // namespace

std::vector<Tensor> Trainer::reduce_grads(std::vector<Tensor>& grads) {
  if (buckets_) {  // the sums over the micro-batches reduced (stage 2 into the ranges), then the mean
    std::vector<Tensor> owned = buckets_->finish(grads, partial_grads_);
    if (c_.parallel.sharding.stage >= 2) {
      model_->release_grads();
      scale_grads(owned, c_.optimizer.accumulation);
      return owned;
    }
    scale_grads(grads, c_.optimizer.accumulation);
    if (!sharded_) return std::move(grads);
    return sharded_->reduce(grads, std::vector<bool>(grads.size(), false));  // stage 1: its ranges
  }
  // Stage 2 reduces the sums first (the mean of the reduced sum, as the all-reduced path computes it).
  if (!sharded_ || c_.parallel.sharding.stage < 2) scale_grads(grads, c_.optimizer.accumulation);
  if (!sharded_) return std::move(grads);
  std::vector<Tensor> owned = sharded_->reduce(grads, partial_grads_);
  if (c_.parallel.sharding.stage >= 2) {
    model_->release_grads();
    scale_grads(owned, c_.optimizer.accumulation);
  }
  return owned;
}

StepResult Trainer::step() {
  StagedGpt::Result fb = model_->forward_backward(data_.get(), consumed_);
  StreamScope on_compute(model_->stream());  // on a device, the update's kernels follow the step's
  std::vector<Tensor>& grads = fb.grads;
  grads = reduce_grads(grads);
  last_grad_bytes_ = 0;
  for (int s : model_->runner().local_stages())
    for (const Tensor& g : model_->runner().grads(s)) last_grad_bytes_ += g.defined() ? static_cast<int64_t>(g.nbytes()) : 0;
  StepResult r;
  r.loss = fb.loss / static_cast<double>(c_.optimizer.accumulation);
  r.grad_norm = model_->grad_norm(grads, sharded_ != nullptr);
  double waits[2] = {fb.loader_wait_s, fb.loader_read_s};
  world_->all_reduce(waits, waits, 2, DType::F64, comm::Reduce::Max);
  r.loader_wait_s = waits[0], r.loader_read_s = waits[1];
  r.lr = schedule_.at(step_);
  for (const MoeLayerSums& m : fb.moe) {
    MoeStepStats s;
    s.layer = m.layer;
    s.tokens_min = *std::min_element(m.expert_tokens.begin(), m.expert_tokens.end());
    s.tokens_max = *std::max_element(m.expert_tokens.begin(), m.expert_tokens.end());
    for (double t : m.expert_tokens) s.tokens_mean += t / static_cast<double>(m.expert_tokens.size());
    s.dropped = static_cast<int64_t>(m.dropped);
    s.aux_loss = m.aux_loss / static_cast<double>(c_.optimizer.accumulation);
    s.z_loss = m.z_loss / static_cast<double>(c_.optimizer.accumulation);
    r.moe.push_back(s);
  }
  // Every rank holds the same loss and global norm, so every rank takes the same branch.
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    SW_CHECK(c_.optimizer.skip_nonfinite,
             "step {}: the {} is not finite ({}; gradient norm {}) at learning rate {:.3g}{}; the parameters were "
             "not updated: resume from the last checkpoint with a lower --lr{}, or pass --skip-nonfinite-steps to "
             "skip such steps",
             step_ + 1, std::isfinite(r.loss) ? "gradient norm" : "loss", r.loss, r.grad_norm, r.lr,
             c_.optimizer.clip > 0 ? "" : " and no gradient clipping (--clip 0)", c_.optimizer.clip > 0 ? "" : " or --clip 1");
    r.skipped = true;
    ++skipped_;
  } else {
    runtime::ProfileScope profiled(runtime::EventKind::Optimizer, "adamw");  // --profile; else nothing
    clip_grad_norm(grads, r.grad_norm, c_.optimizer.clip);
    const int64_t t = step_ - optimizer_from_ + 1;  // AdamW's step (bias correction)
    if (sharded_) sharded_->step(adamw_, model_->params(), grads, r.lr, t);
    else adamw_.step(model_->params(), grads, r.lr, t);
  }
  // The gradients go now unless a test asked for them: kept, the next step's forward would hold
  // them beside its activations (473 MiB of 124 M parameters).
  if (keep_grads_) last_grads_ = std::move(grads);
  else last_grads_.clear();
  model_->release_grads();
  ++step_;
  consumed_ += c_.optimizer.global_batch;
  r.step = step_;
  r.tokens = c_.optimizer.global_batch * c_.model.seq;
  return r;
}

EvalResult Trainer::evaluate() {
  const auto* task = dynamic_cast<const AdditionTask*>(data_.get());
  SW_CHECK(task != nullptr, "evaluation needs the embedded addition task; {} has no held-out answers",
           data_->describe());
  return model_->evaluate(*task, c_.data.eval_samples);
}

ValidationResult Trainer::validate() {
  if (fed_batches(c_.model)) return ValidationResult{model_->fed_loss(), c_.optimizer.global_batch};
  SW_CHECK(has_validation(), "validation needs --val-data or --val-fraction (with --data)");
  return ValidationResult{model_->validation_loss(val_.get(), val_size_), val_size_};
}

int64_t Trainer::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const ParamState& p : model_->params()) {
    bytes += static_cast<int64_t>(p.exp_avg.nbytes() + p.exp_avg_sq.nbytes());
    if (has_own_master(p)) bytes += static_cast<int64_t>(p.master.nbytes());
  }
  return bytes;
}

HeldBytes Trainer::held_bytes() const {
  HeldBytes h;
  for (const ParamState& p : model_->params()) h.params += static_cast<int64_t>(p.param.nbytes());
  for (const ParamState& p : model_->frozen()) h.params += static_cast<int64_t>(p.param.nbytes());
  h.grads = last_grad_bytes_;
  h.optimizer = optimizer_state_bytes();
  h.activations = model_->last_stats().peak_activation_bytes;
  h.gathered = model_->last_stats().peak_gathered_bytes;
  return h;
}

Tensor Trainer::gather_state(const std::string& name, Tensor ParamState::*field) {
  StreamScope on_compute(model_->stream());  // a device run's gathers follow the last update's kernels
  std::vector<ParamState>& params = model_->params();
  auto it = std::find_if(params.begin(), params.end(), [&](const ParamState& p) { return p.name == name; });
  std::vector<Tensor> blocks(params.size());
  if (it != params.end()) {
    const size_t i = static_cast<size_t>(it - params.begin());
    if (!sharded_) blocks[i] = (*it).*field;
    else if (field == &ParamState::master && it->param.dtype() == DType::F32) blocks[i] = it->param;
    else blocks[i] = sharded_->whole(i, (*it).*field, it->param.shape());
  }
  // A name no rank trains (a frozen parameter) is gathered without blocks.
  int64_t trained = it != params.end() ? 1 : 0;
  world_->all_reduce(&trained, &trained, 1, DType::I64, comm::Reduce::Max);
  return trained ? model_->gather_param(name, &blocks) : model_->gather_param(name);
}

Tensor Trainer::gather_grad(const std::string& name) {
  StreamScope on_compute(model_->stream());  // a device run's gathers follow the step's kernels
  SW_CHECK(keep_grads_ && step_ > 0,
           "gather_grad('{}'): no gradients kept; call keep_gradients(true) before the step", name);
  if (!sharded_) return model_->gather_param(name, &last_grads_);
  std::vector<ParamState>& params = model_->params();
  std::vector<Tensor> blocks(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) blocks[i] = sharded_->whole(i, last_grads_[i], params[i].param.shape());
  }
  return model_->gather_param(name, &blocks);
}

ParameterCounts Trainer::count_parameters() {
  nlohmann::json mine = {{"trained", nlohmann::json::object()}, {"frozen", nlohmann::json::object()}};
  for (const ParamState& p : model_->params()) mine["trained"][p.name] = p.shape.numel();
  for (const ParamState& p : model_->frozen()) mine["frozen"][p.name] = p.shape.numel();
  std::map<std::string, int64_t> trained, frozen;  // with pp a rank holds only its stages' parameters
  for (const nlohmann::json& rank : comm::all_gather_object(*world_, mine)) {
    for (const auto& [name, n] : rank["trained"].items()) trained[name] = n.get<int64_t>();
    for (const auto& [name, n] : rank["frozen"].items()) frozen[name] = n.get<int64_t>();
  }
  ParameterCounts out;
  for (const auto& [name, n] : trained) out.trained += n;
  for (const auto& [name, n] : frozen) out.frozen += n;
  out.optimizer_bytes = optimizer_state_bytes();
  world_->all_reduce(&out.optimizer_bytes, &out.optimizer_bytes, 1, DType::I64, comm::Reduce::Sum);
  return out;
}

void Trainer::move_state(Device device) {
  if (c_.device.is_host()) return;
  for (ParamState& p : model_->params()) move_param_state(p, device);
  for (ParamState& p : model_->frozen()) move_param_state(p, device);
}

void Trainer::restore_position(int64_t step, int64_t consumed, int64_t optimizer_steps) {
  SW_CHECK(step >= 0 && consumed >= 0, "a checkpoint's step {} and consumed samples {} must not be negative", step,
           consumed);
  if (optimizer_steps < 0) optimizer_steps = step;
  SW_CHECK(optimizer_steps <= step, "a checkpoint's optimizer steps {} must not exceed its step {}", optimizer_steps,
           step);
  step_ = step;
  consumed_ = consumed;
  optimizer_from_ = step - optimizer_steps;
}

}  // namespace shardwise::train
