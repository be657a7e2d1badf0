#include "sluice/core/spelling.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("transpose_b", "transpose_b"), 0u);
  EXPECT_EQ(EditDistance("tranpose_b", "transpose_b"), 1u);    // deletion
  EXPECT_EQ(EditDistance("transposee_b", "transpose_b"), 1u);  // insertion
  EXPECT_EQ(EditDistance("transpose_c", "transpose_b"), 1u);   // substitution
  EXPECT_EQ(EditDistance("esp", "eps"), 1u);                   // adjacent swap
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(ClosestSpelling, SuggestsTheNearestCandidateOnlyWhenItIsNear) {
  const std::string_view matmul[] = {"transpose_a", "transpose_b"};
  EXPECT_EQ(ClosestSpelling("tranpose_b", matmul), "transpose_b");
  EXPECT_EQ(ClosestSpelling("transpose_bb", matmul), "transpose_b");
  EXPECT_EQ(ClosestSpelling("axis", matmul), std::nullopt);
  EXPECT_EQ(ClosestSpelling("transpose_a", matmul), std::nullopt);  // not a misspelling
  const std::string_view adamw[] = {"beta1", "beta2", "eps", "weight_decay"};
  EXPECT_EQ(ClosestSpelling("esp", adamw), "eps");
  EXPECT_EQ(ClosestSpelling("weightdecay", adamw), "weight_decay");
  EXPECT_EQ(ClosestSpelling("x", adamw), std::nullopt);
  EXPECT_EQ(ClosestSpelling("beta", adamw), "beta1");  // the first of equally near ones
  EXPECT_EQ(ClosestSpelling("anything", {}), std::nullopt);
}

}  // namespace
}  // namespace sluice
