#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "shardwise/core/attrs.h"
#include "shardwise/core/dtype.h"
#include "shardwise/core/error.h"
#include "shardwise/core/shape.h"

namespace shardwise {
namespace {

TEST(DType, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_THROW(parse_dtype("f128"), Error);
  EXPECT_TRUE(is_floating(DType::BF16));
  EXPECT_FALSE(is_integral(DType::Bool));
}

TEST(DType, StorageOnlyUnsignedTypesHaveNamesAndSizesButNoArithmetic) {
  EXPECT_EQ(dtype_size(DType::U16), 2u);
  EXPECT_EQ(dtype_size(DType::U32), 4u);
  EXPECT_EQ(dtype_size(DType::U64), 8u);
  for (DType d : kStorageOnlyDTypes) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
    EXPECT_TRUE(is_storage_only(d));
    EXPECT_FALSE(is_floating(d) || is_integral(d) || is_signed(d));
  }
  for (DType d : kAllDTypes) EXPECT_FALSE(is_storage_only(d));
  EXPECT_EQ(parse_dtype("uint32"), DType::U32);
  try {
    SW_DISPATCH(DType::U32, [&] { return sizeof(T); });
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dtype u32 is storage-only"), std::string::npos) << e.what();
  }
}

TEST(Half, F16RoundTripsAndRoundsToNearestEven) {
  // Exactly representable values survive; known bit patterns from IEEE 754 binary16.
  EXPECT_EQ(f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(f16(1e6f).bits, 0x7c00);                  // overflow -> inf
  EXPECT_EQ(f16(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(static_cast<float>(f16(0.333333f)), 0.333251953125f);
  EXPECT_EQ(f16(1.0f + 1.0f / 2048).bits, 0x3c00);  // halfway: ties to even (down)
  EXPECT_EQ(f16(1.0f + 3.0f / 2048).bits, 0x3c02);  // halfway: ties to even (up)
  EXPECT_TRUE(std::isnan(static_cast<float>(f16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t bits = 0; bits < 0x7c00; bits += 7) {
    f16 h;
    h.bits = static_cast<uint16_t>(bits);
    EXPECT_EQ(f16(static_cast<float>(h)).bits, bits);
  }
}

TEST(Half, Bf16TruncatesWithRounding) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(bf16(3.140625f)), 3.140625f);
  EXPECT_EQ(bf16(1.00390625f).bits, 0x3f80);  // halfway to even
  EXPECT_EQ(bf16(1.01171875f).bits, 0x3f82);
}

TEST(Shape, ParseNumelAxis) {
  Shape s = parse_shape("8x16");
  EXPECT_EQ(s.ndim(), 2);
  EXPECT_EQ(s.numel(), 128);
  EXPECT_EQ(s.to_string(), "8x16");
  EXPECT_EQ(parse_shape("[2,3,4]"), (Shape{2, 3, 4}));
  EXPECT_EQ(parse_shape("scalar").ndim(), 0);
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(s.axis(-1), 1);
  EXPECT_THROW(s.axis(2), Error);
  EXPECT_THROW(parse_shape("8xq"), Error);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), Error);
  EXPECT_THROW((Shape{int64_t{1} << 40, int64_t{1} << 40}.numel()), Error);
}

TEST(Attrs, ParseAndTypedAccess) {
  Attrs a = parse_attrs("axis=[0,-1],keepdim=true,scale=0.5,n=3,mode=sum");
  EXPECT_EQ(a.get_ints("axis"), (std::vector<int64_t>{0, -1}));
  EXPECT_TRUE(a.get_bool("keepdim", false));
  EXPECT_DOUBLE_EQ(a.get_float("scale", 1), 0.5);
  EXPECT_DOUBLE_EQ(a.get_float("n", 1), 3.0);
  EXPECT_EQ(a.get_ints("n"), (std::vector<int64_t>{3}));
  EXPECT_EQ(a.get_string("mode", ""), "sum");
  EXPECT_EQ(a.get_int("missing", 7), 7);
  EXPECT_THROW(a.get_int("mode", 0), Error);
  EXPECT_THROW(a.get_int("missing"), Error);
  EXPECT_THROW(parse_attrs("novalue"), Error);
  EXPECT_EQ(a.to_string(), "axis=[0,-1],keepdim=true,scale=0.5,n=3,mode=sum");
}

}  // namespace
}  // namespace shardwise
