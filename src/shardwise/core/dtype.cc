#include "shardwise/core/dtype.h"

#include <array>
#include <string>
#include <utility>

#include "shardwise/core/error.h"

namespace shardwise {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F64: case DType::I64: case DType::U64: return 8;
    case DType::F16: case DType::BF16: case DType::U16: return 2;
    case DType::I8: case DType::U8: case DType::Bool: return 1;
  }
  fail("unknown dtype code {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I64: return "i64";
    case DType::I32: return "i32";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
    case DType::Bool: return "bool";
    case DType::U16: return "u16";
    case DType::U32: return "u32";
    case DType::U64: return "u64";
  }
  fail("unknown dtype code {}", static_cast<int>(dtype));
}

DType parse_dtype(std::string_view text) {
  static const std::array<std::pair<std::string_view, DType>, 24> names = {{
      {"f32", DType::F32}, {"float32", DType::F32}, {"float", DType::F32},
      {"f64", DType::F64}, {"float64", DType::F64}, {"double", DType::F64},
      {"f16", DType::F16}, {"float16", DType::F16}, {"half", DType::F16},
      {"bf16", DType::BF16}, {"bfloat16", DType::BF16},
      {"i64", DType::I64}, {"int64", DType::I64},
      {"i32", DType::I32}, {"int32", DType::I32},
      {"i8", DType::I8}, {"u8", DType::U8}, {"bool", DType::Bool},
      {"u16", DType::U16}, {"uint16", DType::U16}, {"u32", DType::U32}, {"uint32", DType::U32},
      {"u64", DType::U64}, {"uint64", DType::U64},
  }};
  for (const auto& [name, dtype] : names) {
    if (name == text) return dtype;
  }
  if (text == "int8") return DType::I8;
  if (text == "uint8") return DType::U8;
  fail("unknown dtype '{}': expected one of f32, f64, f16, bf16, i64, i32, i8, u8, bool, u16, u32, u64", text);
}

bool is_floating(DType d) { return d == DType::F32 || d == DType::F64 || d == DType::F16 || d == DType::BF16; }
bool is_integral(DType d) { return d == DType::I64 || d == DType::I32 || d == DType::I8 || d == DType::U8; }
bool is_signed(DType d) { return is_floating(d) || d == DType::I64 || d == DType::I32 || d == DType::I8; }
bool is_storage_only(DType d) { return d == DType::U16 || d == DType::U32 || d == DType::U64; }

void check_computable(DType dtype, std::string_view what) {
  SW_CHECK(!is_storage_only(dtype), "{}: dtype {} is storage-only (checkpoints, reshards and Python arrays move its "
           "bytes; no op computes on it): convert the values to a dtype ops take (i64, f32, ...) first", what,
           dtype_name(dtype));
}

}  // namespace shardwise
