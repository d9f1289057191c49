// Packed layouts (formats/layout.h): offsets, pack and unpack, and every malformed layout the
// loader must refuse.
#include <gtest/gtest.h>

#include <numeric>

#include "formats/layout.h"
#include "formats/tensor.h"

namespace kiln {
namespace {

Tensor iota_f32(std::vector<int64_t> shape) {
  Tensor t(DType::f32, std::move(shape));
  std::iota(t.data<float>(), t.data<float>() + t.numel(), 1.0f);
  return t;
}

// oneDNN's BA16a64b4a on [a, b] = [37, 70]: a padded to 64 (blocks 16·4), b to 128 (64); the
// b blocks outermost. Blocks are 16·64·4 = 4096 elements.
PackedLayout ba16a64b4a_37x70() {
  return PackedLayout{{37, 70}, {64, 128}, {4096, 4096}, {16, 64, 4}, {0, 1, 0}, "test"};
}

TEST(PackedLayout, OffsetsFollowTheBlocks) {
  const PackedLayout l = ba16a64b4a_37x70();
  EXPECT_EQ(l.storage_elements(), 2 * 4096);
  EXPECT_FALSE(check_layout(l, 37 * 70, 2 * 4096 * 4, 4));
  const Tensor packed = pack(iota_f32({37, 70}), l);
  ASSERT_TRUE(packed.is_packed());
  EXPECT_EQ(packed.nbytes(), 2u * 4096 * 4);
  const float* p = packed.data<float>();
  // Element (a, b) sits at (b / 64)·4096 + (a / 4 % 16)·256 + (b % 64)·4 + a % 4.
  for (int64_t a : {0, 3, 4, 36})
    for (int64_t b : {0, 1, 63, 64, 69})
      EXPECT_EQ(p[b / 64 * 4096 + a / 4 % 16 * 256 + b % 64 * 4 + a % 4], static_cast<float>(a * 70 + b + 1)) << a << "," << b;
  // Padding is zero: (a, b) = (40, 0) and (0, 100) are outside the tensor.
  EXPECT_EQ(p[40 / 4 % 16 * 256 + 40 % 4], 0.0f);
  EXPECT_EQ(p[4096 + (100 % 64) * 4], 0.0f);
  EXPECT_EQ(l.str(), "37x70 padded to 64x128 in 16x64x4 blocks on dims 0,1,0, strides 4096x4096");
}

TEST(PackedLayout, UnpackInvertsPackOnEveryShape) {
  struct Case { std::vector<int64_t> shape; PackedLayout layout; };
  const std::vector<Case> cases = {
      {{37, 70}, ba16a64b4a_37x70()},
      // Plain row-major, described as a layout.
      {{5, 7}, {{5, 7}, {5, 7}, {7, 1}, {}, {}, ""}},
      // Column-major: a transposed operand.
      {{5, 7}, {{5, 7}, {5, 7}, {1, 5}, {}, {}, ""}},
      // A grouped conv's [O, I/g, kh, kw] = [6, 2, 3, 3] as [g, O/g, I/g, kh, kw] with O blocked
      // by 8 (padded from 3), the layout oneDNN calls gOIhw8o.
      {{6, 2, 3, 3}, {{2, 3, 2, 3, 3}, {2, 8, 2, 3, 3}, {144, 144, 72, 24, 8}, {8}, {1}, ""}},
      // Rank 1 with a tail.
      {{13}, {{13}, {16}, {8}, {8}, {0}, ""}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.layout.str());
    const Tensor plain = iota_f32(c.shape);
    ASSERT_FALSE(check_layout(c.layout, plain.numel(), static_cast<size_t>(c.layout.storage_elements()) * 4, 4));
    const Tensor packed = pack(plain, c.layout);
    const Tensor back = unpack(packed);
    EXPECT_FALSE(back.is_packed());
    EXPECT_EQ(back.shape(), c.shape);
    EXPECT_EQ(std::memcmp(back.raw(), plain.raw(), plain.nbytes()), 0);
    // A clone keeps its layout and owns its bytes.
    const Tensor copy = packed.clone();
    ASSERT_TRUE(copy.is_packed());
    EXPECT_NE(copy.raw(), packed.raw());
    EXPECT_EQ(std::memcmp(copy.raw(), packed.raw(), packed.nbytes()), 0);
  }
}

TEST(PackedLayout, MalformedLayoutsAreRefused) {
  const size_t bytes = 2 * 4096 * 4;
  auto why = [&](PackedLayout l, int64_t numel = 37 * 70, size_t storage = 2 * 4096 * 4) {
    return check_layout(l, numel, storage, 4).value_or("accepted");
  };
  PackedLayout l = ba16a64b4a_37x70();
  EXPECT_EQ(why(l), "accepted");
  EXPECT_EQ(why({{}, {}, {}, {}, {}, ""}, 1, bytes), "a packed layout has 1 to 12 dims, not 0");
  l = ba16a64b4a_37x70();
  l.strides.pop_back();
  EXPECT_EQ(why(l), "packed layout has 2 dims but 2 padded dims and 1 strides");
  l = ba16a64b4a_37x70();
  l.inner_dims.pop_back();
  EXPECT_EQ(why(l), "packed layout has 3 inner blocks and 2 block dims (at most 12)");
  EXPECT_EQ(why(ba16a64b4a_37x70(), 37 * 71), "packed layout dims 37x70 do not hold the tensor's 2627 elements");
  l = ba16a64b4a_37x70();
  l.inner_dims[1] = 2;
  EXPECT_EQ(why(l), "packed layout block 1 splits dim 2 of 2");
  l = ba16a64b4a_37x70();
  l.inner_blocks[0] = 0;
  EXPECT_EQ(why(l), "packed layout block 0 has size 0");
  l = ba16a64b4a_37x70();
  l.padded_dims[0] = 48;  // not a multiple of 64
  EXPECT_EQ(why(l), "packed layout dim 0 of 37 is padded to 48, not a multiple of its block 64 at least as large");
  l = ba16a64b4a_37x70();
  l.strides[1] = -1;
  EXPECT_EQ(why(l), "packed layout dim 1 has stride -1");
  l = ba16a64b4a_37x70();
  l.strides[1] = int64_t{1} << 62;
  EXPECT_EQ(why(l), "packed layout offsets overflow");
  EXPECT_EQ(why(ba16a64b4a_37x70(), 37 * 70, bytes - 4),
            "packed layout 37x70 padded to 64x128 in 16x64x4 blocks on dims 0,1,0, strides 4096x4096 addresses 32768 bytes but the "
            "data has 32764");
  // Every element at offset 0: in bounds for the layout, but smaller than the plain tensor.
  EXPECT_EQ(why({{5, 7}, {5, 7}, {0, 0}, {}, {}, ""}, 35, 4), "packed data of 4 bytes is smaller than its 35 elements");
}

}  // namespace
}  // namespace kiln
