#pragma once
// The element types of the safetensors format. The enum is in the reference library's alignment
// order (its writer sorts tensors by this order, descending, then by name); shardwise's Tensor
// lacks some of them (F8_E5M2, F8_E4M3, I16): such tensors are read and written as raw bytes. U16,
// U32 and U64 are the storage-only DTypes of the same names.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "shardwise/core/dtype.h"

namespace shardwise::ckpt {

enum class StDType : uint8_t { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

inline constexpr StDType kAllStDTypes[] = {StDType::BOOL, StDType::U8,   StDType::I8,  StDType::F8_E5M2, StDType::F8_E4M3,
                                           StDType::I16,  StDType::U16,  StDType::F16, StDType::BF16,    StDType::I32,
                                           StDType::U32,  StDType::F32,  StDType::F64, StDType::I64,     StDType::U64};

std::string_view st_dtype_name(StDType dtype);  // "F32", "F8_E4M3", ...
std::optional<StDType> parse_st_dtype(std::string_view name);
size_t st_dtype_size(StDType dtype);
// "BOOL, U8, ..., I64": what a file may name.
std::string_view st_dtype_names();

StDType to_st_dtype(DType dtype);
// The Tensor dtype of a safetensors dtype; nullopt for F8_E5M2, F8_E4M3, I16.
std::optional<DType> to_tensor_dtype(StDType dtype);

}  // namespace shardwise::ckpt
