// The element types weights move as, in one table for the tree: the planner's enum,
// its short name, its size, its safetensors name and its protobuf value. Every
// conversion between these (plans, rounds, safetensors images, the weights service's
// assembly, the rollout's install) reads this table; a dtype added here is added
// everywhere.
#ifndef RLFLEET_LIBS_RESHARD_DTYPE_H_
#define RLFLEET_LIBS_RESHARD_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "rlfleet/v1/common.pb.h"

namespace rlfleet::reshard {

enum class DType { kF32, kBF16, kF16, kI32, kI64 };

struct DTypeRow {
  DType dtype;
  const char* name;         // short, lower case: in plans and messages
  uint32_t size;            // bytes per element
  const char* safetensors;  // the safetensors header's name
  v1::DType proto;
};

inline constexpr DTypeRow kDTypes[] = {
    {DType::kF32, "f32", 4, "F32", v1::DTYPE_FLOAT32}, {DType::kBF16, "bf16", 2, "BF16", v1::DTYPE_BFLOAT16},
    {DType::kF16, "f16", 2, "F16", v1::DTYPE_FLOAT16}, {DType::kI32, "i32", 4, "I32", v1::DTYPE_INT32},
    {DType::kI64, "i64", 8, "I64", v1::DTYPE_INT64},
};

// The row of `dtype` (every enum value has one).
const DTypeRow& RowOf(DType dtype);
inline uint32_t DTypeSize(DType dtype) { return RowOf(dtype).size; }
inline const char* DTypeName(DType dtype) { return RowOf(dtype).name; }
inline const char* SafetensorsName(DType dtype) { return RowOf(dtype).safetensors; }
// The dtype a safetensors header or a protobuf names; nullopt for one the planner does
// not move.
std::optional<DType> DTypeOfSafetensors(std::string_view name);
std::optional<DType> DTypeOfProto(v1::DType dtype);

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_DTYPE_H_
