#include "shardwise/cli/app.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "shardwise/cli/ckpt_cmd.h"
#include "shardwise/cli/commands.h"
#include "shardwise/core/error.h"

namespace shardwise::cli {

int run(int argc, char** argv) {
  CLI::App app{"shardwise: auto-parallel training core (SPMD rules, reshard, pipelines, unified checkpoints)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardwise 0.1.0");
  RulesOptions rules_opts;
  auto* rules_cmd = app.add_subcommand("rules", "List every SPMD rule with the ops it covers");
  rules_cmd->add_flag("--ops", rules_opts.list_ops, "List the ops with the rule each uses instead");

  InferOptions infer_opts;
  auto* infer_cmd = app.add_subcommand("infer", "Show the placements an op's rule requires and produces");
  infer_cmd->add_option("op", infer_opts.op, "op name (see `shardwise rules --ops`)")->required();
  infer_cmd->add_option("--mesh", infer_opts.mesh, "mesh shape, e.g. 2,2 or dp=2,tp=2")->required();
  infer_cmd->add_option("--shapes", infer_opts.shapes, "input shapes separated by commas, e.g. 8x16,16x4")->required();
  infer_cmd->add_option("--placements", infer_opts.placements,
                        "input placements, one list per input separated by ';', e.g. \"S(0),R;R,S(1)\"")
      ->required();
  infer_cmd->add_option("--dtypes", infer_opts.dtypes, "input dtypes separated by commas (default f32)");
  infer_cmd->add_option("--attrs", infer_opts.attrs, "op attributes, e.g. axis=[0,1],keepdim=true");
  infer_cmd->add_option("--part", infer_opts.part, "forward (default), reverse (placements are the outputs') or grad")
      ->check(CLI::IsMember({"forward", "reverse", "grad"}));

  VerifyCliOptions verify_opts;
  auto* verify_cmd = app.add_subcommand("verify", "Prove rules right numerically on simulated meshes");
  verify_cmd->add_option("--op", verify_opts.ops, "ops to verify (default: all)")->delimiter(',');
  verify_cmd->add_option("--mesh", verify_opts.meshes, "meshes (default: 2 3 2,2 2,3)");
  verify_cmd->add_flag("--quiet", verify_opts.quiet, "print only the summary line");

  PlanReshardOptions reshard_opts;
  auto* reshard_cmd = app.add_subcommand("plan-reshard", "Show how a tensor moves from one layout to another, and its cost");
  reshard_cmd->add_option("--shape", reshard_opts.shape, "global shape, e.g. 1024x4096")->required();
  reshard_cmd->add_option("--from", reshard_opts.from, "source layout, e.g. \"mesh=2x2 S(0),P\" (ranks=4-7 to name processes)")
      ->required();
  reshard_cmd->add_option("--to", reshard_opts.to, "target layout, e.g. \"mesh=2x2 R,S(1)\"")->required();
  reshard_cmd->add_option("--dtype", reshard_opts.dtype, "element type (default f32)");
  reshard_cmd->add_option("--strategy", reshard_opts.strategy, "auto (cheapest), collectives or redistribute")
      ->check(CLI::IsMember({"auto", "collectives", "redistribute"}));
  reshard_cmd->add_option("--alpha-us", reshard_opts.alpha_us, "latency per message in microseconds (default 5)");
  reshard_cmd->add_option("--bandwidth-gbps", reshard_opts.bandwidth_gbps, "bandwidth in GB/s (default 10)");
  reshard_cmd->add_option("--dim-bandwidth-gbps", reshard_opts.dim_bandwidth_gbps, "bandwidth per mesh dim, e.g. 100,10")
      ->delimiter(',');

  auto ckpt_cmds = add_ckpt_commands(app);  // shardwise ckpt inspect|verify|merge|lora-merge|convert

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*rules_cmd) return cmd_rules(rules_opts, std::cout);
    if (*infer_cmd) return cmd_infer(infer_opts, std::cout);
    if (*verify_cmd) return cmd_verify(verify_opts, std::cout);
    if (*reshard_cmd) return cmd_plan_reshard(reshard_opts, std::cout);
    if (ckpt_cmds->chosen()) return ckpt_cmds->run(std::cout);
  } catch (const Error& e) {
    std::cerr << "shardwise: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace shardwise::cli
