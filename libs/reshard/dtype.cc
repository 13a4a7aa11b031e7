#include "libs/reshard/dtype.h"

namespace rlfleet::reshard {

const DTypeRow& RowOf(DType dtype) {
  for (const DTypeRow& row : kDTypes) {
    if (row.dtype == dtype) return row;
  }
  return kDTypes[0];  // (unreachable: every enum value is in the table; dtype_test checks)
}

std::optional<DType> DTypeOfSafetensors(std::string_view name) {
  for (const DTypeRow& row : kDTypes) {
    if (name == row.safetensors) return row.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeOfProto(v1::DType dtype) {
  for (const DTypeRow& row : kDTypes) {
    if (dtype == row.proto) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace rlfleet::reshard
