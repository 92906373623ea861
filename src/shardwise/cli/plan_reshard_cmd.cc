// `shardwise plan-reshard`: the steps and estimated cost of moving a tensor from one layout to
// another, and optionally a run on threads that checks the result.
#include <fmt/format.h>

#include "shardwise/cli/commands.h"
#include "shardwise/core/error.h"
#include "shardwise/reshard/plan.h"

namespace shardwise::cli {

int cmd_plan_reshard(const PlanReshardOptions& o, std::ostream& out) {
  reshard::CostModel cost;
  SW_CHECK(o.alpha_us > 0, "--alpha-us must be positive, got {}", o.alpha_us);
  SW_CHECK(o.bandwidth_gbps > 0, "--bandwidth-gbps must be positive, got {}", o.bandwidth_gbps);
  cost.alpha_s = cost.p2p_alpha_s = o.alpha_us * 1e-6;
  cost.bandwidth_Bps = cost.p2p_bandwidth_Bps = o.bandwidth_gbps * 1e9;
  for (double bw : o.dim_bandwidth_gbps) {
    SW_CHECK(bw > 0, "--dim-bandwidth-gbps values must be positive, got {}", bw);
    cost.dim_bandwidth_Bps.push_back(bw * 1e9);
  }
  reshard::PlanOptions options;
  if (o.strategy == "collectives") options.strategy = reshard::PlanOptions::Strategy::Collectives;
  if (o.strategy == "redistribute") options.strategy = reshard::PlanOptions::Strategy::Redistribute;
  reshard::Plan plan = reshard::plan_reshard(parse_shape(o.shape), parse_dtype(o.dtype), reshard::parse_layout(o.from),
                                             reshard::parse_layout(o.to), cost, options);
  out << plan.to_string();
  return 0;
}

}  // namespace shardwise::cli
