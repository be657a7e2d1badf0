#include "sluice/step/train_config.h"

#include "sluice/core/enum_names.h"

namespace sluice {

namespace {

constexpr EnumEntry<RecomputePolicy> kRecomputePolicies[] = {
    {RecomputePolicy::kNone, "none"},         {RecomputePolicy::kCheap, "cheap"},
    {RecomputePolicy::kFull, "full"},         {RecomputePolicy::kSelective, "selective"},
    {RecomputePolicy::kSublayer, "sublayer"},
};
static_assert(IsCompleteEnumTable(kRecomputePolicies));

}  // namespace

std::string_view Name(RecomputePolicy policy) { return EnumName(kRecomputePolicies, policy); }
std::optional<RecomputePolicy> ParseRecomputePolicy(std::string_view name) {
  return ParseEnum(kRecomputePolicies, name);
}
std::string RecomputePolicyNames() { return EnumNames(kRecomputePolicies); }

}  // namespace sluice
