// moe_mlp with bf16 x, w1, w3, w2 and an f32 gate (`--compute bf16`, ops/moe/kernels.h) against the
// f32 op on the same values widened (bf16-representable f32 inputs: what `--compute bf16` fed the
// f32 op before). The router reads the same f32 values, so the routing, aux_loss, z_loss, dropped
// and expert_tokens are the same bits, and out, aux_loss, z_loss are f32. Where the rounding points
// differ: the bf16 op rounds a = silu(h1) * h3 to bf16 before y's GEMM and, backward, dy and dh1,
// dh3 before theirs, then dx, dw1, dw3, dw2 once to bf16 (dgate stays f32). Each rounding moves a
// term by at most 2^-9 of it; out and the gradients stay within 2^-6 of the f32 op's largest value
// (measured: 2^-9.6 to 2^-7.9), and they do differ (the roundings happen).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/ops/op.h"
#include "tests/ops/random_inputs.h"

namespace shardwise::ops {
namespace {

using testing::random_f64;

// x, gate, w1, w3, w2: x and the experts as bf16 (values rounded once), the gate f32.
std::vector<Tensor> bf16_inputs(int64_t n, int64_t d, int64_t e, int64_t f, uint64_t seed) {
  return {random_f64({n, d}, seed).to(DType::BF16), random_f64({e, d}, seed + 1).to(DType::F32),
          random_f64({e, f, d}, seed + 2).to(DType::BF16), random_f64({e, f, d}, seed + 3).to(DType::BF16),
          random_f64({e, d, f}, seed + 4).to(DType::BF16)};
}

std::vector<Tensor> widened(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.to(DType::F32));
  return out;
}

// Within 2^-6 of `want`'s largest magnitude, and not equal to it everywhere.
void expect_near_not_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.at(i)));
  for (int64_t i = 0; i < want.numel(); ++i) worst = std::max(worst, std::abs(got.at(i) - want.at(i)));
  EXPECT_GT(scale, 0) << what;
  EXPECT_LE(worst, std::ldexp(scale, -6)) << what;
  EXPECT_GT(worst, 0) << what << ": the bf16 roundings should move something";
  std::cout << what << ": largest difference 2^" << std::log2(worst / scale) << " of the largest value\n";
}

TEST(MoeBf16, RoutingIsTheF32OpsAndTheExpertsRoundTheirOperands) {
  for (double cf : {0.0, 0.75}) {
    SCOPED_TRACE(cf);
    const std::vector<Tensor> in = bf16_inputs(12, 8, 4, 6, 3), in32 = widened(in);
    const MoeConfig cfg{2, cf, true, false};
    const std::vector<Tensor> got = moe_forward(in, cfg, MoeShard{}), want = moe_forward(in32, cfg, MoeShard{});
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(got[k].dtype(), DType::F32) << k;
    for (size_t k = 1; k < 5; ++k) EXPECT_TRUE(compare(got[k], want[k], 0, 0).equal) << "output " << k;
    expect_near_not_equal(got[0], want[0], "out");

    const Tensor dout = random_f64({12, 8}, 9).to(DType::F32);
    const Tensor daux = Tensor::scalar<float>(0.7f), dz = Tensor::scalar<float>(-0.3f);
    const MoeGrads g = moe_backward(in, dout, daux, dz, cfg, MoeShard{});
    const MoeGrads g32 = moe_backward(in32, dout, daux, dz, cfg, MoeShard{});
    const std::vector<std::pair<const Tensor*, const Tensor*>> pairs{
        {&g.dx, &g32.dx}, {&g.dgate, &g32.dgate}, {&g.dw1, &g32.dw1}, {&g.dw3, &g32.dw3}, {&g.dw2, &g32.dw2}};
    const char* names[] = {"dx", "dgate", "dw1", "dw3", "dw2"};
    for (size_t k = 0; k < pairs.size(); ++k) {
      EXPECT_EQ(pairs[k].first->dtype(), k == 1 ? DType::F32 : DType::BF16) << names[k];
      expect_near_not_equal(*pairs[k].first, *pairs[k].second, names[k]);
    }
  }
}

TEST(MoeBf16, TheRegistryEntryGivesF32OutputsAndRefusesOtherMixes) {
  const OpDef& op = op_registry().get("moe_mlp");
  const Attrs attrs{{"top_k", int64_t{2}}};
  std::vector<TensorMeta> metas{{{4, 3}, DType::BF16}, {{4, 3}, DType::F32}, {{4, 2, 3}, DType::BF16},
                                {{4, 2, 3}, DType::BF16}, {{4, 3, 2}, DType::BF16}};
  const std::vector<TensorMeta> out = infer_checked(op, metas, attrs);
  EXPECT_EQ(out[0].dtype, DType::F32);
  EXPECT_EQ(out[1].dtype, DType::F32);
  EXPECT_EQ(out[2].dtype, DType::F32);
  for (auto [input, dtype] : {std::pair{1, DType::BF16}, std::pair{3, DType::F32}}) {
    std::vector<TensorMeta> bad = metas;
    bad[static_cast<size_t>(input)].dtype = dtype;
    try {
      infer_checked(op, bad, attrs);
      FAIL() << "input " << input << " as " << dtype_name(dtype) << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("x, w1, w3, w2 bf16 with an f32 gate"), std::string::npos) << e.what();
    }
  }
  const std::vector<Tensor> in = bf16_inputs(4, 3, 4, 2, 5);
  try {
    moe_backward(in, Tensor(DType::BF16, Shape{4, 3}), Tensor(), Tensor(), MoeConfig{2, 0.0, true, false}, MoeShard{});
    FAIL() << "a bf16 dout accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be f32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::ops
