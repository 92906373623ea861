#include "shardwise/train/vocab_resize.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "shardwise/ckpt/fp8.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/data/tokenizer.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise::train {
namespace {

nlohmann::json read_json_file(const ckpt::fs::path& path) {
  std::ifstream f(path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not a JSON file: {}", path.string(), e.what());
  }
}

// One more than the largest id a tokenizer file names (0: none).
int64_t ids_of_tokenizer_json(const nlohmann::json& j) {
  int64_t n = 0;
  const nlohmann::json& vocab = j.value("model", nlohmann::json::object()).value("vocab", nlohmann::json());
  if (vocab.is_object()) {  // BPE, WordLevel, WordPiece: {token: id}
    for (const auto& [token, id] : vocab.items()) n = std::max(n, id.get<int64_t>() + 1);
  } else if (vocab.is_array()) {  // Unigram: [[piece, score], ...], ids in order
    n = static_cast<int64_t>(vocab.size());
  }
  for (const nlohmann::json& t : j.value("added_tokens", nlohmann::json::array())) n = std::max(n, t.at("id").get<int64_t>() + 1);
  return n;
}

// The old rows' mean (f32, as transformers takes it) and the lower Cholesky factor of 1e-9 x their
// covariance (row-major [H, H], in double); no factor when a pivot is not above 0.
struct RowStats {
  std::vector<double> mean;
  std::vector<double> factor;  // empty: not positive definite
};

RowStats row_stats(const Tensor& old) {
  const int64_t V = old.shape()[0], H = old.shape()[1];
  const float* w = old.data<float>();
  std::vector<float> mean(static_cast<size_t>(H), 0.0f);
  for (int64_t j = 0; j < H; ++j) {
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += w[i * H + j];
    mean[static_cast<size_t>(j)] = static_cast<float>(s / static_cast<double>(V));
  }
  Tensor centered(DType::F32, old.shape());
  float* c = centered.data<float>();
  for (int64_t i = 0; i < V; ++i)
    for (int64_t j = 0; j < H; ++j) c[i * H + j] = w[i * H + j] - mean[static_cast<size_t>(j)];
  const Tensor cov = gemm(centered, centered, /*trans_a=*/true);  // [H, H] = C^T C
  RowStats out{std::vector<double>(mean.begin(), mean.end()), std::vector<double>(static_cast<size_t>(H * H), 0.0)};
  std::vector<double>& L = out.factor;
  const double scale = 1e-9 / static_cast<double>(V);
  for (int64_t j = 0; j < H; ++j) {
    const double* lj = &L[static_cast<size_t>(j * H)];
    double d = scale * cov.data<float>()[j * H + j];
    for (int64_t k = 0; k < j; ++k) d -= lj[k] * lj[k];
    if (!(d > 0)) return {out.mean, {}};
    L[static_cast<size_t>(j * H + j)] = std::sqrt(d);
    for (int64_t i = j + 1; i < H; ++i) {
      const double* li = &L[static_cast<size_t>(i * H)];
      double s = scale * cov.data<float>()[i * H + j];
      for (int64_t k = 0; k < j; ++k) s -= li[k] * lj[k];
      L[static_cast<size_t>(i * H + j)] = s / L[static_cast<size_t>(j * H + j)];
    }
  }
  return out;
}

}  // namespace

int64_t tokenizer_ids(const ckpt::fs::path& dir) {
  int64_t n = 0;
  if (ckpt::fs::is_regular_file(dir / "tokenizer.json")) n = ids_of_tokenizer_json(read_json_file(dir / "tokenizer.json"));
  if (ckpt::fs::is_regular_file(dir / "added_tokens.json")) {
    const nlohmann::json added = read_json_file(dir / "added_tokens.json");
    for (const auto& [token, id] : added.items()) {
      SW_CHECK(id.is_number_integer(), "'{}': token '{}' has id {}, not an integer", (dir / "added_tokens.json").string(),
               token, id.dump());
      n = std::max(n, id.get<int64_t>() + 1);
    }
  }
  if (ckpt::fs::is_regular_file(dir / "tokenizer_config.json")) {
    const nlohmann::json decoder =
        read_json_file(dir / "tokenizer_config.json").value("added_tokens_decoder", nlohmann::json::object());
    for (const auto& [id, token] : decoder.items())
      n = std::max(n, static_cast<int64_t>(std::stoll(id)) + 1);
  }
  if (ckpt::fs::is_regular_file(dir / "tokenizer.model")) n = std::max(n, Tokenizer((dir / "tokenizer.model").string()).vocab_size());
  return n;
}

Tensor mean_resized_rows(const Tensor& old, int64_t added, uint64_t seed, const std::string& name) {
  SW_CHECK(old.ndim() == 2 && old.dtype() == DType::F32, "mean_resized_rows: '{}' must be a 2-D f32 tensor, got {} {}",
           name, dtype_name(old.dtype()), old.shape().to_string());
  const int64_t H = old.shape()[1];
  const RowStats stats = row_stats(old);
  const Philox rng(seed, stream_id(name + "/resized"));
  Tensor out(DType::F32, Shape{added, H});
  float* o = out.data<float>();
  std::vector<double> z(static_cast<size_t>(H));
  for (int64_t k = 0; k < added; ++k) {
    for (int64_t j = 0; j < H; ++j) z[static_cast<size_t>(j)] = rng.normal(static_cast<uint64_t>(k * H + j));
    for (int64_t i = 0; i < H; ++i) {
      double v = stats.mean[static_cast<size_t>(i)];
      if (!stats.factor.empty()) {
        for (int64_t j = 0; j <= i; ++j) v += stats.factor[static_cast<size_t>(i * H + j)] * z[static_cast<size_t>(j)];
      }
      o[k * H + i] = static_cast<float>(v);
    }
  }
  return out;
}

std::vector<std::string> vocab_params(const GptConfig& model) {
  if (!model.is_llama()) return {"transformer.wte.weight"};
  if (model.tie_word_embeddings) return {"model.embed_tokens.weight"};
  return {"model.embed_tokens.weight", "lm_head.weight"};
}

namespace {

// The box [rows, cols] of `key` in `dir`'s weights (masters when present), as f32.
Tensor read_rows(const ckpt::fs::path& dir, const std::string& key, const reshard::Box& box) {
  const bool masters = ckpt::GroupReader::exists(dir, "master_weights");
  const ckpt::GroupReader reader(dir, masters ? "master_weights" : "model");
  SW_CHECK(reader.contains(key), "--init-from {}: its weights hold no '{}' to resize", dir.string(), key);
  Tensor t = ckpt::read_key_box(reader, key, box, ckpt::fp8_block_of(dir));
  return t.dtype() == DType::F32 ? t : t.to(DType::F32);
}

reshard::Box box2(int64_t row, int64_t col, int64_t rows, int64_t cols) {
  reshard::Box b;
  b.offset[0] = row, b.offset[1] = col;
  b.shape = Shape{rows, cols};
  return b;
}

}  // namespace

std::map<std::string, Tensor> added_vocab_rows(comm::Communicator& world, const ckpt::fs::path& dir,
                                               const GptConfig& saved, const GptConfig& grown, uint64_t seed) {
  std::map<std::string, Tensor> out;
  if (grown.vocab <= saved.vocab) return out;
  const int64_t added = grown.vocab - saved.vocab, H = saved.hidden;
  for (const std::string& name : vocab_params(grown)) {
    Tensor rows(DType::F32, Shape{added, H});
    if (world.rank() == 0) rows = mean_resized_rows(read_rows(dir, name, box2(0, 0, saved.vocab, H)), added, seed, name);
    world.broadcast(rows, 0);
    out.emplace(name, rows);
  }
  return out;
}

Tensor grown_block(const ckpt::fs::path& dir, const std::string& name, int64_t old_vocab, const Tensor& added,
                   std::span<const int64_t> offset, const Shape& block) {
  const int64_t r0 = offset[0], c0 = offset[1], rows = block[0], cols = block[1], H = added.shape()[1];
  Tensor out(DType::F32, block);
  float* o = out.data<float>();
  const int64_t old_rows = std::clamp<int64_t>(old_vocab - r0, 0, rows);
  if (old_rows > 0) {
    const Tensor t = read_rows(dir, name, box2(r0, c0, old_rows, cols));
    std::copy(t.data<float>(), t.data<float>() + t.numel(), o);
  }
  for (int64_t i = old_rows; i < rows; ++i) {
    const float* src = added.data<float>() + (r0 + i - old_vocab) * H + c0;
    std::copy(src, src + cols, o + i * cols);
  }
  return out;
}

}  // namespace shardwise::train
