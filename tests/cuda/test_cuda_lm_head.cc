// The fused LM head (cuda/lm_head.h) against ops::lm_head_cross_entropy_outputs: chunks with a
// ragged last one, ignored labels, reductions mean / sum with the gradients formed in the forward
// and none without, f32 and bf16, run twice for the same bits; and the vocab-parallel row pieces
// against ops::cross_entropy_local_max / _local_sums on a block of the classes. Skipped without a GPU.
#include "cuda_test_util.h"

#include <barrier>
#include <thread>

#include "shardwise/cuda/loss/lm_head.h"
#include "shardwise/ops/softmax/lm_head.h"
#include "shardwise/ops/unary/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaLmHead = Gpu;
namespace launch = cuda::launch;

constexpr int64_t kRows = 74, kHidden = 33, kVocab = 1001;

Tensor labels_for(int64_t rows, int64_t classes) {
  std::vector<int64_t> lab(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) lab[static_cast<size_t>(r)] = r % 7 == 3 ? -100 : (r * 7919) % classes;
  return Tensor::from<int64_t>(Shape{rows}, lab);
}

// f32: the CPU's float exponentials (a few ulp) against double ones, and GEMM sums of another
// order: 1e-5 on the loss, 1e-4 on the gradients (atol 1e-6: they are about 1e-2). bf16 h and W:
// the loss f32 (the same rounding points: f32 logits of the bf16 values), so f32's 1e-5; dh and dW
// bf16 from bf16 dlogits on both sides, one bf16 ulp (8e-3).
TEST_F(CudaLmHead, LossAndGradientsEqualTheCpuOp) {
  const std::pair<launch::Reduction, ops::LossReduction> reductions[] = {
      {launch::Reduction::Mean, ops::LossReduction::Mean},
      {launch::Reduction::Sum, ops::LossReduction::Sum},
      {launch::Reduction::None, ops::LossReduction::None}};
  const Tensor labels = labels_for(kRows, kVocab);
  for (DType t : {DType::F32, DType::BF16}) {
    const double rtol = t == DType::BF16 ? 8e-3 : 1e-4, loss_rtol = 1e-5;
    const Tensor h = ops::cast(random_f32(Shape{2, kRows / 2, kHidden}, 51, -1.f, 1.f), t);
    const Tensor w = ops::cast(random_f32(Shape{kVocab, kHidden}, 52, -1.f, 1.f), t);
    const Tensor gh = to_device(h, kGpu), gw = to_device(w, kGpu), glabels = to_device(labels.reshaped(Shape{2, kRows / 2}), kGpu);
    for (auto [gred, cred] : reductions) {
      const bool grads = cred != ops::LossReduction::None;
      const std::string what = std::string(dtype_name(t)) + " reduction " + std::to_string(static_cast<int>(cred));
      ops::LmHeadArgs args;
      args.reduction = cred;
      args.chunk_bytes = 16 * kVocab * 4;  // 16 rows a chunk: 5 chunks, the last of 10 rows
      args.forward_grads = grads ? 3 : 0;
      args.grad_scale = 0.5;
      const std::vector<Tensor> ref = ops::lm_head_cross_entropy_outputs(h, w, labels.reshaped(Shape{2, kRows / 2}), args);
      cuda::LmHeadOptions o;
      o.reduction = gred;
      o.chunk_bytes = args.chunk_bytes;
      o.grads = grads;
      o.grad_scale = 0.5;
      const cuda::LmHeadResult got = cuda::lm_head_cross_entropy(gh, gw, glabels, o);
      EXPECT_EQ(got.loss.dtype(), DType::F32) << what;
      expect_close(got.loss, ref[0], loss_rtol, 1e-6, what + " loss");
      if (!grads) continue;
      EXPECT_EQ(got.dh.dtype(), t) << what;
      EXPECT_EQ(got.dw.dtype(), t) << what;
      expect_close(got.dh, ref[1], rtol, 1e-6, what + " dh");
      expect_close(got.dw, ref[2], rtol, 1e-6, what + " dW");
      const cuda::LmHeadResult again = cuda::lm_head_cross_entropy(gh, gw, glabels, o);
      EXPECT_TRUE(bit_equal(got.loss, again.loss) && bit_equal(got.dh, again.dh) && bit_equal(got.dw, again.dw))
          << what << ": not deterministic";
    }
  }
}

TEST_F(CudaLmHead, VocabBlockPiecesEqualTheCpuRowFunctions) {
  const int64_t rows = 5, split = 400;
  const Tensor logits = random_f32(Shape{rows, kVocab}, 53, -8.f, 8.f);
  const Tensor labels = labels_for(rows, kVocab);
  const int64_t lo[] = {0, 0}, hi[] = {0, split};
  const Tensor blocks[2] = {logits.slice(lo, Shape{rows, split}), logits.slice(hi, Shape{rows, kVocab - split})};
  std::vector<double> global(static_cast<size_t>(rows), -INFINITY);
  for (const Tensor& b : blocks) {
    const std::vector<double> mx = ops::cross_entropy_local_max(b);
    const Tensor got = to_host(cuda::vocab_row_max(to_device(b, kGpu)));
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got.data<double>()[r], mx[static_cast<size_t>(r)]) << "row max " << r;
      global[static_cast<size_t>(r)] = std::max(global[static_cast<size_t>(r)], mx[static_cast<size_t>(r)]);
    }
  }
  const Tensor gmax = to_device(Tensor::from<double>(Shape{rows}, global), kGpu);
  for (int i = 0; i < 2; ++i) {
    const int64_t offset = i == 0 ? 0 : split;
    const ops::CrossEntropyRowSums want =
        ops::cross_entropy_local_sums(blocks[i], labels, global, -100, ops::ClassShard{kVocab, offset});
    const cuda::VocabRowSums got = cuda::vocab_row_sums(to_device(blocks[i], kGpu), to_device(labels, kGpu), gmax, offset, -100);
    const Tensor s = to_host(got.sum_exp), tg = to_host(got.target);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(s.data<double>()[r], want.sum_exp[static_cast<size_t>(r)], 1e-6 * want.sum_exp[static_cast<size_t>(r)])
          << "block " << i << " row " << r;
      EXPECT_EQ(tg.data<double>()[r], want.target[static_cast<size_t>(r)]) << "block " << i << " row " << r;
    }
  }
}

// Two vocab blocks on two threads sharing the GPU, their row statistics combined through the host
// (max, then sum, in rank order) as a collective would: each rank's loss is the whole loss, the
// ranks' dh add up to the whole dh and each dW is its block of the whole dW.
TEST_F(CudaLmHead, TwoVocabBlocksCombinedEqualTheWholeHead) {
  const int64_t split = 400;
  const Tensor h = random_f32(Shape{kRows, kHidden}, 54, -1.f, 1.f), w = random_f32(Shape{kVocab, kHidden}, 55, -1.f, 1.f);
  const Tensor labels = labels_for(kRows, kVocab);
  ops::LmHeadArgs args;
  args.chunk_bytes = 16 * kVocab * 4;
  args.forward_grads = 3;
  const std::vector<Tensor> ref = ops::lm_head_cross_entropy_outputs(h, w, labels, args);
  const int64_t starts[2][2] = {{0, 0}, {split, 0}};
  const int64_t rows_of[2] = {split, kVocab - split};
  std::barrier sync(2);
  std::vector<double> shared[2];
  cuda::LmHeadResult got[2];
  auto rank = [&](int r) {
    cuda::LmHeadOptions o;
    o.chunk_bytes = args.chunk_bytes;
    o.grads = true;
    o.classes = kVocab;
    o.offset = starts[r][0];
    o.combine = [&, r](Tensor& stats, bool is_max) {
      const Tensor mine = to_host(stats);
      shared[r].assign(mine.data<double>(), mine.data<double>() + mine.numel());
      sync.arrive_and_wait();
      std::vector<double> all = shared[0];
      for (size_t i = 0; i < all.size(); ++i) all[i] = is_max ? std::max(all[i], shared[1][i]) : all[i] + shared[1][i];
      sync.arrive_and_wait();
      stats = to_device(Tensor::from<double>(stats.shape(), all), kGpu);
    };
    got[r] = cuda::lm_head_cross_entropy(to_device(h, kGpu), to_device(w.slice(starts[r], Shape{rows_of[r], kHidden}), kGpu),
                                         to_device(labels, kGpu), o);
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  for (int r = 0; r < 2; ++r) {
    expect_close(got[r].loss, ref[0], 1e-5, 1e-6, "rank " + std::to_string(r) + " loss");
    expect_close(got[r].dw, ref[2].slice(starts[r], Shape{rows_of[r], kHidden}), 1e-4, 1e-6, "rank " + std::to_string(r) + " dW");
  }
  const Tensor dh = to_host(got[0].dh), dh1 = to_host(got[1].dh);
  std::vector<float> sum(static_cast<size_t>(dh.numel()));
  for (int64_t i = 0; i < dh.numel(); ++i) sum[static_cast<size_t>(i)] = dh.data<float>()[i] + dh1.data<float>()[i];
  const CompareResult c = compare(Tensor::from<float>(dh.shape(), sum), ref[1], 1e-4, 1e-6);
  EXPECT_TRUE(c.equal) << "dh summed over the ranks: " << c.message;
}

TEST_F(CudaLmHead, ForwardGradientsWithoutAReductionAreANamedError) {
  cuda::LmHeadOptions o;
  o.reduction = launch::Reduction::None;
  o.grads = true;
  try {
    (void)cuda::lm_head_cross_entropy(to_device(random_f32(Shape{3, 4}, 1), kGpu), to_device(random_f32(Shape{5, 4}, 2), kGpu),
                                      to_device(labels_for(3, 5), kGpu), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need reduction sum or mean"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
