// loss_curve.svg: ticks at nice values (multiples of 1, 2, 2.5 or 5 x 10^k; on the log loss axis,
// the default, 1, 2 and 5 x 10^k), and a title naming the model that ran.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"
#include "shardwise/train/metrics.h"

namespace {

using shardwise::train::log_ticks;
using shardwise::train::loss_curve_title;
using shardwise::train::nice_ticks;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

// Whether `v` is 1, 2, 2.5 or 5 x 10^k.
bool nice(double v) {
  const double m = v / std::pow(10.0, std::floor(std::log10(v) + 1e-9));
  for (double n : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (std::fabs(m - n) < 1e-9) return true;
  return false;
}

// Whether the ticks are evenly spaced by a nice step.
bool nice_steps(const std::vector<double>& t) {
  if (t.size() < 2) return false;
  for (size_t i = 1; i < t.size(); ++i)
    if (std::fabs((t[i] - t[i - 1]) - (t[1] - t[0])) > 1e-9 * (t[1] - t[0])) return false;
  return nice(t[1] - t[0]);
}

TEST(LossCurve, LinearTicksAreMultiplesOfANiceStep) {
  EXPECT_EQ(nice_ticks(0, 30, 6), (std::vector<double>{0, 10, 20, 30}));
  EXPECT_EQ(nice_ticks(0, 4500, 6), (std::vector<double>{0, 1000, 2000, 3000, 4000}));
  EXPECT_EQ(nice_ticks(0.787, 4.74, 6), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(nice_ticks(0, 1, 6), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1}));
  EXPECT_EQ(nice_ticks(0, 10, 4), (std::vector<double>{0, 5, 10}));
  EXPECT_EQ(nice_ticks(1, 1.1, 4), (std::vector<double>{1, 1.05, 1.1}));
  for (double hi : {3.0, 7.0, 13.0, 99.0, 225.0, 1e6 + 3}) {
    const auto t = nice_ticks(0, hi, 6);
    EXPECT_TRUE(nice_steps(t)) << hi;
    EXPECT_LE(t.size(), 6u) << hi;
    EXPECT_GE(t.size(), 2u) << hi;
  }
}

TEST(LossCurve, LogTicksAreDecadesOrOneTwoFive) {
  EXPECT_EQ(log_ticks(0.05, 20), (std::vector<double>{0.1, 1, 10}));
  EXPECT_EQ(log_ticks(0.6, 4.9), (std::vector<double>{1, 2}));
  EXPECT_EQ(log_ticks(0.3, 6), (std::vector<double>{0.5, 1, 2, 5}));
  EXPECT_EQ(log_ticks(2.1, 4.9), (std::vector<double>{2.5, 3, 3.5, 4, 4.5}));  // narrow: nearly linear
}

TEST(LossCurve, TheTitleNamesTheModel) {
  shardwise::train::GptConfig m;
  m.layers = 2, m.hidden = 32;
  EXPECT_EQ(loss_curve_title(m, "[dp=2]"), "shardwise: GPT-2, 2 layers, hidden 32 on [dp=2]");
  m.model_type = "llama", m.layers = 1;
  EXPECT_EQ(loss_curve_title(m, "[tp=2]"), "shardwise: Llama, 1 layer, hidden 32 on [tp=2]");
  m.experts = 4, m.top_k = 2;
  EXPECT_EQ(loss_curve_title(m, "[ep=2]"), "shardwise: Mixtral (4 experts, top-2), 1 layer, hidden 32 on [ep=2]");
}

std::vector<double> ticks_of(const std::string& svg, const std::string& cls) {
  std::vector<double> out;
  const std::regex tick("<text class=\"" + cls + "\"[^>]*>([^<]+)</text>");
  for (std::sregex_iterator it(svg.begin(), svg.end(), tick), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

// The loss_curve.svg that `train ARGS` leaves in `dir` ("" when the run failed).
std::string curve_of(const std::string& args, const std::string& dir) {
  if (run(args + " --progress none --run-dir " + dir).status != 0) return "";
  std::stringstream text;
  text << std::ifstream(dir + "/loss_curve.svg").rdbuf();
  return text.str();
}

// A Llama run's curve: its title, a log loss axis by default, nice ticks on both axes.
TEST(LossCurve, ALlamaRunsCurveIsTitledLlamaWithNiceTicks) {
  const std::string svg = curve_of("train --model llama --layers 1 --hidden 32 --heads 2 --steps 7 --global-batch 4 "
                                   "--eval-every 0", tmp("curve_llama"));
  ASSERT_NE(svg, "");
  EXPECT_NE(svg.find(">shardwise: Llama, 1 layer, hidden 32 on "), std::string::npos) << svg;
  EXPECT_EQ(svg.find("GPT"), std::string::npos) << svg;
  EXPECT_NE(svg.find("loss (log scale)"), std::string::npos) << svg;
  const std::vector<double> steps = ticks_of(svg, "step-tick"), losses = ticks_of(svg, "loss-tick");
  EXPECT_EQ(steps, (std::vector<double>{0, 2, 4, 6})) << svg;  // 7 steps; the old axis said 0, 2, 4, 5, 7
  ASSERT_GE(losses.size(), 2u) << svg;
  for (double v : losses) EXPECT_TRUE(nice(v) || nice_steps(losses)) << v << "\n" << svg;
}

}  // namespace
