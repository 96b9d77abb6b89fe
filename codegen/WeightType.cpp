#include "codegen/WeightType.h"

#include "ir/Error.h"

namespace rnnc::codegen {

std::string_view weightTypeName(WeightType type) {
  switch (type) {
  case WeightType::F32:
    return "fp32";
  case WeightType::F16:
    return "fp16";
  case WeightType::BF16:
    return "bf16";
  case WeightType::I8:
    return "int8";
  }
  return "?";
}

WeightType parseWeightType(std::string_view name) {
  if (name == "fp32" || name == "float32")
    return WeightType::F32;
  if (name == "fp16" || name == "float16")
    return WeightType::F16;
  if (name == "bf16" || name == "bfloat16")
    return WeightType::BF16;
  if (name == "int8" || name == "qint8")
    return WeightType::I8;
  throw UserError("unknown weights dtype '" + std::string(name) +
                  "': expected fp32, bf16, fp16 or int8");
}

int64_t weightTypeBytes(WeightType type) {
  return type == WeightType::F32 ? 4 : type == WeightType::I8 ? 1 : 2;
}

} // namespace rnnc::codegen
