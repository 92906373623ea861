#include "shardwise/cli/train/progress.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace shardwise::cli {

bool progress_line_due(const ProgressLine& p) {
  return p.step == p.first_step + 1 || p.step % p.log_every == 0 || p.step == p.steps || p.evaluated ||
         p.since_last_s >= kProgressMaxSilence;
}

bool eta_measured(const EtaCheck& e) {
  return e.done >= kEtaWarnAfterSteps || (e.done >= 1 && e.elapsed_s >= kEtaWarnAfterSeconds);
}

std::string eta_warning(const EtaCheck& e) {
  if (!eta_measured(e) || e.remaining <= 0) return "";
  const double per_step = e.elapsed_s / static_cast<double>(e.done);
  const double eta = per_step * static_cast<double>(e.remaining);
  if (eta <= kEtaWarnSeconds) return "";
  return fmt::format("warning: at {:.3g} s a step the {} steps left take about {} (over an hour): --steps, --epochs "
                     "or --tokens sets a shorter run", per_step, e.remaining, duration_text(eta));
}

ProgressPrinter::ProgressPrinter(std::ostream& out, Mode mode, int64_t first_step, int64_t steps, int64_t log_every)
    : out_(out), mode_(mode), first_step_(first_step), steps_(steps), log_every_(log_every) {}

void ProgressPrinter::step(const std::string& line, int64_t step, bool evaluated, double elapsed_s) {
  const EtaCheck eta{step - first_step_, steps_ - step, elapsed_s};
  if (!warned_) {
    if (const std::string warning = eta_warning(eta); !warning.empty()) {
      out_ << (bar_open_ ? "\n" : "") << warning << "\n" << std::flush;
      bar_open_ = false, warned_ = true;
    }
  }
  if (mode_ == Mode::Bar) {
    out_ << "\r" << line << "\033[K" << (evaluated ? "\n" : "") << std::flush;
    bar_open_ = !evaluated;
  } else if (mode_ == Mode::Lines &&
             progress_line_due({step, first_step_, steps_, log_every_, evaluated, elapsed_s - last_line_s_})) {
    out_ << line << "\n" << std::flush;
    last_line_s_ = elapsed_s;
  }
}

std::string progress_text(const StepProgress& p, bool bar) {
  const int64_t steps = std::max<int64_t>(p.steps, 1), step = std::clamp<int64_t>(p.step, 0, steps);
  const int64_t percent = step * 100 / steps;
  const int64_t done = std::max<int64_t>(step - p.first_step, 1);
  const double eta = p.elapsed_s / static_cast<double>(done) * static_cast<double>(steps - step);
  const std::string times = fmt::format("elapsed {}  ETA {}", duration_text(p.elapsed_s), duration_text(eta));
  const std::string tail = p.metrics.empty() ? "" : "  " + p.metrics;
  if (!bar) return fmt::format("step {:>5}/{}  {:>3}%  {}{}", p.step, p.steps, percent, times, tail);
  const auto filled = static_cast<size_t>(step * kProgressBarWidth / steps);
  return fmt::format("[{}{}] {:>3}%  step {}/{}  {}{}", std::string(filled, '#'),
                     std::string(static_cast<size_t>(kProgressBarWidth) - filled, '-'), percent, p.step, p.steps, times,
                     tail);
}

std::string duration_text(double seconds) {
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
}

}  // namespace shardwise::cli
