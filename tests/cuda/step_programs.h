#pragma once
// The programs the CUDA coverage tests walk (test_cuda_coverage.cc): the GPT-2, Llama and Mixtral
// training steps (forward and backward, dp=1 and tp=2: tp's programs use the vocab-parallel head)
// and generation's prefill and decode step, each with f32 parameters and with bf16 parameters (what
// `train --bf16` builds: parameters stored bf16, cast to f32 for the kernels, fp32 masters kept by
// the optimizer outside the graph), and the training steps of `--compute bf16` (GEMM and attention
// operands cast to bf16).
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shardwise/graph/autodiff.h"
#include "shardwise/models/models.h"

namespace shardwise::cuda_test {

inline train::GptConfig tiny_model(const std::string& type, DType param_dtype) {
  train::GptConfig c;
  c.layers = 2, c.heads = 4, c.hidden = 32, c.seq = 8, c.vocab = 128;
  c.param_dtype = param_dtype;
  if (type == "gpt2") return c;
  c.model_type = "llama";
  c.kv_heads = 2, c.intermediate_size = 64, c.tie_word_embeddings = false;
  if (type == "mixtral") c.experts = 4, c.top_k = 2, c.aux_loss = 0.01, c.router_z_loss = 0.001;
  return c;
}

struct StepProgram {
  std::string name;  // "llama bf16 tp=2 train"
  graph::Graph g;
};

inline std::vector<StepProgram> step_programs() {
  std::vector<StepProgram> out;
  for (const std::string type : {"gpt2", "llama", "mixtral"}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      const train::GptConfig c = tiny_model(type, dtype);
      for (const char* mesh : {"dp=1", "tp=2"}) {
        const mesh::Strategy s = mesh::Strategy::from_mesh(mesh::parse_mesh(mesh), false);
        const std::string name = type + " " + std::string(dtype_name(dtype)) + " " + mesh;
        train::GptGraph gpt = train::build_model(c, s, 2);
        graph::append_backward(gpt.g, gpt.loss);
        out.push_back({name + " train", std::move(gpt.g)});
        out.push_back({name + " prefill", train::build_model_prefill(c, s, 2, c.seq).g});
        out.push_back({name + " decode", train::build_model_decode_step(c, s, 2, c.seq).g});
        train::GptConfig compute = c;
        compute.compute_dtype = DType::BF16;
        train::GptGraph b = train::build_model(compute, s, 2);
        graph::append_backward(b.g, b.loss);
        out.push_back({name + " compute-bf16 train", std::move(b.g)});
      }
    }
  }
  return out;
}

// `missing` (one line each) equals the checked-in list tests/cuda/<file> (its lines but comments).
inline void expect_checked_in_list(const std::string& missing, const std::string& file) {
  std::ifstream in(std::string(SHARDWISE_SOURCE_DIR "/tests/cuda/") + file);
  ASSERT_TRUE(in) << "tests/cuda/" << file << " is missing";
  std::stringstream expected;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') expected << line << "\n";
  }
  EXPECT_EQ(missing, expected.str()) << "the list changed: update tests/cuda/" << file << " to the list above";
}

}  // namespace shardwise::cuda_test
