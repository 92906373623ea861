// `shardwise pipeline`: generates a schedule, validates it, prints every rank's action list and
// simulates it (step time, bubble fraction, peak activations per rank; optional SVG timeline).
#include <fstream>

#include "shardwise/cli/commands.h"
#include "shardwise/core/error.h"
#include "shardwise/pipeline/simulate.h"
#include "shardwise/pipeline/validate.h"
#include "shardwise/core/plural.h"

namespace shardwise::cli {

int cmd_pipeline(const PipelineOptions& o, std::ostream& out) {
  using namespace pipeline;
  ScheduleKind kind = parse_schedule_kind(o.schedule);
  SW_CHECK(o.forward_time > 0 && o.backward_input_time > 0 && o.backward_weight_time > 0 && o.send_time >= 0,
           "action times must be positive (send time non-negative)");
  // Documented bounds (see --help): every rank's action list is printed and simulated.
  SW_CHECK(o.stages >= 1 && o.stages <= kMaxPipelineStages, "--stages {}: use 1 to {}", o.stages, kMaxPipelineStages);
  SW_CHECK(o.micro_batches >= 1 && o.micro_batches <= kMaxPipelineMicroBatches, "--micro-batches {}: use 1 to {}",
           o.micro_batches, kMaxPipelineMicroBatches);
  SW_CHECK(o.virtual_stages >= 1 && o.virtual_stages <= 64, "--virtual {}: use 1 to 64", o.virtual_stages);
  const int64_t work = int64_t{o.stages} * o.virtual_stages * o.micro_batches;
  SW_CHECK(work <= kMaxPipelineWork, "--stages {} x --virtual {} x --micro-batches {} = {}: at most {} in one schedule",
           o.stages, o.virtual_stages, o.micro_batches, work, kMaxPipelineWork);
  Schedule s = make_schedule(kind, o.stages, o.micro_batches, o.virtual_stages);
  validate(s);
  const int p = s.ranks, m = s.micro_batches, v = s.virtual_stages;
  out << fmt::format("schedule {}: {} x {} = {}, {} (valid: no deadlock under blocking send/recv)\n", s.name,
                     counted(p, "rank"), counted(v, "virtual stage"), counted(s.stages(), "stage"),
                     counted(m, "micro-batch"));
  out << s.to_string();
  SimOptions sim;
  // Times are per rank's share of the model: a virtual stage takes 1/v of them.
  const double scale = 1.0 / v;
  sim.stages = {StageCosts{o.forward_time * scale, (o.backward_input_time + o.backward_weight_time) * scale,
                           o.backward_input_time * scale, o.backward_weight_time * scale, o.activation_bytes,
                           o.weight_grad_bytes}};
  sim.send_time = o.send_time;
  SimResult r = simulate(s, sim);
  double formula = kind == ScheduleKind::Interleaved ? (p - 1.0) / (v * m + p - 1.0)
                   : kind == ScheduleKind::ZeroBubbleH1 ? -1
                                                        : (p - 1.0) / (m + p - 1.0);
  out << fmt::format("simulated: forward {}, backward {} (input {} + weight {}) per rank's layers, send {}\n",
                     o.forward_time, o.backward_input_time + o.backward_weight_time, o.backward_input_time,
                     o.backward_weight_time, o.send_time);
  out << fmt::format("bubble fraction {:.4f}", r.max_bubble_fraction());
  if (formula >= 0 && o.send_time == 0)
    out << fmt::format(" (closed form {} = {:.4f})", kind == ScheduleKind::Interleaved ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)",
                       formula);
  out << fmt::format(", peak activations {}\n", counted(r.max_peak_bytes(), o.activation_bytes == 1 ? "micro-batch" : "byte"));
  out << r.summary();
  if (!o.svg.empty()) {
    std::ofstream f(o.svg);
    SW_CHECK(f.good(), "cannot write the timeline to '{}'", o.svg);
    f << timeline_svg(s, r);
    SW_CHECK(f.good(), "writing the timeline to '{}' failed", o.svg);
    out << "timeline: " << o.svg << "\n";
  }
  return 0;
}

}  // namespace shardwise::cli
