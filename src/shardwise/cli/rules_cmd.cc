#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "shardwise/cli/commands.h"
#include "shardwise/cli/device_option.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"
#include "shardwise/verify/verifier.h"

namespace shardwise::cli {

int cmd_rules(const RulesOptions& options, std::ostream& out) {
  const auto& ops = ops::op_registry();
  // Column widths fit the longest op and rule names.
  size_t op_w = 14, rule_w = 26;
  for (const ops::OpDef* op : ops.all()) op_w = std::max(op_w, op->name.size());
  // Each rule once, in the order of the first op that holds it (ops sorted by family, then name).
  std::vector<const ops::OpDef*> holders;
  std::map<std::string, std::vector<std::string>> ops_of_rule;
  for (const ops::OpDef* op : ops.all()) {
    rule_w = std::max(rule_w, op->rule.name.size());
    std::vector<std::string>& names = ops_of_rule[op->rule.name];
    if (names.empty()) holders.push_back(op);
    names.push_back(op->name);
  }
  if (options.list_ops) {
    out << fmt::format("{:<{}} {:<12} {:<{}} {}\n", "op", op_w, "family", "rule", rule_w, "summary");
    for (const ops::OpDef* op : ops.all()) {
      out << fmt::format("{:<{}} {:<12} {:<{}} {}\n", op->name, op_w, op->family, op->rule.name, rule_w, op->summary);
    }
    return 0;
  }
  out << fmt::format("{} rules, {} ops\n", holders.size(), ops.size());
  for (const ops::OpDef* op : holders) {
    out << fmt::format("{:<{}} [{}] ops: {}\n    {}\n", op->rule.name, rule_w, op->family,
                       fmt::join(ops_of_rule[op->rule.name], ", "), op->rule.summary);
  }
  return 0;
}

int cmd_verify(const VerifyCliOptions& options, std::ostream& out) {
  verify::VerifyOptions vo;
  for (const auto& m : options.meshes) vo.meshes.push_back(mesh::parse_mesh(m));
  for (const auto& name : options.ops) ops::op_registry().get(name);  // an unknown op: an error before any work
  vo.device = use_device(options.device);
  vo.f64_as_f32 = options.device == "cuda";  // the CUDA kernels compute f32 and bf16
  verify::Report report = verify::verify_ops(options.ops, vo);
  std::string table = report.table();
  if (options.quiet) table = table.substr(table.rfind("total:"));
  out << table;
  return report.ok() ? 0 : 1;
}

}  // namespace shardwise::cli
