#include "shardwise/ckpt/st_dtype.h"

#include <array>
#include <utility>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

struct Row {
  StDType st;
  std::string_view name;
  size_t size;
  std::optional<DType> tensor;
};
constexpr std::array<Row, 15> kRows = {{
    {StDType::BOOL, "BOOL", 1, DType::Bool},  {StDType::U8, "U8", 1, DType::U8},
    {StDType::I8, "I8", 1, DType::I8},        {StDType::F8_E5M2, "F8_E5M2", 1, std::nullopt},
    {StDType::F8_E4M3, "F8_E4M3", 1, std::nullopt}, {StDType::I16, "I16", 2, std::nullopt},
    {StDType::U16, "U16", 2, DType::U16},
    {StDType::F16, "F16", 2, DType::F16},     {StDType::BF16, "BF16", 2, DType::BF16},
    {StDType::I32, "I32", 4, DType::I32},     {StDType::U32, "U32", 4, DType::U32},     {StDType::F32, "F32", 4, DType::F32},
    {StDType::F64, "F64", 8, DType::F64},     {StDType::I64, "I64", 8, DType::I64},     {StDType::U64, "U64", 8, DType::U64},
}};

const Row& row(StDType d) {
  auto i = static_cast<size_t>(d);
  SW_CHECK(i < kRows.size(), "unknown safetensors dtype code {}", i);
  return kRows[i];
}

}  // namespace

std::string_view st_dtype_name(StDType dtype) { return row(dtype).name; }
size_t st_dtype_size(StDType dtype) { return row(dtype).size; }
std::optional<DType> to_tensor_dtype(StDType dtype) { return row(dtype).tensor; }

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const Row& r : kRows) {
    if (r.name == name) return r.st;
  }
  return std::nullopt;
}

std::string_view st_dtype_names() { return "BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64"; }

StDType to_st_dtype(DType dtype) {
  for (const Row& r : kRows) {
    if (r.tensor == dtype) return r.st;
  }
  fail("dtype {} has no safetensors name", dtype_name(dtype));
}

}  // namespace shardwise::ckpt
