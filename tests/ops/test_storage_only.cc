// Ops refuse the storage-only dtypes (u16, u32, u64), naming the op and the dtype: at shape
// inference (a graph being built), when a kernel runs, and when a tensor would be converted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "../support/error_of.h"

namespace shardwise::ops {
namespace {

TEST(StorageOnlyDTypes, AnOpOnThemIsAnErrorNamingTheOpAndTheDtype) {
  const OpDef& add = op_registry().get("add");
  for (DType d : kStorageOnlyDTypes) {
    const std::string name(dtype_name(d));
    std::vector<TensorMeta> metas = {{Shape{2}, DType::F32}, {Shape{2}, d}};
    std::string msg = error_of([&] { infer_checked(add, metas, {}); });
    EXPECT_NE(msg.find("op 'add', input 1: dtype " + name + " is storage-only"), std::string::npos) << msg;
    std::vector<Tensor> in = {Tensor(d, Shape{2}), Tensor(d, Shape{2})};
    msg = error_of([&] { run_forward(add, in, {}); });
    EXPECT_NE(msg.find("op 'add', input 0: dtype " + name + " is storage-only"), std::string::npos) << msg;
    msg = error_of([&] { in[0].to(DType::F64); });
    EXPECT_NE(msg.find("converting " + name + " to f64: dtype " + name + " is storage-only"), std::string::npos) << msg;
    msg = error_of([&] { Tensor(DType::I64, Shape{1}).to(d); });
    EXPECT_NE(msg.find("is storage-only"), std::string::npos) << msg;
  }
}

TEST(StorageOnlyDTypes, TensorsOfThemHoldAndCopyBytes) {
  Tensor t = Tensor::uninitialized(DType::U64, Shape{2, 2});
  for (int i = 0; i < 4; ++i) t.data<uint64_t>()[i] = ~uint64_t{0} - static_cast<uint64_t>(i);
  const int64_t offsets[] = {1, 0};
  Tensor row = t.slice(offsets, Shape{1, 2});
  EXPECT_EQ(row.data<uint64_t>()[0], ~uint64_t{0} - 2);
  EXPECT_EQ(row.data<uint64_t>()[1], ~uint64_t{0} - 3);
  EXPECT_EQ(t.clone().data<uint64_t>()[3], ~uint64_t{0} - 3);
  EXPECT_EQ(Tensor(DType::U16, Shape{3}).nbytes(), 6u);
}

}  // namespace
}  // namespace shardwise::ops
