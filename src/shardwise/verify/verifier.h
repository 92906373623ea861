#pragma once
// The numerical verifier: proves each SPMD rule right by running the op on simulated ranks.
//
// For each op, each mesh and each verification case, every combination of input placements is
// enumerated (each mesh dim: Replicate, Shard(every dim), Partial(sum|avg|max|min)). For each:
//  1. the rule is asked for the required input and the claimed output distributions;
//  2. random global inputs are cut into the required shards; a Partial input is split into
//     unequal random parts that reduce to the global value;
//  3. the op's kernel runs on every simulated rank;
//  4. the global output is rebuilt from the claimed distributions (shards pasted, partials
//     reduced, replicas checked to be identical) and compared with the single-device kernel.
// The gradient rule is checked the same way against the single-device gradient kernel, and the
// reverse rule by running the op on the layout it returns.
#include <cstdint>
#include <string>
#include <vector>

#include "shardwise/mesh/process_mesh.h"
#include "shardwise/ops/op.h"
#include "shardwise/tensor/device.h"

namespace shardwise::verify {

struct VerifyOptions {
  std::vector<mesh::ProcessMesh> meshes;  // empty: [2], [3], [2,2], [2,3]
  bool forward = true;
  bool grad = true;
  bool reverse = true;
  // Forward checks take every combination of input placements up to max_forward_combinations
  // per case; gradient checks enumerate (inputs x output grads) and reverse checks the outputs'
  // placements up to max_combinations. Above a cap, an evenly spaced deterministic subset.
  int64_t max_forward_combinations = 200000;
  int64_t max_combinations = 20000;
  uint64_t seed = 20261122;
  int max_failures_per_op = 5;  // stop recording (not checking) after this many
  // Where the ranks' local kernels run: the host, or a device whose kernel table is installed
  // (ops/device_kernels.h). On a device each rank's inputs are copied there (counted copies,
  // tensor/device_copy.h), the op runs through run_forward / run_backward on them (so the device
  // kind's kernel table is used: the CUDA bindings on CUDA) and the outputs are copied back and
  // checked by the same rules; the reference stays the CPU kernel on one device, so on CUDA each
  // check is also a kernel-against-CPU check. A check whose kernel the device does not compute
  // (ops::UnsupportedOnDevice: no kernel, or an attribute or layout it refuses) is skipped:
  // counted in Coverage::skipped and Report::skips with the reason, never passed.
  Device device;
  // The cases' f64 tensors are made f32 (CUDA's kernels compute f32 and bf16), the reference too.
  bool f64_as_f32 = false;
};

struct Failure {
  std::string op, mesh, part;  // part: forward | grad | reverse
  std::string inputs;          // shapes, dtypes and given distributions
  std::string message;
};

struct Coverage {
  std::string op, mesh;
  int64_t forward = 0, grad = 0, reverse = 0;  // placement combinations whose rule answer was checked
  int64_t skipped = 0;  // combinations not checked: the device does not compute the op there
  int64_t device_runs = 0;  // local kernels run on the device (one per rank and distinct layout)
  int64_t layouts = 0;  // distinct (required inputs, claimed outputs) answers run on the simulated mesh
  bool even = false, uneven = false, empty_shards = false;
  int64_t failures = 0;
};

// Checks skipped on a device, by op, part and reason.
struct Skip {
  std::string op, part, reason;
  int64_t checks = 0;
};

struct Report {
  Device device;        // where the local kernels ran
  std::string kernels;  // on a device: the name of its kernel table ("cuda", "fake")
  std::vector<Coverage> rows;
  std::vector<Failure> failures;
  std::vector<Skip> skips;
  int64_t total_failures = 0;
  // The placement combinations checked (forward, grad, reverse), skipped, and checked without a
  // failure recorded (each failure is one check).
  int64_t checks() const;
  int64_t skipped() const;
  int64_t passes() const { return checks() - total_failures; }
  // op x mesh x cases checked, with even/uneven/empty columns; the summary line ("total: ...") and,
  // on a device, the checks run there and those skipped, by op with the reason.
  std::string table() const;
  bool ok() const { return total_failures == 0; }
};

std::vector<mesh::ProcessMesh> default_meshes();

// Verifies one op against its rule (a test shows a wrong rule caught by verifying a copy of an op
// that holds it).
Report verify_op(const ops::OpDef& op, const VerifyOptions& options = {});
// Verifies every registered op whose name is in `names` (all ops when empty).
Report verify_ops(const std::vector<std::string>& names, const VerifyOptions& options = {});

}  // namespace shardwise::verify
