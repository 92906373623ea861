#include "shardwise/train/metrics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"

namespace shardwise::train {

namespace {

// The lines of metrics.jsonl up to `step` (text and records); a line that does not parse ends them.
std::string kept_lines(const std::string& path, int64_t step, std::vector<StepRecord>& records) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) break;
    if (j["step"].get<int64_t>() > step) break;
    StepRecord r;
    r.step.step = j["step"].get<int64_t>();
    r.step.loss = j.value("loss", 0.0);
    r.step.lr = j.value("lr", 0.0);
    r.step.grad_norm = j.value("grad_norm", 0.0);
    r.step.tokens = j.value("tokens", int64_t{0});
    r.step.loader_wait_s = j.value("loader_wait_s", 0.0);
    r.step.loader_read_s = j.value("loader_read_s", 0.0);
    r.elapsed_s = j.value("elapsed_s", 0.0);
    r.tokens_per_s = j.value("tokens_per_s", 0.0);
    if (j.contains("accuracy")) r.accuracy = j["accuracy"].get<double>();
    if (j.contains("val_loss") && j["val_loss"].is_number()) r.val_loss = j["val_loss"].get<double>();
    records.push_back(r);
    kept += line + "\n";
  }
  return kept;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, int64_t resumed_step) : dir_(run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  SW_CHECK(!ec, "cannot create the run directory '{}': {}", run_dir, ec.message());
  if (resumed_step >= 0) {
    // Rewritten whole (to a temporary, renamed over) so a kill here keeps the old file.
    std::string kept = kept_lines(jsonl_path(), resumed_step, earlier_), tmp = jsonl_path() + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << kept;
      f.flush();
      SW_CHECK(f.good(), "cannot write '{}'", tmp);
    }
    std::filesystem::rename(tmp, jsonl_path(), ec);
    SW_CHECK(!ec, "cannot replace '{}': {}", jsonl_path(), ec.message());
  }
  if (resumed_step < 0 && std::filesystem::file_size(jsonl_path(), ec) > 0 && !ec) {
    // A fresh run in a directory with an earlier run's log (--run-dir given again, or every
    // checkpoint was rejected): that log and its loss curve are kept aside, not emptied, under one
    // suffix, so no curve is left next to another run's metrics.
    const std::string curve = dir_ + "/loss_curve.svg";
    auto suffix = [](int k) { return k == 0 ? std::string(".previous") : fmt::format(".previous.{}", k); };
    int k = 0;
    while (std::filesystem::exists(jsonl_path() + suffix(k)) || std::filesystem::exists(curve + suffix(k))) ++k;
    std::filesystem::rename(jsonl_path(), jsonl_path() + suffix(k), ec);
    SW_CHECK(!ec, "cannot move the earlier '{}' aside: {}", jsonl_path(), ec.message());
    if (std::filesystem::exists(curve)) std::filesystem::rename(curve, curve + suffix(k), ec);
    SW_CHECK(!ec, "cannot move the earlier '{}' aside: {}", curve, ec.message());
    kept_aside_ = jsonl_path() + suffix(k);
  }
  out_.open(jsonl_path(), resumed_step >= 0 ? std::ios::app : std::ios::trunc);
  SW_CHECK(out_.good(), "cannot write '{}'", jsonl_path());
}

nlohmann::json record_json(const StepRecord& r) {
  nlohmann::json j = {{"step", r.step.step},          {"loss", r.step.loss},         {"lr", r.step.lr},
                      {"grad_norm", r.step.grad_norm}, {"tokens", r.step.tokens},    {"elapsed_s", r.elapsed_s},
                      {"tokens_per_s", r.tokens_per_s}, {"loader_wait_s", r.step.loader_wait_s},
                      {"loader_read_s", r.step.loader_read_s}};
  if (r.accuracy) j["accuracy"] = *r.accuracy;
  if (!r.device.empty()) j["device"] = r.device;
  if (r.device_peak_bytes) j["device_peak_bytes"] = *r.device_peak_bytes;
  if (r.val_loss) j["val_loss"] = *r.val_loss, j["val_ppl"] = std::exp(*r.val_loss);
  for (const MoeStepStats& m : r.step.moe) {
    j["moe"].push_back({{"layer", m.layer},
                        {"tokens_per_expert_min", m.tokens_min},
                        {"tokens_per_expert_mean", m.tokens_mean},
                        {"tokens_per_expert_max", m.tokens_max},
                        {"dropped", m.dropped},
                        {"aux_loss", m.aux_loss},
                        {"z_loss", m.z_loss}});
  }
  return j;
}

void MetricsLog::add(const StepRecord& r) {
  const nlohmann::json j = record_json(r);
  out_ << j.dump() << "\n";
  out_.flush();
  records_.push_back(r);
}

std::string MetricsLog::write_curve(const std::string& title, bool log_loss_axis) const {
  std::string path = dir_ + "/loss_curve.svg";
  std::ofstream f(path, std::ios::trunc);
  SW_CHECK(f.good(), "cannot write '{}'", path);
  std::vector<StepRecord> all = earlier_;
  all.insert(all.end(), records_.begin(), records_.end());
  f << loss_curve_svg(all, title, log_loss_axis);
  return path;
}

namespace {

bool drawable(double loss, bool log) { return std::isfinite(loss) && (!log || loss > 0); }

// The loss axis over the losses drawn (training and validation), 5% of room below; on a log axis
// the room and the ticks are even in log10(loss).
struct LossAxis {
  bool log = false;
  double lo = 0, hi = 1;
  double scaled(double v) const { return log ? std::log10(v) : v; }
  double fraction(double loss) const { return (scaled(loss) - scaled(lo)) / (scaled(hi) - scaled(lo)); }
};

LossAxis loss_axis(const std::vector<StepRecord>& records, bool log) {
  LossAxis a{log, log ? 1.0 : 0.0, log ? 10.0 : 1.0};
  bool any = false;
  auto take = [&](double v) {
    if (!drawable(v, log)) return;
    a.lo = any ? std::min(a.lo, v) : v, a.hi = any ? std::max(a.hi, v) : v;
    any = true;
  };
  for (const auto& r : records) {
    take(r.step.loss);
    if (r.val_loss) take(*r.val_loss);
  }
  if (!any) return LossAxis{log, log ? 1.0 : 0.0, log ? 10.0 : 1.0};
  if (log) {
    if (a.hi / a.lo < 1 + 1e-9) a.hi = a.lo * 10;
    a.lo /= std::pow(a.hi / a.lo, 0.05);
  } else {
    if (a.hi - a.lo < 1e-9) a.hi = a.lo + 1;
    a.lo = std::max(0.0, a.lo - 0.05 * (a.hi - a.lo));
  }
  return a;
}

}  // namespace

std::string loss_curve_title(const GptConfig& m, const std::string& mesh) {
  const std::string kind = !m.is_llama()     ? "GPT-2"
                           : m.experts == 0 ? "Llama"
                                            : fmt::format("Mixtral ({}, top-{})", counted(m.experts, "expert"), m.top_k);
  return fmt::format("shardwise: {}, {}, hidden {} on {}", kind, counted(m.layers, "layer"), m.hidden, mesh);
}

std::vector<double> nice_ticks(double lo, double hi, int most) {
  SW_CHECK(lo < hi && most >= 2, "nice_ticks: the range [{}, {}] needs lo < hi and room for 2 ticks", lo, hi);
  // The step is mantissa x 10^exponent; a tick k x mantissa / 10^-exponent is then the double nearest
  // the decimal value (0.6, not 3 x 0.2 = 0.6000000000000001).
  int exponent = static_cast<int>(std::floor(std::log10((hi - lo) / most)));
  double mantissa = 1;
  for (int i = 0;; ++i) {
    mantissa = std::array<double, 4>{1, 2, 2.5, 5}[static_cast<size_t>(i % 4)];
    const double s = mantissa * std::pow(10.0, exponent + i / 4);
    if (std::floor(hi / s + 1e-9) - std::ceil(lo / s - 1e-9) + 1 <= most) {
      exponent += i / 4;
      break;
    }
  }
  const double scale = std::pow(10.0, std::abs(exponent)), step = exponent < 0 ? mantissa / scale : mantissa * scale;
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); k <= std::floor(hi / step + 1e-9); ++k) {
    out.push_back(exponent < 0 ? k * mantissa / scale : k * mantissa * scale);
  }
  return out;
}

std::vector<double> log_ticks(double lo, double hi, int most) {
  SW_CHECK(lo > 0 && lo < hi, "log_ticks: the range [{}, {}] needs 0 < lo < hi", lo, hi);
  std::vector<double> decades, steps;
  for (int k = static_cast<int>(std::floor(std::log10(lo))); k <= static_cast<int>(std::ceil(std::log10(hi))); ++k) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, k);
      if (v < lo * (1 - 1e-9) || v > hi * (1 + 1e-9)) continue;
      steps.push_back(v);
      if (m == 1.0) decades.push_back(v);
    }
  }
  if (decades.size() >= 3) return decades;
  if (steps.size() >= 2 && static_cast<int>(steps.size()) <= most) return steps;
  return nice_ticks(lo, hi, most);
}

std::string loss_curve_svg(const std::vector<StepRecord>& records, const std::string& title, bool log_loss_axis) {
  const double W = 720, H = 400, left = 60, right = 60, top = 40, bottom = 50;
  const double max_step = records.empty() ? 1 : static_cast<double>(std::max<int64_t>(1, records.back().step.step));
  const LossAxis axis = loss_axis(records, log_loss_axis);
  auto x = [&](double step) { return left + (W - left - right) * step / max_step; };
  auto y = [&](double loss) { return top + (H - top - bottom) * (1 - axis.fraction(loss)); };
  auto y_acc = [&](double acc) { return top + (H - top - bottom) * (1 - acc); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" font-size=\"14\">{}</text>\n",
      W, H, left, title);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, H - bottom);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left, H - bottom, W - right);
  for (double v : log_loss_axis ? log_ticks(axis.lo, axis.hi) : nice_ticks(axis.lo, axis.hi)) {
    s += fmt::format("<text class=\"loss-tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", left - 6,
                     y(v) + 4, v);
  }
  for (double st : nice_ticks(0, max_step, 6)) {
    if (st != std::floor(st)) continue;  // steps are whole
    s += fmt::format("<text class=\"step-tick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", x(st),
                     H - bottom + 18, st);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", (W + left - right) / 2, H - 10);
  s += fmt::format("<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" fill=\"#1f77b4\">loss{}</text>\n", H / 2,
                   H / 2, log_loss_axis ? " (log scale)" : "");
  std::string points, val_points, val_marks;
  for (const auto& r : records) {
    const double px = x(static_cast<double>(r.step.step));
    if (drawable(r.step.loss, log_loss_axis)) points += fmt::format("{:.1f},{:.1f} ", px, y(r.step.loss));
    if (!r.val_loss || !drawable(*r.val_loss, log_loss_axis)) continue;
    val_points += fmt::format("{:.1f},{:.1f} ", px, y(*r.val_loss));
    val_marks += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"#ff7f0e\"/>\n", px, y(*r.val_loss));
  }
  s += fmt::format("<polyline id=\"train-loss\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n", points);
  if (!val_points.empty()) {
    s += fmt::format("<polyline id=\"val-loss\" fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                     val_points) + val_marks;
    const double lx = W - right - 130, ly = top + 12;
    s += fmt::format("<g id=\"legend\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
                     "<text x=\"{3}\" y=\"{4}\">training loss</text>"
                     "<line x1=\"{0}\" y1=\"{5}\" x2=\"{2}\" y2=\"{5}\" stroke=\"#ff7f0e\" stroke-width=\"2\"/>"
                     "<text x=\"{3}\" y=\"{6}\">validation loss</text></g>\n",
                     lx, ly, lx + 20, lx + 26, ly + 4, ly + 16, ly + 20);
  }
  bool any_acc = false;
  for (const auto& r : records) {
    if (!r.accuracy) continue;
    any_acc = true;
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#d62728\"/>\n", x(static_cast<double>(r.step.step)),
                     y_acc(*r.accuracy));
  }
  if (any_acc) {
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#d62728\"/>\n", W - right, top, H - bottom);
    for (int i = 0; i <= 4; ++i) {
      s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#d62728\">{}%</text>\n", W - right + 6, y_acc(i / 4.0) + 4, i * 25);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#d62728\" transform=\"rotate(90 {} {})\">held-out exact match</text>\n",
                     W - 14, H / 2 - 50, W - 14, H / 2 - 50);
  }
  return s + "</svg>\n";
}

}  // namespace shardwise::train
