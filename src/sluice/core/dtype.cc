#include "sluice/core/dtype.h"

namespace sluice {

std::string_view Name(DType t) { return EnumName(kDTypeNames, t); }

std::optional<DType> ParseDType(std::string_view name) { return ParseEnum(kDTypeNames, name); }

}  // namespace sluice
