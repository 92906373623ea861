// Packing with document boundaries (--no-cross-document-attention): the position ids and masks the
// batches carry, and the loss of windows holding several documents against an independent reference
// that runs every document alone (reference_gpt.h, reference_llama.h: a double-precision forward
// with plain causal attention and positions from 0), GPT-2 and Llama, on one rank and on
// dp=2 x tp=2, pp=2 and tp=2 + sp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/reference_gpt.h"
#include "tests/support/reference_llama.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/data/packing.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kEos = 1;

TEST(Packing, PositionsRestartAndAttentionStaysWithinEachDocument) {
  Tensor ids(DType::I64, Shape{2, 6});
  const std::vector<int64_t> rows = {5, kEos, 7, 8, kEos, 9,  // a document's end, one whole, a beginning
                                     3, 4, 5, 6, 7, 8};       // no eos: one document, causal
  std::copy(rows.begin(), rows.end(), ids.data<int64_t>());
  DocumentInputs d = document_inputs(ids, kEos);
  ASSERT_EQ(d.position_ids.shape(), (Shape{2, 6}));
  ASSERT_EQ(d.attention_mask.shape(), (Shape{2, 1, 6, 6}));
  ASSERT_EQ(d.document_ids.shape(), (Shape{2, 6}));
  EXPECT_FALSE(document_inputs(ids, 3, false).attention_mask.defined());
  const std::vector<int64_t> positions = {0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5};
  for (size_t i = 0; i < positions.size(); ++i) EXPECT_EQ(d.position_ids.data<int64_t>()[i], positions[i]) << i;
  // The document ids (fused attention) number the same documents: an eos ends its own.
  const std::vector<int64_t> documents = {0, 0, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < documents.size(); ++i) EXPECT_EQ(d.document_ids.data<int64_t>()[i], documents[i]) << i;
  // Row t of sequence 0 may see keys [first of t's document, t].
  const int64_t first[6] = {0, 0, 2, 2, 2, 5};
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t u = 0; u < 6; ++u) {
        const bool visible = u <= t && u >= (b == 0 ? first[t] : 0);
        EXPECT_EQ(d.attention_mask.data<float>()[(b * 6 + t) * 6 + u], visible ? 0.0f : -1e9f)
            << "sequence " << b << ", query " << t << ", key " << u;
      }
  EXPECT_THROW(document_inputs(ids, -1), Error);
}

// A uint16 corpus of documents of 2 to 11 tokens in [2, 64), each ended by kEos: a 17-token window
// holds two to six documents, usually cut at both ends.
fs::path documents_corpus(const std::string& name) {
  fs::path d = fs::temp_directory_path() / "shardwise-packing";
  fs::create_directories(d);
  fs::path p = d / (name + ".bin");
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint32_t state = 7;
  auto next = [&] { return state = state * 1103515245u + 12345u, state >> 16; };
  for (int doc = 0; doc < 400; ++doc) {
    const uint32_t length = 2 + next() % 10;
    for (uint32_t i = 0; i <= length; ++i) {
      const uint32_t t = i == length ? kEos : 2 + next() % 62;
      out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
    }
  }
  return p;
}

TrainConfig packed_config(const std::string& mesh, const fs::path& data) {
  TrainConfig c;
  c.model.layers = 2, c.model.heads = 4, c.model.hidden = 32, c.model.seq = 16, c.model.vocab = 64;
  c.parallel.mesh = mesh;
  c.optimizer.steps = 4;
  c.optimizer.global_batch = 4;
  c.optimizer.lr = 1e-2, c.optimizer.min_lr = 1e-3, c.optimizer.warmup = 1;
  c.data.files = data.string();
  c.data.eos_id = kEos;
  c.data.document_attention = true;
  return c;
}

// The reference loss of one sequence alone, by the model's architecture.
double sequence_loss(const std::vector<int64_t>& tokens, const reference::Params& p, const GptConfig& c) {
  return c.is_llama() ? reference::llama_sequence_loss(tokens, p, c) : reference::sequence_loss(tokens, p, c);
}

// The reference sum over one window: each document alone (cut where an input is kEos), positions
// from 0, its inputs' next tokens as labels (the eos predicts the token after it from its own
// document, as in the packed window).
double documents_alone(const std::vector<int64_t>& window, const reference::Params& p, const GptConfig& c) {
  const size_t S = window.size() - 1;
  double total = 0;
  for (size_t begin = 0; begin < S;) {
    size_t end = begin;  // inputs [begin, end] form the document
    while (end + 1 < S && window[end] != kEos) ++end;
    total += sequence_loss(std::vector<int64_t>(window.begin() + static_cast<std::ptrdiff_t>(begin),
                                                           window.begin() + static_cast<std::ptrdiff_t>(end) + 2),
                                      p, c);
    begin = end + 1;
  }
  return total;
}

struct StepLoss {
  double loss = 0;              // the trainer's loss of the step
  double alone = 0, whole = 0;  // the references: documents alone, and whole windows (causal)
};

// The fourth step's loss (three steps first move the weights away from their near-uniform start)
// and the references of its samples with the weights it starts from.
StepLoss fourth_step(const TrainConfig& c) {
  StepLoss out;
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int s = 0; s < 3; ++s) t.step();
    const int64_t first = t.consumed_samples();
    const reference::Params p = reference::whole_params(t);
    const double loss = t.step().loss;
    if (w.rank() != 0) return;
    out.loss = loss;
    std::vector<int64_t> window(static_cast<size_t>(c.model.seq + 1));
    for (int64_t i = first; i < first + c.optimizer.global_batch; ++i) {
      t.dataset().sample(i, window);
      out.alone += documents_alone(window, p, c.model);
      out.whole += sequence_loss(window, p, c.model);
    }
    const auto tokens = static_cast<double>(c.optimizer.global_batch * c.model.seq);
    out.alone /= tokens, out.whole /= tokens;
  });
  return out;
}

// The fourth step's loss equals the documents-alone reference on one rank, dp=2 x tp=2, pp=2,
// tp=2 + sp, cp=4 and tp=2 x cp=2 + sp (`llama`: a small Llama, else GPT-2).
void expect_documents_alone_on_every_mesh(const std::string& corpus, bool llama) {
  const fs::path data = documents_corpus(corpus);
  struct Case {
    std::string mesh;
    bool sp = false;
    int64_t accumulation = 0;
  };
  // cp: the window's columns in cp's balanced order, document ids and positions reordered with them.
  for (const Case& k : {Case{"dp=1"}, Case{"dp=2,tp=2"}, Case{"pp=2", false, 2}, Case{"tp=2", true}, Case{"cp=4"},
                        Case{"tp=2,cp=2", true}}) {
    TrainConfig c = packed_config(k.mesh, data);
    if (llama) {  // grouped-query attention (kv heads sharded over tp), an untied head
      c.model.model_type = "llama", c.model.kv_heads = 2, c.model.intermediate_size = 48;
      c.model.tie_word_embeddings = false;
      c.model.init_std = 0.1;  // no scaled residual projections: larger weights make attention matter sooner
    }
    c.parallel.sequence_parallel = k.sp, c.optimizer.accumulation = k.accumulation;
    const StepLoss r = fourth_step(c);
    const std::string what = k.mesh + (k.sp ? " + sp" : "");
    EXPECT_NEAR(r.loss, r.alone, 1e-5) << what;
    // The test tells the two apart: attending across documents gives another loss.
    EXPECT_GT(std::abs(r.whole - r.alone), 1e-3) << what;
  }
}

TEST(Packing, AWindowOfDocumentsLosesWhatEachDocumentLosesAlone) { expect_documents_alone_on_every_mesh("alone", false); }

// Llama: every layer's rotary embedding reads the per-sequence position ids [B, S] (restarting at
// each document, as transformers' position_ids) and the attention the documents' mask. (Rotary
// scores depend on position differences only, so it is the mask that tells the references apart.)
TEST(Packing, LlamaWindowOfDocumentsLosesWhatEachDocumentLosesAlone) {
  expect_documents_alone_on_every_mesh("llama-alone", true);
}

// Without the flag the same windows train as before: the reference of whole windows.
TEST(Packing, WithoutTheFlagWindowsAttendAcrossDocuments) {
  TrainConfig c = packed_config("dp=1", documents_corpus("across"));
  c.data.document_attention = false;
  const StepLoss r = fourth_step(c);
  EXPECT_NEAR(r.loss, r.whole, 1e-5);
}

// An eos id that never occurs: one document per window, the same training as without the flag.
TEST(Packing, WindowsWithoutAnEosTrainAsWithoutTheFlag) {
  auto losses = [](TrainConfig c) {
    std::vector<double> out;
    comm::LocalWorld::run(2, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      for (int s = 0; s < 3; ++s) {
        const double loss = t.step().loss;
        if (w.rank() == 0) out.push_back(loss);
      }
    });
    return out;
  };
  TrainConfig c = packed_config("dp=2", documents_corpus("no-eos"));
  c.data.eos_id = 0;  // no token of the corpus (its tokens are 1 and 2..63)
  TrainConfig plain = c;
  plain.data.document_attention = false;
  const std::vector<double> packed = losses(c), causal = losses(plain);
  ASSERT_EQ(packed.size(), 3u);
  for (size_t i = 0; i < packed.size(); ++i) EXPECT_NEAR(packed[i], causal[i], 1e-6) << "step " << i + 1;
}

// Validation windows (the forward-only runner, a padded last micro-batch) are packed alike.
TEST(Packing, ValidationLossIsTheDocumentsAloneToo) {
  TrainConfig c = packed_config("dp=2", documents_corpus("validation"));
  c.data.val_fraction = 0.2, c.data.val_samples = 5;
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    const double got = t.validate().loss;
    const reference::Params p = reference::whole_params(t);
    if (w.rank() != 0) return;
    const EvenWindows& val = *t.validation_data();
    std::vector<int64_t> window(static_cast<size_t>(c.model.seq + 1));
    double total = 0;
    for (int64_t k = 0; k < val.size(); ++k) {
      val.sample(k, window);
      total += documents_alone(window, p, c.model);
    }
    EXPECT_NEAR(got, total / static_cast<double>(val.size() * c.model.seq), 1e-5);
  });
}

TEST(Packing, TheFlagNeedsAnEosIdAndData) {
  TrainConfig c = packed_config("dp=1", documents_corpus("errors"));
  c.data.eos_id = -1;
  try {
    c.check(1);
    ADD_FAILURE() << "no eos id accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-cross-document-attention needs an end-of-text id"), std::string::npos)
        << e.what();
  }
  c.data.files.clear(), c.data.eos_id = kEos;
  try {
    c.check(1);
    ADD_FAILURE() << "the addition task accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the embedded addition task has no documents"), std::string::npos) << e.what();
  }
  c = packed_config("dp=1", documents_corpus("errors"));
  c.data.eos_id = 64;
  EXPECT_THROW(c.check(1), Error) << "an eos id outside the vocabulary";
}

}  // namespace
}  // namespace shardwise::train
