#pragma once
// Growing an --init-from model's vocabulary for tokens added to its tokenizer (a chat format's
// `<|im_start|>`, ...), as transformers' `model.resize_token_embeddings(n)` does with its defaults
// (mean_resizing=True, pad_to_multiple_of=None): the old rows stay as they are, and the rows added at
// the end of the embedding (and of an untied head, from the head's own rows; a tied head is the
// embedding) are drawn from the multivariate normal with the old rows' mean and 1e-9 times their
// covariance (centred, divided by the number of rows), or are that mean where 1e-9 x covariance is
// not positive definite. The draw is shardwise's own: Philox keyed by (seed, "<name>/resized")
// at each added element, so a run is deterministic on any mesh (not transformers' torch draw).
#include <cstdint>
#include <map>
#include <string>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/comm/communicator.h"
#include "shardwise/models/gpt.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

// How many ids the tokenizer files of model directory `dir` produce: one more than the largest id of
// tokenizer.json (its model's vocab and its added_tokens), added_tokens.json, tokenizer_config.json's
// added_tokens_decoder and tokenizer.model's pieces; 0 when `dir` holds none of them. Error naming a
// file that is not what its name says.
int64_t tokenizer_ids(const ckpt::fs::path& dir);

// The `added` rows [added, H] that follow `old` [V, H] (f32): mean + L z, with L the Cholesky factor
// (in double) of 1e-9 x the covariance of old's rows (computed in f32 as transformers does) and z
// standard normals from Philox(seed, stream_id(name + "/resized")) at index k * H + j; each row the
// mean where that factor does not exist (a pivot not above 0).
Tensor mean_resized_rows(const Tensor& old, int64_t added, uint64_t seed, const std::string& name);

// The parameters a vocabulary resize grows: the embedding and, when untied, the head.
std::vector<std::string> vocab_params(const GptConfig& model);

// Collective over `world`. The added rows of each of vocab_params(`grown`) when `grown` has more
// tokens than `saved` (the model directory's config), drawn on world rank 0 from `dir`'s rows
// and broadcast; empty when the vocabulary does not grow.
std::map<std::string, Tensor> added_vocab_rows(comm::Communicator& world, const ckpt::fs::path& dir,
                                               const GptConfig& saved, const GptConfig& grown, uint64_t seed);

// The block [offset, offset + block) of the grown parameter `name`: its rows below the directory's
// vocabulary read from `dir` (only that box), the others from `added` (rows past the old vocabulary).
Tensor grown_block(const ckpt::fs::path& dir, const std::string& name, int64_t old_vocab, const Tensor& added,
                   std::span<const int64_t> offset, const Shape& block);

}  // namespace shardwise::train
