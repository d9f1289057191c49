// Shape family: reference kernels against hand-computed values (odd and even sizes, zero-size and
// rank-0 tensors, every dtype width), user errors for bad indices and sizes, and inference that
// folds shape arithmetic so exported transformer Reshapes stay static.
#include <gtest/gtest.h>

#include <numeric>

#include "formats/infer.h"
#include "formats/op_schema.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::make;
using testing::node;
using testing::run_op;
using testing::stored_values;

using I64 = std::vector<int64_t>;

// 0, 1, 2, … as T.
template <class T>
Tensor iota(I64 shape) {
  Tensor t(dtype_of<T>::value, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(i);
  return t;
}

std::vector<Tensor> ok(Result<std::vector<Tensor>> r) {
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
  return r.ok() ? std::move(r).value() : std::vector<Tensor>{};
}

// The run fails with a user error whose message contains `what` and names the node (stricter than
// testing::expect_user_error, which checks only the `what` part).
void expect_node_user_error(Result<std::vector<Tensor>> r, const std::string& what) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user) << r.error().message();
  EXPECT_NE(r.error().message().find(what), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("node 'n'"), std::string::npos) << r.error().message();
}

TEST(ShapeOps, TransposeMatchesPlainLoopOnOddSizes) {
  Tensor x = iota<float>({3, 5, 7});
  auto out = ok(run_op("Transpose", {x}, {attr("perm", I64{2, 0, 1})}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (I64{7, 3, 5}));
  for (int64_t k = 0; k < 7; ++k)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(out[0].data<float>()[(k * 3 + i) * 5 + j], x.data<float>()[(i * 5 + j) * 7 + k]);
  // Inner dims kept together (the BERT head transpose), 2-byte and 1-byte elements.
  Tensor h = iota<int16_t>({2, 3, 4, 6});
  auto t = ok(run_op("Transpose", {h}, {attr("perm", I64{0, 2, 1, 3})}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t n = 0; n < 3; ++n)
        for (int64_t d = 0; d < 6; ++d)
          EXPECT_EQ(t[0].data<int16_t>()[((b * 4 + s) * 3 + n) * 6 + d], h.data<int16_t>()[((b * 3 + n) * 4 + s) * 6 + d]);
  auto def = ok(run_op("Transpose", {iota<int8_t>({2, 3})}));
  EXPECT_EQ(stored_values<int8_t>(def[0]), (std::vector<int8_t>{0, 3, 1, 4, 2, 5}));
  auto empty = ok(run_op("Transpose", {iota<float>({0, 3})}));
  EXPECT_EQ(empty[0].shape(), (I64{3, 0}));
}

TEST(ShapeOps, ReshapeCopiesZeroDimsAndInfersMinusOne) {
  auto out = ok(run_op("Reshape", {iota<float>({2, 3, 4}), make<int64_t>({3}, {0, -1, 2})}));
  EXPECT_EQ(out[0].shape(), (I64{2, 6, 2}));
  EXPECT_EQ(out[0].data<float>()[23], 23.0f);
  auto az = ok(run_op("Reshape", {iota<float>({0, 3}), make<int64_t>({2}, {3, 0})}, {attr("allowzero", int64_t{1})}));
  EXPECT_EQ(az[0].shape(), (I64{3, 0}));
  auto scalar = ok(run_op("Reshape", {make<float>({}, {5.0f}), make<int64_t>({1}, {-1})}));
  EXPECT_EQ(scalar[0].shape(), (I64{1}));
  expect_node_user_error(run_op("Reshape", {iota<float>({2, 3}), make<int64_t>({2}, {4, 2})}), "cannot reshape 2x3");
  expect_node_user_error(run_op("Reshape", {iota<float>({2, 3}), make<int64_t>({2}, {4, -1})}), "cannot reshape");
  expect_node_user_error(run_op("Reshape", {iota<float>({2, 3}), make<int64_t>({2}, {-1, -1})}), "more than one -1");
}

TEST(ShapeOps, SqueezeUnsqueezeFlatten) {
  auto sq = ok(run_op("Squeeze", {iota<float>({1, 3, 1, 2}), make<int64_t>({1}, {-2})}));
  EXPECT_EQ(sq[0].shape(), (I64{1, 3, 2}));
  auto all = ok(run_op("Squeeze", {iota<float>({1, 3, 1, 2})}));
  EXPECT_EQ(all[0].shape(), (I64{3, 2}));
  expect_node_user_error(run_op("Squeeze", {iota<float>({1, 3}), make<int64_t>({1}, {1})}), "cannot squeeze axis 1 of size 3");
  auto un = ok(run_op("Unsqueeze", {iota<float>({3, 2}), make<int64_t>({2}, {3, 0})}));
  EXPECT_EQ(un[0].shape(), (I64{1, 3, 2, 1}));
  auto un0 = ok(run_op("Unsqueeze", {make<int64_t>({}, {7}), make<int64_t>({1}, {0})}));
  EXPECT_EQ(stored_values<int64_t>(un0[0]), (I64{7}));
  auto fl = ok(run_op("Flatten", {iota<float>({2, 3, 5})}, {attr("axis", int64_t{-1})}));
  EXPECT_EQ(fl[0].shape(), (I64{6, 5}));
  auto fl0 = ok(run_op("Flatten", {iota<float>({2, 3})}, {attr("axis", int64_t{0})}));
  EXPECT_EQ(fl0[0].shape(), (I64{1, 6}));
}

TEST(ShapeOps, ConcatAndSplitOddSizes) {
  Tensor a = iota<float>({2, 1, 3}), b = make<float>({2, 2, 3}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21});
  Tensor e(DType::f32, {2, 0, 3});
  auto c = ok(run_op("Concat", {a, e, b}, {attr("axis", int64_t{-2})}));
  EXPECT_EQ(c[0].shape(), (I64{2, 3, 3}));
  EXPECT_EQ(stored_values<float>(c[0]), (std::vector<float>{0, 1, 2, 10, 11, 12, 13, 14, 15, 3, 4, 5, 16, 17, 18, 19, 20, 21}));
  expect_node_user_error(run_op("Concat", {iota<float>({2, 3}), iota<float>({3, 3})}, {attr("axis", int64_t{1})}), "differs");
  auto s = ok(run_op("Split", {iota<int32_t>({7})}, {attr("num_outputs", int64_t{3})}, 3));
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(stored_values<int32_t>(s[0]), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(stored_values<int32_t>(s[2]), (std::vector<int32_t>{6}));
  auto v = ok(run_op("Split", {iota<float>({2, 5}), make<int64_t>({2}, {4, 1})}, {attr("axis", int64_t{1})}, 2));
  EXPECT_EQ(stored_values<float>(v[1]), (std::vector<float>{4, 9}));
  expect_node_user_error(run_op("Split", {iota<float>({5}), make<int64_t>({2}, {1, 1})}, {}, 2), "add up to 2");
}

TEST(ShapeOps, ReplaceSlices) {
  // [2, 4]: columns 0 and 2-3 replaced, in order (the second update overwrites column 3 again).
  const std::vector<Attribute> at = {attr("axis", int64_t{1}), attr("starts", I64{0, 2})};
  auto r = ok(run_op("ReplaceSlices", {iota<float>({2, 4}), make<float>({2, 1}, {-1, -2}), make<float>({2, 2}, {10, 11, 12, 13})}, at));
  EXPECT_EQ(r[0].shape(), (I64{2, 4}));
  EXPECT_EQ(stored_values<float>(r[0]), (std::vector<float>{-1, 1, 10, 11, -2, 5, 12, 13}));
  expect_node_user_error(run_op("ReplaceSlices", {iota<float>({2, 4}), iota<float>({2, 1})}, at), "starts has 2 entries but the node has 1 updates");
  expect_node_user_error(run_op("ReplaceSlices", {iota<float>({2, 4}), iota<float>({2, 3})}, {attr("axis", int64_t{1}), attr("starts", I64{2})}),
                    "update 0 of 3 at 2 runs past axis 1's 4");
  expect_node_user_error(run_op("ReplaceSlices", {iota<float>({2, 4}), iota<float>({3, 1})}, {attr("axis", int64_t{-1}), attr("starts", I64{0})}),
                    "update 0 has shape 3x1, which differs from X's 2x4 outside axis 1");
  expect_node_user_error(run_op("ReplaceSlices", {iota<float>({2, 4}), iota<float>({2})}, {attr("axis", int64_t{1}), attr("starts", I64{0})}),
                    "update 0 has rank 1 but X has rank 2");
  expect_node_user_error(run_op("ReplaceSlices", {iota<float>({2, 4}), iota<float>({2, 1})}, {attr("axis", int64_t{1}), attr("starts", I64{-1})}),
                    "update 0 starts at -1");
}

TEST(ShapeOps, SliceClampsAndStepsBackwards) {
  Tensor x = iota<float>({4, 5});
  auto s = ok(run_op("Slice", {x, make<int64_t>({2}, {-1, 100}), make<int64_t>({2}, {-100, 0}), make<int64_t>({2}, {0, 1}),
                               make<int64_t>({2}, {-2, -2})}));
  EXPECT_EQ(s[0].shape(), (I64{2, 2}));
  EXPECT_EQ(stored_values<float>(s[0]), (std::vector<float>{19, 17, 9, 7}));
  auto t = ok(run_op("Slice", {x, make<int64_t>({1}, {1}), make<int64_t>({1}, {INT64_MAX}), make<int64_t>({1}, {1})}));
  EXPECT_EQ(t[0].shape(), (I64{4, 4}));
  EXPECT_EQ(t[0].data<float>()[0], 1.0f);
  auto empty = ok(run_op("Slice", {x, make<int64_t>({1}, {3}), make<int64_t>({1}, {1})}));
  EXPECT_EQ(empty[0].shape(), (I64{0, 5}));
  expect_node_user_error(run_op("Slice", {x, make<int64_t>({1}, {0}), make<int64_t>({1}, {1}), make<int64_t>({1}, {0}),
                                     make<int64_t>({1}, {0})}), "steps[0] is 0");
}

TEST(ShapeOps, GatherNegativeIndicesAndErrors) {
  Tensor x = iota<float>({3, 5});
  auto g = ok(run_op("Gather", {x, make<int64_t>({2}, {-1, 0})}, {attr("axis", int64_t{1})}));
  EXPECT_EQ(g[0].shape(), (I64{3, 2}));
  EXPECT_EQ(stored_values<float>(g[0]), (std::vector<float>{4, 0, 9, 5, 14, 10}));
  auto scalar_idx = ok(run_op("Gather", {x, make<int32_t>({}, {2})}));
  EXPECT_EQ(stored_values<float>(scalar_idx[0]), (std::vector<float>{10, 11, 12, 13, 14}));
  auto none = ok(run_op("Gather", {x, Tensor(DType::i64, {0})}));
  EXPECT_EQ(none[0].shape(), (I64{0, 5}));
  expect_node_user_error(run_op("Gather", {x, make<int64_t>({1}, {3})}), "index 3 is out of range for axis 0 of size 3");
  expect_node_user_error(run_op("Gather", {x, make<int64_t>({1}, {-6})}, {attr("axis", int64_t{1})}), "index -6");

  auto ge = ok(run_op("GatherElements", {iota<float>({2, 3}), make<int64_t>({2, 2}, {2, -3, 1, 1})}, {attr("axis", int64_t{1})}));
  EXPECT_EQ(stored_values<float>(ge[0]), (std::vector<float>{2, 0, 4, 4}));
  expect_node_user_error(run_op("GatherElements", {iota<float>({2, 3}), make<int64_t>({1, 1}, {3})}, {attr("axis", int64_t{1})}),
                    "out of range");

  // batch_dims = 1: each batch picks its own rows.
  auto nd = ok(run_op("GatherND", {iota<float>({2, 3, 2}), make<int64_t>({2, 1, 1}, {2, -3})}, {attr("batch_dims", int64_t{1})}));
  EXPECT_EQ(nd[0].shape(), (I64{2, 1, 2}));
  EXPECT_EQ(stored_values<float>(nd[0]), (std::vector<float>{4, 5, 6, 7}));
  expect_node_user_error(run_op("GatherND", {iota<float>({2, 3}), make<int64_t>({1, 2}, {2, 0})}), "index 2 is out of range");
}

TEST(ShapeOps, ScatterReductionsAndErrors) {
  Tensor x = make<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor idx = make<int64_t>({2, 2}, {0, -1, 2, 2});
  Tensor upd = make<float>({2, 2}, {10, 20, 30, 40});
  auto none = ok(run_op("ScatterElements", {x, idx, upd}, {attr("axis", int64_t{1})}));
  EXPECT_EQ(stored_values<float>(none[0]), (std::vector<float>{10, 2, 20, 4, 5, 40}));
  auto add = ok(run_op("ScatterElements", {x, idx, upd}, {attr("axis", int64_t{1}), attr("reduction", std::string("add"))}));
  EXPECT_EQ(stored_values<float>(add[0]), (std::vector<float>{11, 2, 23, 4, 5, 76}));
  auto mn = ok(run_op("ScatterElements", {make<int32_t>({3}, {5, 5, 5}), make<int64_t>({2}, {1, 1}), make<int32_t>({2}, {7, 2})},
                      {attr("reduction", std::string("min"))}));
  EXPECT_EQ(stored_values<int32_t>(mn[0]), (std::vector<int32_t>{5, 2, 5}));
  expect_node_user_error(run_op("ScatterElements", {x, make<int64_t>({1, 1}, {3}), make<float>({1, 1}, {0})}, {attr("axis", int64_t{1})}),
                    "index 3 is out of range for axis 1 of size 3");
  auto nd = ok(run_op("ScatterND", {make<float>({3, 2}, {1, 1, 1, 1, 1, 1}), make<int64_t>({2, 1}, {2, -3}),
                                    make<float>({2, 2}, {2, 3, 4, 5})},
                      {attr("reduction", std::string("mul"))}));
  EXPECT_EQ(stored_values<float>(nd[0]), (std::vector<float>{4, 5, 1, 1, 2, 3}));
  expect_node_user_error(run_op("ScatterND", {iota<float>({3}), make<int64_t>({1, 1}, {5}), make<float>({1}, {0})}), "index 5");
}

TEST(ShapeOps, PadModes) {
  Tensor x = make<float>({1, 3}, {1, 2, 3});
  Tensor pads = make<int64_t>({4}, {0, 2, 0, 1});
  auto c = ok(run_op("Pad", {x, pads, make<float>({}, {9})}));
  EXPECT_EQ(stored_values<float>(c[0]), (std::vector<float>{9, 9, 1, 2, 3, 9}));
  auto r = ok(run_op("Pad", {x, pads}, {attr("mode", std::string("reflect"))}));
  EXPECT_EQ(stored_values<float>(r[0]), (std::vector<float>{3, 2, 1, 2, 3, 2}));
  auto e = ok(run_op("Pad", {x, pads}, {attr("mode", std::string("edge"))}));
  EXPECT_EQ(stored_values<float>(e[0]), (std::vector<float>{1, 1, 1, 2, 3, 3}));
  auto w = ok(run_op("Pad", {x, pads}, {attr("mode", std::string("wrap"))}));
  EXPECT_EQ(stored_values<float>(w[0]), (std::vector<float>{2, 3, 1, 2, 3, 1}));
  // Negative pads crop; axes pick the padded axes.
  auto crop = ok(run_op("Pad", {iota<int8_t>({2, 4}), make<int64_t>({2}, {-1, 1}), Tensor(), make<int64_t>({1}, {-1})}));
  EXPECT_EQ(stored_values<int8_t>(crop[0]), (std::vector<int8_t>{1, 2, 3, 0, 5, 6, 7, 0}));
  expect_node_user_error(run_op("Pad", {x, pads}, {attr("mode", std::string("mirror"))}), "unknown pad mode");
}

TEST(ShapeOps, TileExpandBroadcastAndErrors) {
  auto t = ok(run_op("Tile", {make<int16_t>({2}, {1, 2}), make<int64_t>({1}, {3})}));
  EXPECT_EQ(stored_values<int16_t>(t[0]), (std::vector<int16_t>{1, 2, 1, 2, 1, 2}));
  auto t2 = ok(run_op("Tile", {iota<float>({2, 1}), make<int64_t>({2}, {2, 3})}));
  EXPECT_EQ(stored_values<float>(t2[0]), (std::vector<float>{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1}));
  auto e = ok(run_op("Expand", {make<double>({3, 1}, {1, 2, 3}), make<int64_t>({3}, {2, 1, 2})}));
  EXPECT_EQ(e[0].shape(), (I64{2, 3, 2}));
  EXPECT_EQ(stored_values<double>(e[0]), (std::vector<double>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  auto s = ok(run_op("Expand", {make<bool>({}, {true}), make<int64_t>({1}, {3})}));
  EXPECT_EQ(stored_values<bool>(s[0]), (std::vector<bool>{true, true, true}));
  expect_node_user_error(run_op("Expand", {iota<float>({3}), make<int64_t>({1}, {4})}), "cannot broadcast");
}

TEST(ShapeOps, ShapeSizeRangeConstantOfShape) {
  Tensor x = iota<float>({2, 3, 5});
  EXPECT_EQ(stored_values<int64_t>(ok(run_op("Shape", {x}))[0]), (I64{2, 3, 5}));
  EXPECT_EQ(stored_values<int64_t>(ok(run_op("Shape", {x}, {attr("start", int64_t{-2}), attr("end", int64_t{100})}))[0]), (I64{3, 5}));
  EXPECT_EQ(ok(run_op("Shape", {x}, {attr("start", int64_t{2}), attr("end", int64_t{1})}))[0].numel(), 0);
  EXPECT_EQ(stored_values<int64_t>(ok(run_op("Size", {x}))[0]), (I64{30}));
  auto r = ok(run_op("Range", {make<int32_t>({}, {10}), make<int32_t>({}, {1}), make<int32_t>({}, {-3})}));
  EXPECT_EQ(stored_values<int32_t>(r[0]), (std::vector<int32_t>{10, 7, 4}));
  auto rf = ok(run_op("Range", {make<float>({}, {0}), make<float>({}, {1}), make<float>({}, {0.25f})}));
  EXPECT_EQ(stored_values<float>(rf[0]), (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  expect_node_user_error(run_op("Range", {make<float>({}, {0}), make<float>({}, {1}), make<float>({}, {0})}), "delta is 0");
  auto c = ok(run_op("ConstantOfShape", {make<int64_t>({2}, {2, 3})}, {attr("value", make<int32_t>({1}, {7}))}));
  EXPECT_EQ(stored_values<int32_t>(c[0]), (std::vector<int32_t>(6, 7)));
  auto z = ok(run_op("ConstantOfShape", {make<int64_t>({1}, {0})}));
  EXPECT_EQ(z[0].shape(), (I64{0}));
  EXPECT_EQ(z[0].dtype(), DType::f32);
}

TEST(ShapeOps, OneHotTriluEyeLike) {
  auto oh = ok(run_op("OneHot", {make<int64_t>({3}, {0, -1, 7}), make<int64_t>({}, {3}), make<float>({2}, {0, 5})}));
  EXPECT_EQ(oh[0].shape(), (I64{3, 3}));
  EXPECT_EQ(stored_values<float>(oh[0]), (std::vector<float>{5, 0, 0, 0, 0, 5, 0, 0, 0}));  // 7 is out of range: all off
  auto oh0 = ok(run_op("OneHot", {make<float>({2}, {1, 0}), make<float>({1}, {2}), make<int32_t>({2}, {-1, 1})},
                       {attr("axis", int64_t{0})}));
  EXPECT_EQ(stored_values<int32_t>(oh0[0]), (std::vector<int32_t>{-1, 1, 1, -1}));
  Tensor m = iota<int32_t>({3, 4});
  auto up = ok(run_op("Trilu", {m, make<int64_t>({}, {1})}));
  EXPECT_EQ(stored_values<int32_t>(up[0]), (std::vector<int32_t>{0, 1, 2, 3, 0, 0, 6, 7, 0, 0, 0, 11}));
  auto lo = ok(run_op("Trilu", {m, make<int64_t>({}, {-1})}, {attr("upper", int64_t{0})}));
  EXPECT_EQ(stored_values<int32_t>(lo[0]), (std::vector<int32_t>{0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0}));
  auto eye = ok(run_op("EyeLike", {iota<float>({2, 3})}, {attr("k", int64_t{1}), attr("dtype", std::string("i64"))}));
  EXPECT_EQ(stored_values<int64_t>(eye[0]), (I64{0, 1, 0, 0, 0, 1}));
}

TEST(ShapeOps, DataDependentNonZeroUniqueCompress) {
  auto nz = ok(run_op("NonZero", {make<float>({2, 2}, {0, 3, 1, 0})}));
  EXPECT_EQ(nz[0].shape(), (I64{2, 2}));
  EXPECT_EQ(stored_values<int64_t>(nz[0]), (I64{0, 1, 1, 0}));
  auto nz0 = ok(run_op("NonZero", {Tensor(DType::i32, {0, 3})}));
  EXPECT_EQ(nz0[0].shape(), (I64{2, 0}));
  auto u = ok(run_op("Unique", {make<float>({6}, {2, 1, 1, 3, 4, 3})}, {attr("sorted", int64_t{0})}, 4));
  EXPECT_EQ(stored_values<float>(u[0]), (std::vector<float>{2, 1, 3, 4}));
  EXPECT_EQ(stored_values<int64_t>(u[1]), (I64{0, 1, 3, 4}));
  EXPECT_EQ(stored_values<int64_t>(u[2]), (I64{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(stored_values<int64_t>(u[3]), (I64{1, 2, 2, 1}));
  auto us = ok(run_op("Unique", {make<int8_t>({3, 2}, {1, 0, 0, 1, 1, 0})}, {attr("axis", int64_t{0})}, 4));
  EXPECT_EQ(stored_values<int8_t>(us[0]), (std::vector<int8_t>{0, 1, 1, 0}));
  EXPECT_EQ(stored_values<int64_t>(us[2]), (I64{1, 0, 1}));
  EXPECT_EQ(stored_values<int64_t>(us[3]), (I64{1, 2}));
  auto c = ok(run_op("Compress", {iota<float>({3, 2}), make<bool>({2}, {false, true})}, {attr("axis", int64_t{1})}));
  EXPECT_EQ(stored_values<float>(c[0]), (std::vector<float>{1, 3, 5}));
  auto cf = ok(run_op("Compress", {iota<float>({3, 2}), make<bool>({3}, {true, false, true})}));
  EXPECT_EQ(stored_values<float>(cf[0]), (std::vector<float>{0, 2}));
}

TEST(ShapeOps, DepthToSpaceSpaceToDepthAndSequences) {
  // DCR: output (c, h*b + i, w*b + j) = input ((i*b + j)*C + c, h, w).
  Tensor x = iota<float>({1, 8, 2, 3});
  auto d = ok(run_op("DepthToSpace", {x}, {attr("blocksize", int64_t{2})}));
  ASSERT_EQ(d[0].shape(), (I64{1, 2, 4, 6}));
  auto crd = ok(run_op("DepthToSpace", {x}, {attr("blocksize", int64_t{2}), attr("mode", std::string("CRD"))}));
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t w = 0; w < 3; ++w)
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 2; ++j) {
            int64_t o = (c * 4 + h * 2 + i) * 6 + w * 2 + j;
            EXPECT_EQ(d[0].data<float>()[o], x.data<float>()[(((i * 2 + j) * 2 + c) * 2 + h) * 3 + w]);
            EXPECT_EQ(crd[0].data<float>()[o], x.data<float>()[((c * 4 + i * 2 + j) * 2 + h) * 3 + w]);
          }
  auto back = ok(run_op("SpaceToDepth", {d[0]}, {attr("blocksize", int64_t{2})}));
  EXPECT_EQ(stored_values<float>(back[0]), stored_values<float>(x));
  auto rs = ok(run_op("ReverseSequence", {iota<float>({3, 2}), make<int64_t>({2}, {3, 1})}));
  EXPECT_EQ(stored_values<float>(rs[0]), (std::vector<float>{4, 1, 2, 3, 0, 5}));
  expect_node_user_error(run_op("ReverseSequence", {iota<float>({3, 2}), make<int64_t>({2}, {4, 1})}), "sequence_lens[0] is 4");
  auto ccp = ok(run_op("CenterCropPad", {iota<float>({5, 2}), make<int64_t>({2}, {2, 4})}));
  EXPECT_EQ(stored_values<float>(ccp[0]), (std::vector<float>{0, 2, 3, 0, 0, 4, 5, 0}));
}

// Export-time inference: a Shape → Gather → Unsqueeze → Concat chain makes the Reshape static.
TEST(ShapeOps, InferenceFoldsShapeChainsIntoStaticReshape) {
  Graph g;
  ValueId x = g.add_value("x", DType::f32, Shape::of(I64{2, 16, 64}));
  g.inputs = {x};
  auto val = [&](const char* name) { return g.add_value(name, DType::undefined); };
  ValueId shp = val("shp"), b = val("b"), bu = val("bu"), cat = val("cat"), y = val("y");
  ValueId zero = g.add_constant("zero", make<int64_t>({}, {0}));
  ValueId axes = g.add_constant("axes", make<int64_t>({1}, {0}));
  ValueId rest = g.add_constant("rest", make<int64_t>({3}, {-1, 4, 16}));
  g.add_node(node("s", "Shape", {x}, {shp}));
  g.add_node(node("g", "Gather", {shp, zero}, {b}));
  g.add_node(node("u", "Unsqueeze", {b, axes}, {bu}));
  g.add_node(node("c", "Concat", {bu, rest}, {cat}));
  g.nodes.back().set_attr("axis", int64_t{0});
  g.add_node(node("r", "Reshape", {x, cat}, {y}));
  g.outputs = {y};
  auto known = infer_graph(g);
  ASSERT_TRUE(known.ok()) << known.error().message();
  EXPECT_EQ(g.value(y).shape, Shape::of(I64{2, 16, 4, 16}));
  ASSERT_TRUE((*known)[static_cast<size_t>(cat)].defined());
  EXPECT_EQ(stored_values<int64_t>((*known)[static_cast<size_t>(cat)]), (I64{2, -1, 4, 16}));
}

TEST(ShapeOps, InferenceKeepsSymbolicDims) {
  Graph g;
  ValueId x = g.add_value("x", DType::f32, Shape({Dim::sym("batch"), Dim::known(128), Dim::known(768)}));
  g.inputs = {x};
  ValueId tgt = g.add_constant("t", make<int64_t>({4}, {0, -1, 12, 64}));
  ValueId y = g.add_value("y", DType::undefined);
  ValueId z = g.add_value("z", DType::undefined);
  ValueId tgt2 = g.add_constant("t2", make<int64_t>({2}, {-1, 768}));
  ValueId w = g.add_value("w", DType::undefined);
  ValueId sl = g.add_value("sl", DType::undefined);
  g.add_node(node("r", "Reshape", {x, tgt}, {y}));
  g.add_node(node("t", "Transpose", {y}, {z}));
  g.nodes.back().set_attr("perm", I64{0, 2, 1, 3});
  g.add_node(node("r2", "Reshape", {x, tgt2}, {w}));
  ValueId s0 = g.add_constant("s0", make<int64_t>({1}, {1})), e0 = g.add_constant("e0", make<int64_t>({1}, {INT64_MAX}));
  g.add_node(node("sl", "Slice", {x, s0, e0, s0}, {sl}));
  g.outputs = {z, w};
  auto known = infer_graph(g);
  ASSERT_TRUE(known.ok()) << known.error().message();
  EXPECT_EQ(g.value(y).shape.str(), "batchx128x12x64");
  EXPECT_EQ(g.value(z).shape.str(), "batchx12x128x64");
  EXPECT_EQ(g.value(w).shape.str(), "?x768");  // batch*128 has no single symbol
  EXPECT_EQ(g.value(sl).shape.str(), "batchx127x768");
}

}  // namespace
}  // namespace kiln
