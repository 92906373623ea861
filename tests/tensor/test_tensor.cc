#include <gtest/gtest.h>

#include "shardwise/tensor/tensor.h"

namespace shardwise {
namespace {

TEST(Tensor, SliceAndPasteBlocks) {
  std::vector<int32_t> v(24);
  for (int i = 0; i < 24; ++i) v[static_cast<size_t>(i)] = i;
  Tensor t = Tensor::from<int32_t>(Shape{2, 3, 4}, v);
  int64_t off[] = {1, 1, 2};
  Tensor s = t.slice(off, Shape{1, 2, 2});
  // Element (1, 1+i, 2+j) of a row-major 2x3x4 tensor is 12 + 4(1+i) + 2 + j.
  EXPECT_EQ(s.to_string(), "Tensor(i32, 1x2x2, [18, 19, 22, 23])");
  Tensor z(DType::I32, Shape{2, 3, 4});
  z.paste(s, off);
  EXPECT_EQ(z.at(18), 18);
  EXPECT_EQ(z.at(23), 23);
  EXPECT_EQ(z.at(17), 0);
  int64_t bad[] = {1, 2, 2};
  EXPECT_THROW(t.slice(bad, Shape{1, 2, 2}), Error);
  // Empty blocks are fine.
  EXPECT_EQ(t.slice(off, Shape{0, 2, 2}).numel(), 0);
}

TEST(Tensor, ConversionsAndCompare) {
  Tensor f = Tensor::from<float>(Shape{3}, {1.5f, -2.0f, 0.0f});
  EXPECT_EQ(f.to(DType::I32).to_string(), "Tensor(i32, 3, [1, -2, 0])");
  EXPECT_EQ(f.to(DType::Bool).to_string(), "Tensor(bool, 3, [1, 1, 0])");
  EXPECT_EQ(f.to(DType::BF16).to(DType::F32).at(0), 1.5);
  EXPECT_THROW(f.data<double>(), Error);
  Tensor g = f.clone();
  g.set_at(1, -2.0001);
  EXPECT_FALSE(compare(g, f).equal);
  EXPECT_TRUE(compare(g, f, 1e-3, 0).equal);
  EXPECT_FALSE(compare(f.to(DType::F64), f).equal);  // dtype differs
}

}  // namespace
}  // namespace shardwise

namespace shardwise {
namespace {

// uninitialized_at: the data starts `lead` bytes into a fresh block (huge-page blocks are 2 MiB
// aligned, so the address modulo 4 KiB is the lead), the block lives as long as any copy of the
// tensor, and a lead off the element size is refused.
TEST(Tensor, UninitializedAtPlacesTheDataAtTheLead) {
  for (size_t lead : {size_t{0}, size_t{12}, size_t{4092}}) {
    Tensor t = Tensor::uninitialized_at(DType::F32, Shape{1024, 1024}, true, lead);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 4096, lead);
    Tensor copy = t;
    t = Tensor();
    for (int64_t i = 0; i < copy.numel(); ++i) copy.data<float>()[i] = static_cast<float>(i);
    EXPECT_EQ(copy.at(copy.numel() - 1), static_cast<double>(copy.numel() - 1));
  }
  EXPECT_THROW(Tensor::uninitialized_at(DType::F32, Shape{8}, false, 6), Error);
}

}  // namespace
}  // namespace shardwise
