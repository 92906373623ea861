#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardwise/core/half.h"

namespace shardwise {

// U16, U32 and U64 (safetensors' unsigned types) are storage-only: tensors of them are created,
// read, written to checkpoints, resharded and handed to Python as bytes, but no op computes on
// them (ops::infer_checked, run_forward and SW_DISPATCH refuse them, naming the dtype).
enum class DType : uint8_t { F32, F64, F16, BF16, I64, I32, I8, U8, Bool, U16, U32, U64 };

// The dtypes ops compute on.
inline constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64,
                                       DType::I32, DType::I8,  DType::U8,  DType::Bool};
inline constexpr DType kStorageOnlyDTypes[] = {DType::U16, DType::U32, DType::U64};

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "bf16", "bool", ...
DType parse_dtype(std::string_view text);  // accepts the names above and float32/float/int64/...
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // integer types, not bool
bool is_signed(DType dtype);
bool is_storage_only(DType dtype);  // u16, u32, u64: bytes only, no arithmetic
// Fails naming `what` (an op) and the dtype when `dtype` is storage-only.
void check_computable(DType dtype, std::string_view what);

template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::I8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::U16; };
template <> struct dtype_of<uint32_t> { static constexpr DType value = DType::U32; };
template <> struct dtype_of<uint64_t> { static constexpr DType value = DType::U64; };
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// The type arithmetic is done in: float for the 16-bit floats, the type itself otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<f16> { using type = float; };
template <> struct compute_type<bf16> { using type = float; };
template <class T>
using compute_t = typename compute_type<T>::type;

template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, f16> ||
                                   std::is_same_v<T, bf16>;

}  // namespace shardwise

// Calls `__VA_ARGS__` (a generic lambda body expression) with `T` bound to the C++ type of `dtype`;
// a storage-only dtype (u16, u32, u64) is an Error naming it.
#define SW_DTYPE_CASE(E, TYPE, ...) \
  case ::shardwise::DType::E: {     \
    using T = TYPE;                 \
    return __VA_ARGS__();           \
  }
#define SW_DISPATCH(dtype, ...)                                                        \
  [&] {                                                                                \
    switch (dtype) {                                                                   \
      SW_DTYPE_CASE(F32, float, __VA_ARGS__)                                           \
      SW_DTYPE_CASE(F64, double, __VA_ARGS__)                                          \
      SW_DTYPE_CASE(F16, ::shardwise::f16, __VA_ARGS__)                                \
      SW_DTYPE_CASE(BF16, ::shardwise::bf16, __VA_ARGS__)                              \
      SW_DTYPE_CASE(I64, int64_t, __VA_ARGS__)                                         \
      SW_DTYPE_CASE(I32, int32_t, __VA_ARGS__)                                         \
      SW_DTYPE_CASE(I8, int8_t, __VA_ARGS__)                                           \
      SW_DTYPE_CASE(U8, uint8_t, __VA_ARGS__)                                          \
      SW_DTYPE_CASE(Bool, bool, __VA_ARGS__)                                           \
      case ::shardwise::DType::U16:                                                    \
      case ::shardwise::DType::U32:                                                    \
      case ::shardwise::DType::U64:                                                    \
        ::shardwise::check_computable(dtype, "a computation");                         \
    }                                                                                  \
    ::shardwise::fail("unknown dtype code {}", static_cast<int>(dtype));               \
  }()
