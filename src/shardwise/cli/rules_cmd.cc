#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "shardwise/cli/commands.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"
#include "shardwise/verify/verifier.h"

namespace shardwise::cli {

int cmd_rules(const RulesOptions& options, std::ostream& out) {
  const auto& ops = ops::op_registry();
  // Column widths fit the longest op and rule names.
  size_t op_w = 14, rule_w = 26;
  for (const ops::OpDef* op : ops.all()) op_w = std::max(op_w, op->name.size());
  for (const spmd::Rule* rule : spmd::rules().all()) rule_w = std::max(rule_w, rule->name.size());
  if (options.list_ops) {
    out << fmt::format("{:<{}} {:<12} {:<{}} {}\n", "op", op_w, "family", "rule", rule_w, "summary");
    for (const ops::OpDef* op : ops.all()) {
      out << fmt::format("{:<{}} {:<12} {:<{}} {}\n", op->name, op_w, op->family, op->rule, rule_w, op->summary);
    }
    return 0;
  }
  std::map<std::string, std::vector<std::string>> ops_of_rule;
  for (const ops::OpDef* op : ops.all()) ops_of_rule[op->rule].push_back(op->name);
  out << fmt::format("{} rules, {} ops\n", spmd::rules().size(), ops.size());
  for (const spmd::Rule* rule : spmd::rules().all()) {
    out << fmt::format("{:<{}} [{}] ops: {}\n    {}\n", rule->name, rule_w, rule->family,
                       fmt::join(ops_of_rule[rule->name], ", "), rule->summary);
  }
  return 0;
}

int cmd_verify(const VerifyCliOptions& options, std::ostream& out) {
  verify::VerifyOptions vo;
  for (const auto& m : options.meshes) vo.meshes.push_back(mesh::parse_mesh(m));
  verify::Report report = verify::verify_ops(options.ops, vo);
  std::string table = report.table();
  if (options.quiet) table = table.substr(table.rfind("total:"));
  out << table;
  return report.ok() ? 0 : 1;
}

}  // namespace shardwise::cli
