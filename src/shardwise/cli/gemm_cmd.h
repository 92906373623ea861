#pragma once
// `shardwise gemm-check` and `--gemm auto|<backend>` on train / generate: which library runs the f32
// GEMMs (tensor/gemm_backend.h), chosen by a correctness check against float64 (tensor/gemm_check.h)
// and a measurement on a training step's GEMM shapes, each candidate in a child process (a crash or
// an illegal instruction fails that candidate alone), the result cached per machine.
#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace shardwise::cli {

struct GemmCheckOptions {
  std::vector<std::string> candidates;  // empty: every backend
  bool quick = false;                   // correctness on small shapes only: no measurement, no cache
  std::string shape = "gpt2";           // the step measured: gpt2 (124 M, B4 T512) or small
  std::string probe;                    // internal: check one backend in this (child) process
  bool measure = false;                 // internal, with --probe
};
int cmd_gemm_check(const GemmCheckOptions& options, std::ostream& out);
CLI::App* add_gemm_check_command(CLI::App& app, GemmCheckOptions& options);

// Resolves `--gemm` (auto, or a backend name) before the first GEMM, loads the backend and returns
// the run header's line: the library, its core type and why it was chosen. auto honours the
// user's OPENBLAS_CORETYPE, then SHARDWISE_GEMM, then the choice `shardwise gemm-check` cached for
// this machine, else OpenBLAS's own pick, saying so (a run never starts the minutes-long measurement
// by itself).
std::string choose_gemm(const std::string& flag);

}  // namespace shardwise::cli
