// Which ops of a training step have no CUDA kernel bound yet (cuda_ops/bind.h): the forward and
// gradient ops of the GPT-2, Llama and Mixtral training programs (f32 and bf16 parameters, --compute bf16, dp=1 and
// tp=2; step_programs.h) and of generation's prefill and decode step, against the CUDA table. A
// static listing (nothing runs on a GPU): it must equal tests/cuda/missing_cuda_kernels.txt, so the
// list shrinks only deliberately, as kernels are bound. Built only where CUDA is (test_cuda).
#include <gtest/gtest.h>

#include <iostream>
#include <set>
#include <string>

#include "shardwise/cuda_ops/bind.h"
#include "tests/cuda/step_programs.h"

namespace shardwise {
namespace {

// "forward <op>" and "backward <op>" for every node of `g`; "fill nonzero" for a Fill of another
// value than 0 (bound when the table has a fill: the CUDA one fills any value).
void add_ops(const graph::Graph& g, std::set<std::string>& used) {
  for (const graph::Node& n : g.nodes()) {
    if (n.kind == graph::NodeKind::Forward) used.insert("forward " + n.op);
    if (n.kind == graph::NodeKind::Backward) used.insert("backward " + n.op);
    if (n.kind == graph::NodeKind::Fill && n.attrs.get_float("value", 0.0) != 0.0) used.insert("fill nonzero");
  }
}

std::set<std::string> step_ops() {
  std::set<std::string> used;
  for (const cuda_test::StepProgram& p : cuda_test::step_programs()) add_ops(p.g, used);
  return used;
}

TEST(CudaCoverage, MissingKernelsOfTheTrainingAndGenerationStepsAreTheCheckedInList) {
  const auto table = cuda_ops::cuda_kernel_table();
  std::set<std::string> bound;
  for (const std::string& op : table->forward_ops()) bound.insert("forward " + op);
  for (const std::string& op : table->backward_ops()) bound.insert("backward " + op);
  if (table->fill() != nullptr) bound.insert("fill nonzero");  // the table's fill takes any value
  std::string missing;
  for (const std::string& op : step_ops()) {
    if (!bound.contains(op)) missing += op + "\n";
  }
  std::cout << "ops of the steps without a CUDA kernel:\n" << missing;
  cuda_test::expect_checked_in_list(missing, "missing_cuda_kernels.txt");
}

TEST(CudaCoverage, EveryBoundKernelIsAnOpOfTheRegistry) {
  const auto table = cuda_ops::cuda_kernel_table();
  for (const std::string& op : table->forward_ops()) EXPECT_NE(ops::op_registry().find(op), nullptr) << op;
  for (const std::string& op : table->backward_ops()) EXPECT_NE(ops::op_registry().find(op), nullptr) << op;
}

}  // namespace
}  // namespace shardwise
