#include "sluice/core/enum_names.h"

#include <gtest/gtest.h>

#include "sluice/core/dtype.h"

namespace sluice {
namespace {

enum class Colour : uint8_t { kRed, kGreen, kBlue };

constexpr EnumEntry<Colour> kColourNames[] = {
    {Colour::kRed, "red"},
    {Colour::kGreen, "green"},
    {Colour::kBlue, "blue"},
};
static_assert(IsCompleteEnumTable(kColourNames));
static_assert(EnumName(kColourNames, Colour::kGreen) == "green");
static_assert(ParseEnum(kColourNames, "blue") == Colour::kBlue);

// What IsCompleteEnumTable refuses.
constexpr EnumEntry<Colour> kMissingGreen[] = {{Colour::kRed, "red"}, {Colour::kBlue, "blue"}};
static_assert(!IsCompleteEnumTable(kMissingGreen));
constexpr EnumEntry<Colour> kValueTwice[] = {
    {Colour::kRed, "red"}, {Colour::kRed, "rouge"}, {Colour::kBlue, "blue"}};
static_assert(!IsCompleteEnumTable(kValueTwice));
constexpr EnumEntry<Colour> kNameTwice[] = {
    {Colour::kRed, "red"}, {Colour::kGreen, "red"}, {Colour::kBlue, "blue"}};
static_assert(!IsCompleteEnumTable(kNameTwice));
constexpr EnumEntry<Colour> kEmptyName[] = {
    {Colour::kRed, "red"}, {Colour::kGreen, ""}, {Colour::kBlue, "blue"}};
static_assert(!IsCompleteEnumTable(kEmptyName));

TEST(EnumNames, NameAndParseAreInverse) {
  for (Colour c : {Colour::kRed, Colour::kGreen, Colour::kBlue}) {
    EXPECT_EQ(ParseEnum(kColourNames, EnumName(kColourNames, c)), c);
  }
}

TEST(EnumNames, ParseRefusesAnythingElse) {
  EXPECT_EQ(ParseEnum(kColourNames, "purple"), std::nullopt);
  EXPECT_EQ(ParseEnum(kColourNames, "Red"), std::nullopt);  // exact, case-sensitive
  EXPECT_EQ(ParseEnum(kColourNames, ""), std::nullopt);
  EXPECT_EQ(ParseEnum(kColourNames, "red "), std::nullopt);
}

TEST(EnumNames, AValueOutsideTheEnumIsNamedQuestionMark) {
  EXPECT_EQ(EnumName(kColourNames, static_cast<Colour>(7)), "?");
}

TEST(EnumNames, ListsTheChoicesInTableOrder) {
  EXPECT_EQ(EnumNames(kColourNames), "red|green|blue");
  EXPECT_EQ(EnumNames(kColourNames, ", "), "red, green, blue");
}

TEST(EnumNames, DTypeNamesAreTheTextFormats) {
  EXPECT_EQ(Name(DType::kBF16), "bf16");
  EXPECT_EQ(ParseDType("i64"), DType::kI64);
  EXPECT_EQ(ParseDType("float32"), std::nullopt);
  EXPECT_EQ(EnumNames(kDTypeNames, ", "), "f32, f64, bf16, f16, i32, i64");
}

}  // namespace
}  // namespace sluice
