#include "sluice/core/shape.h"

#include <gtest/gtest.h>

#include "sluice/core/error.h"

namespace sluice {
namespace {

TEST(Shape, NumelAndStrides) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  Strides st = s.ContiguousStrides();
  EXPECT_EQ(st[0], 12);
  EXPECT_EQ(st[1], 4);
  EXPECT_EQ(st[2], 1);
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(s.ToString(), "[2, 3, 4]");
}

TEST(Shape, BroadcastAlignsTrailingDimensions) {
  EXPECT_EQ(Broadcast(Shape{4, 1, 3}, Shape{5, 1}), (Shape{4, 5, 3}));
  EXPECT_EQ(Broadcast(Shape{}, Shape{2, 2}), (Shape{2, 2}));
  EXPECT_EQ(Broadcast(Shape{7}, Shape{7}), (Shape{7}));
}

TEST(Shape, BroadcastMismatchIsAClearError) {
  try {
    Broadcast(Shape{2, 3}, Shape{4, 3});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 3]"), std::string::npos) << e.what();
  }
}

TEST(Shape, RejectsNegativeAndTooManyDims) {
  EXPECT_THROW((Shape{2, -1}), ShapeError);
  EXPECT_THROW((Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), ShapeError);
  EXPECT_THROW(Shape({2, 3}).Axis(2), ShapeError);
  EXPECT_EQ(Shape({2, 3}).Axis(-1), 1);
}

}  // namespace
}  // namespace sluice
