// The vector Philox-4x32-10 and the fast dropout kernel (kernels/dropout.h) against Random123's
// scalar generator and the reference kernel, bitwise, on every SIMD target this machine runs:
// many keys, streams and first blocks (one whose vector of blocks carries into the counter's high
// word, one that wraps past 2^64), runs of odd lengths (the last vector of blocks crossing a
// row's end), every dtype, in place and not, and special values of x.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "for_each_target.h"
#include "sluice/kernels/dropout.h"
#include "sluice/kernels/parallel.h"

namespace sluice::kernels {
namespace {

const std::vector<uint64_t> kKeys = {0, 1, ~uint64_t{0}, 0x299f31d0a4093822, 0x00000001ffffffff};
const std::vector<uint64_t> kStreams = {0, 7, 0xffffffff, (uint64_t{1} << 40) + 3};

TEST(Philox, VectorDrawsAreTheScalarDrawsOnEveryTarget) {
  const std::vector<uint64_t> firsts = {0, 1, 3, 0x85a308d3243f6a88, 0xfffffffd, ~uint64_t{0} - 4};
  ForEachTarget([&] {
    for (uint64_t key : kKeys) {
      for (uint64_t stream : kStreams) {
        for (uint64_t first : firsts) {
          for (int64_t count : {0, 1, 2, 3, 5, 8, 9, 16, 17, 33, 100}) {
            std::vector<uint32_t> fast(4 * count + 1, 0xabcdef01), ref(4 * count);
            DropoutDrawsFast(key, stream, first, count, fast.data());
            DropoutDrawsReference(key, stream, first, count, ref.data());
            for (int64_t i = 0; i < 4 * count; ++i) {
              ASSERT_EQ(fast[i], ref[i]) << "key " << key << " stream " << stream << " first "
                                         << first << " count " << count << " word " << i;
            }
            EXPECT_EQ(fast[4 * count], 0xabcdef01u) << "nothing written past 4·count words";
          }
        }
      }
    }
  });
}

// The reference's own draws are Random123's: the known answer of the digits of π (dropout_test.cc
// holds DropoutDraws to it).
TEST(Philox, ReferenceDrawsAreDropoutDrawsInElementOrder) {
  std::vector<uint32_t> out(8);
  DropoutDrawsReference(0x299f31d0a4093822, 0x0370734413198a2e, 0x85a308d3243f6a87, 2, out.data());
  EXPECT_EQ(out[4], 0xd16cfe09u);
  EXPECT_EQ(out[5], 0x94fdccebu);
  EXPECT_EQ(out[6], 0x5001e420u);
  EXPECT_EQ(out[7], 0x24126ea1u);
}

template <typename T>
T From(double v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return FloatToBF16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// x: random values with NaN, ±inf, ±0 and a denormal sprinkled in.
template <typename T>
std::vector<T> Inputs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-3, 3);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             0.0,
                             -0.0,
                             1e-40,
                             3e38};
  std::vector<T> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = From<T>(i % 7 == 3 ? specials[(i / 7) % std::size(specials)] : u(rng));
  }
  return x;
}

template <typename T>
class DropoutKernel : public ::testing::Test {};
using DropTypes = ::testing::Types<float, double, BFloat16>;
TYPED_TEST_SUITE(DropoutKernel, DropTypes);

TYPED_TEST(DropoutKernel, FastIsBitwiseTheReferenceOnEveryTarget) {
  using T = TypeParam;
  ForEachTarget([] {
    for (int64_t run : std::vector<int64_t>{1, 3, 4, 5, 31, 33, 63, 65, 129, kChunkElements + 3,
                                            2 * kChunkElements}) {
      for (int64_t rows : {1, 3}) {
        const int64_t n = run * rows;
        const std::vector<T> x = Inputs<T>(n, static_cast<uint32_t>(n));
        const std::vector<int64_t> keys = {12345, -9, 0x7fffffffffffffff};
        const std::span<const int64_t> row_keys(keys.data(), static_cast<size_t>(rows));
        for (double p : {0.0, 0.1, 0.5, 0.999, 1.0}) {
          for (uint64_t stream : kStreams) {
            std::vector<T> ref(x.size()), fast(x.size()), in_place = x;
            DropoutReference(x.data(), ref.data(), n, row_keys, stream, p);
            DropoutFast(x.data(), fast.data(), n, row_keys, stream, p);
            DropoutFast(in_place.data(), in_place.data(), n, row_keys, stream, p);
            ASSERT_EQ(std::memcmp(fast.data(), ref.data(), n * sizeof(T)), 0)
                << "run " << run << " rows " << rows << " p " << p << " stream " << stream;
            ASSERT_EQ(std::memcmp(in_place.data(), ref.data(), n * sizeof(T)), 0)
                << "in place: run " << run << " rows " << rows << " p " << p;
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace sluice::kernels
