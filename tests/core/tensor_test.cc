#include "sluice/core/tensor.h"

#include <gtest/gtest.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/system_allocator.h"

namespace sluice {
namespace {

TEST(Tensor, ViewSeesWritesThroughItsBase) {
  Tensor x = Tensor::Zeros({2, 3}, DType::kF32);
  Tensor v = x.Reshape({3, 2});
  EXPECT_EQ(v.storage(), x.storage());
  x.data<float>()[5] = 7.0f;
  EXPECT_EQ(v.At({2, 1}), 7.0);
  Tensor s = x.Slice(1, 1, 3);
  x.data<float>()[4] = 3.0f;  // x[1, 1]
  EXPECT_EQ(s.At({1, 0}), 3.0);
}

TEST(Tensor, TransposeSwapsStrides) {
  Tensor x = Tensor::FromVector<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor t = x.Transpose(0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides()[0], 1);
  EXPECT_EQ(t.strides()[1], 3);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.At({2, 1}), 5.0);
  Tensor c = t.Contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(c.FlatAt(1), 3.0);
}

TEST(Tensor, PermuteAndReshapeOfNonContiguousCopies) {
  Tensor x = Tensor::FromVector<double>({2, 3, 4}, std::vector<double>(24, 1.0));
  for (int i = 0; i < 24; ++i) x.data<double>()[i] = i;
  const int64_t order[] = {2, 0, 1};
  Tensor p = x.Permute(order);
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.At({3, 1, 2}), x.At({1, 2, 3}));
  Tensor r = p.Reshape({4, 6});
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_EQ(r.At({3, 5}), x.At({1, 2, 3}));
}

TEST(Tensor, BadViewsAreErrors) {
  Tensor x = Tensor::Zeros({2, 3}, DType::kF32);
  EXPECT_THROW(x.Reshape({4, 2}), ShapeError);
  EXPECT_THROW(x.Slice(1, 2, 4), ShapeError);
  EXPECT_THROW(x.Transpose(0, 2), ShapeError);
  EXPECT_THROW(x.data<double>(), ShapeError);
}

TEST(Tensor, ToStringIsReadable) {
  Tensor x = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4.5});
  EXPECT_EQ(x.ToString(), "Tensor(f32[2, 2], [[1, 2], [3, 4.5]])");
}

// Regression: integers were printed through a double, so 2^53 + 1 printed as 2^53, and 2^63 - 1
// rounded to 2^63, which the cast back to int64_t could not hold (undefined behaviour).
TEST(Tensor, ToStringPrintsIntegersExactly) {
  const Tensor big =
      Tensor::FromVector<int64_t>({3}, {INT64_MAX, INT64_MIN, (int64_t{1} << 53) + 1});
  EXPECT_EQ(big.ToString(),
            "Tensor(i64[3], [9223372036854775807, -9223372036854775808, 9007199254740993])");
  const Tensor columns = Tensor::FromVector<int32_t>({2, 2}, {INT32_MAX, 1, 2, INT32_MIN})
                             .Transpose(0, 1);  // a strided view
  EXPECT_EQ(columns.ToString(), "Tensor(i32[2, 2], [[2147483647, 2], [1, -2147483648]])");
}

TEST(Tensor, StorageReturnsMemoryToItsAllocator) {
  SystemAllocator alloc;
  {
    Tensor x = Tensor::Zeros({256, 256}, DType::kF32, alloc);
    Tensor view = x.Transpose(0, 1);
    EXPECT_EQ(alloc.Stats().allocated_bytes, 256 * 256 * 4);
    x = Tensor();
    EXPECT_EQ(alloc.Stats().allocated_bytes, 256 * 256 * 4) << "the view keeps the storage alive";
  }
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.Stats().num_frees, 1);
}

// AssignEmpty gives what Empty gives, whatever the tensor was: a strided view, an offset slice, a
// tensor of another shape or dtype, an undefined one; it drops the old storage's reference only.
TEST(Tensor, AssignEmptyIsLikeAssigningEmpty) {
  SystemAllocator alloc;
  Tensor base = Tensor::Zeros({4, 6}, DType::kF32, alloc);
  const Tensor kept = base;  // the old storage outlives the reassigned handles
  std::vector<Tensor> before = {base.Transpose(0, 1),
                                base.Slice(0, 1, 3),
                                base.Reshape({6, 4}),
                                Tensor::Zeros({3, 2}, DType::kF64, alloc),
                                Tensor(),
                                base};
  for (Tensor& t : before) {
    t.AssignEmpty({6, 4}, DType::kF32, alloc);
    const Tensor expected = Tensor::Empty({6, 4}, DType::kF32, alloc);
    EXPECT_EQ(t.shape(), expected.shape());
    EXPECT_EQ(t.dtype(), DType::kF32);
    EXPECT_EQ(t.offset(), 0);
    EXPECT_EQ(t.strides(), expected.strides());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_NE(t.storage(), kept.storage());
    EXPECT_EQ(t.storage()->nbytes(), 6 * 4 * sizeof(float));
  }
  EXPECT_EQ(kept.storage().use_count(), 2);  // kept and base
  before.clear();
  EXPECT_EQ(alloc.Stats().allocated_bytes, 4 * 6 * sizeof(float));
}

// A vacated storage gives its memory back at once and keeps its object; AssignEmpty refills it when
// the tensor alone holds it (the allocator sees one free and one allocation, as for a new storage)
// and makes a new storage when another handle shares it or the size differs.
TEST(Tensor, AssignEmptyRefillsAVacantStorageItHoldsAlone) {
  SystemAllocator system;
  CachingAllocator caching;
  for (Allocator* alloc : {static_cast<Allocator*>(&system), static_cast<Allocator*>(&caching)}) {
    Tensor t = Tensor::Empty({16}, DType::kF32, *alloc);
    const Storage* first = t.storage().get();
    for (int round = 0; round < 3; ++round) {
      t.storage()->Vacate();
      EXPECT_TRUE(t.storage()->vacant());
      EXPECT_EQ(t.storage()->data(), nullptr);
      EXPECT_EQ(alloc->Stats().allocated_bytes, 0);
      t.AssignEmpty({16}, DType::kF32, *alloc);
      EXPECT_EQ(t.storage().get(), first) << "refilled, not made anew";
      EXPECT_FALSE(t.storage()->vacant());
      EXPECT_EQ(alloc->Stats().allocated_bytes, 64);
      t.data<float>()[15] = 1.0f;
    }
    t.storage()->Vacate();
    const Tensor other = t;  // a second handle: never refilled under it
    t.AssignEmpty({16}, DType::kF32, *alloc);
    EXPECT_NE(t.storage().get(), first);
    EXPECT_TRUE(other.storage()->vacant());
    t.storage()->Vacate();
    t.AssignEmpty({32}, DType::kF32, *alloc);  // another size: a new storage
    EXPECT_EQ(t.storage()->nbytes(), 128);
    EXPECT_EQ(alloc->Stats().allocated_bytes, 128);
    EXPECT_EQ(alloc->Stats().num_allocs, 6);
    EXPECT_EQ(alloc->Stats().num_frees, 5);
  }
  caching.CheckInvariants();
}

// Storage::SwapMemory: every tensor and view of either storage sees the other's memory, the
// memory goes back to its allocator as usual, and storages of different sizes are refused.
TEST(Tensor, SwapMemoryExchangesWhatEveryHolderSees) {
  CachingAllocator caching;
  {
    Tensor a = Tensor::Full({4}, 1.0, DType::kF32, caching);
    Tensor b = Tensor::Full({4}, 2.0, DType::kF32, caching);
    const Tensor a_view = a.Slice(0, 1, 3);
    const Tensor b_holder = b;
    Storage::SwapMemory(*a.storage(), *b.storage());
    EXPECT_EQ(a.data<float>()[0], 2.0f);
    EXPECT_EQ(a_view.data<float>()[0], 2.0f);
    EXPECT_EQ(b_holder.data<float>()[3], 1.0f);
    Storage::SwapMemory(*a.storage(), *b.storage());
    EXPECT_EQ(a_view.data<float>()[1], 1.0f);
    EXPECT_EQ(b_holder.data<float>()[0], 2.0f);
    const Tensor c = Tensor::Zeros({5}, DType::kF32, caching);
    EXPECT_THROW(Storage::SwapMemory(*a.storage(), *c.storage()), InternalError);
  }
  EXPECT_EQ(caching.Stats().allocated_bytes, 0);
  caching.CheckInvariants();
}

}  // namespace
}  // namespace sluice
