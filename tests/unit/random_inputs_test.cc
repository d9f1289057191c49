// Random inputs: the stream is pinned (same seed, same values, on any platform), floats stay
// in [-1, 1), and integer inputs follow the ranges their uses in the graph imply.
#include "runtime/random_inputs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace kiln {
namespace {

Shape sym_shape(std::initializer_list<const char*> names) {
  std::vector<Dim> dims;
  for (const char* n : names) dims.push_back(Dim::sym(n));
  return Shape(std::move(dims));
}

// Adds a node `op` named `name` reading `inputs` and producing one new f32 value.
ValueId add_node(Graph& g, const std::string& op, const std::string& name, std::vector<ValueId> inputs,
                 std::vector<Attribute> attrs = {}, DType out_dtype = DType::f32) {
  Node n;
  n.name = name;
  n.op = op;
  n.inputs = std::move(inputs);
  ValueId out = g.add_value(name + "_out", out_dtype);
  n.outputs = {out};
  for (auto& a : attrs) n.set_attr(a.name, a.value);
  g.add_node(std::move(n));
  return out;
}

ValueId add_input(Graph& g, const std::string& name, DType dtype, Shape shape = Shape()) {
  ValueId id = g.add_value(name, dtype, std::move(shape));
  g.inputs.push_back(id);
  return id;
}

std::pair<int64_t, int64_t> min_max(const Tensor& t) {
  std::vector<int64_t> v = t.to_int64_vector();
  return {*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

TEST(RandomInputs, StreamIsPinned) {
  // splitmix64 from seed 42, computed independently (Python):
  //   first outputs 0xbdd732262feb6e95, 0x28efe333b266f103, 0x47526757130f9f52
  //   f32 = 2 * (x >> 40) / 2^24 - 1
  Graph g;
  ValueId x = add_input(g, "x", DType::f32);
  Tensor t = random_input(g, x, {3}, 42);
  const uint64_t raw[] = {0xbdd732262feb6e95ull, 0x28efe333b266f103ull, 0x47526757130f9f52ull};
  for (int i = 0; i < 3; ++i) {
    float want = static_cast<float>(2.0 * static_cast<double>(raw[i] >> 40) / 16777216.0 - 1.0);
    EXPECT_EQ(t.data<float>()[i], want) << "element " << i;
  }
}

TEST(RandomInputs, DeterministicPerSeedAndInput) {
  Graph g;
  ValueId x = add_input(g, "x", DType::f32);
  Tensor a = random_input(g, x, {4, 5}, 7);
  Tensor b = random_input(g, x, {4, 5}, 7);
  Tensor c = random_input(g, x, {4, 5}, 8);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
  EXPECT_NE(input_seed(7, "x"), input_seed(7, "y"));
  EXPECT_NE(input_seed(7, "x"), input_seed(8, "x"));
  EXPECT_EQ(input_seed(7, "x"), input_seed(7, "x"));

  ValueId y = add_input(g, "y", DType::f32);
  std::vector<Tensor> in = random_inputs(g, {{8}, {8}}, 1);
  ASSERT_EQ(in.size(), 2u);
  EXPECT_NE(std::memcmp(in[0].raw(), in[1].raw(), in[0].nbytes()), 0);  // inputs differ
  Tensor again = random_input(g, y, {8}, input_seed(1, "y"));
  EXPECT_EQ(std::memcmp(in[1].raw(), again.raw(), again.nbytes()), 0);
}

TEST(RandomInputs, FloatsInMinusOneToOne) {
  Graph g;
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    ValueId x = add_input(g, std::string("x_") + std::string(dtype_name(dt)), dt);
    Tensor t = random_input(g, x, {4000}, 3);
    double lo = 2, hi = -2, sum = 0;
    std::set<double> distinct;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = t.as_double(i);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
      distinct.insert(v);
    }
    EXPECT_GE(lo, -1.0);
    EXPECT_LT(hi, 1.0);
    EXPECT_LT(lo, -0.95);
    EXPECT_GT(hi, 0.95);
    EXPECT_NEAR(sum / 4000, 0.0, 0.05);
    EXPECT_GT(distinct.size(), 200u);
  }
}

TEST(RandomInputs, BoolsAreZeroOrOne) {
  Graph g;
  ValueId b = add_input(g, "b", DType::boolean);
  Tensor t = random_input(g, b, {200}, 5);
  int ones = 0;
  for (int64_t i = 0; i < 200; ++i) {
    uint8_t byte = t.data<uint8_t>()[i];
    ASSERT_LE(byte, 1);
    ones += byte;
  }
  EXPECT_GT(ones, 60);
  EXPECT_LT(ones, 140);
}

TEST(RandomInputs, GatherIndicesStayInRange) {
  Graph g;
  ValueId emb = g.add_constant("emb", Tensor(DType::f32, {30, 8}));
  ValueId ids = add_input(g, "input_ids", DType::i64, sym_shape({"batch", "seq"}));
  add_node(g, "Gather", "embed", {emb, ids});
  RandomRange r = random_input_range(g, ids, std::vector<int64_t>{2, 500});
  EXPECT_EQ(r.kind, RandomRange::Kind::integer);
  EXPECT_EQ(r.hi, 30);
  EXPECT_EQ(r.reason, "indices of Gather node 'embed' into a dim of size 30");
  Tensor t = random_input(g, ids, {2, 500}, 11);
  auto [lo, hi] = min_max(t);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 29);  // 1000 draws from 30 values reach the top
}

TEST(RandomInputs, GatherAxisAttributeAndNegativeAxis) {
  Graph g;
  ValueId data = add_input(g, "data", DType::f32, Shape({Dim::known(5), Dim::known(7), Dim::sym("n")}));
  ValueId a = add_input(g, "a", DType::i32);
  ValueId b = add_input(g, "b", DType::i32);
  ValueId c = add_input(g, "c", DType::i32);
  add_node(g, "Gather", "g1", {data, a}, {{"axis", int64_t{1}}});
  add_node(g, "Gather", "g2", {data, b}, {{"axis", int64_t{-2}}});
  add_node(g, "Gather", "g3", {data, c}, {{"axis", int64_t{2}}});  // symbolic dim: no bound
  EXPECT_EQ(random_input_range(g, a, std::vector<int64_t>{4}).hi, 7);
  EXPECT_EQ(random_input_range(g, b, std::vector<int64_t>{4}).hi, 7);
  RandomRange rc = random_input_range(g, c, std::vector<int64_t>{4});
  EXPECT_EQ(rc.hi, 10);
  EXPECT_EQ(rc.reason, "no use bounds it: small values in [0, 10)");
}

TEST(RandomInputs, FollowsCastsAndTakesTheSmallestBound) {
  Graph g;
  ValueId big = g.add_constant("big", Tensor(DType::f32, {50, 2}));
  ValueId small = g.add_constant("small", Tensor(DType::f32, {12, 2}));
  ValueId ids = add_input(g, "ids", DType::i32);
  ValueId cast = add_node(g, "Cast", "cast", {ids}, {{"to", int64_t{11}}}, DType::i64);
  ValueId reshaped = add_node(g, "Unsqueeze", "unsq", {cast}, {}, DType::i64);
  add_node(g, "Gather", "g_big", {big, ids});
  add_node(g, "Gather", "g_small", {small, reshaped});
  RandomRange r = random_input_range(g, ids, std::vector<int64_t>{300});
  EXPECT_EQ(r.hi, 12);
  EXPECT_EQ(r.reason, "indices of Gather node 'g_small' into a dim of size 12");
  auto [lo, hi] = min_max(random_input(g, ids, {300}, 2));
  EXPECT_GE(lo, 0);
  EXPECT_EQ(hi, 11);
}

TEST(RandomInputs, GatherElementsOneHotAndDtypeLimit) {
  Graph g;
  ValueId data = add_input(g, "data", DType::f32, Shape({Dim::known(3), Dim::known(9)}));
  ValueId ge = add_input(g, "ge", DType::i64);
  add_node(g, "GatherElements", "ge_node", {data, ge}, {{"axis", int64_t{1}}});
  EXPECT_EQ(random_input_range(g, ge, std::vector<int64_t>{3, 4}).hi, 9);

  ValueId oh = add_input(g, "oh", DType::i64);
  ValueId depth = g.add_constant("depth", Tensor::from<int64_t>({}, {6}));
  ValueId values = g.add_constant("values", Tensor::from<float>({2}, {0, 1}));
  add_node(g, "OneHot", "onehot", {oh, depth, values});
  RandomRange r = random_input_range(g, oh, std::vector<int64_t>{5});
  EXPECT_EQ(r.hi, 6);
  EXPECT_EQ(r.reason, "indices of OneHot node 'onehot' with depth 6");

  // An i8 index into a dim of 1000 is limited to what i8 holds.
  ValueId table = g.add_constant("table", Tensor(DType::f32, {1000}));
  ValueId i8 = add_input(g, "i8_ids", DType::i8);
  add_node(g, "Gather", "g8", {table, i8});
  EXPECT_EQ(random_input_range(g, i8, std::vector<int64_t>{5}).hi, 128);
  auto [lo, hi] = min_max(random_input(g, i8, {2000}, 9));
  EXPECT_GE(lo, 0);
  EXPECT_LE(hi, 127);
}

TEST(RandomInputs, GatherNDBoundsEachPosition) {
  Graph g;
  ValueId data = g.add_constant("data", Tensor(DType::f32, {4, 5, 6}));
  ValueId idx = add_input(g, "idx", DType::i64);
  add_node(g, "GatherND", "gnd", {data, idx});
  RandomRange r = random_input_range(g, idx, std::vector<int64_t>{100, 2});
  EXPECT_EQ(r.hi_per_last_axis, (std::vector<int64_t>{4, 5}));
  Tensor t = random_input(g, idx, {100, 2}, 4);
  int64_t max0 = 0, max1 = 0;
  for (int64_t i = 0; i < 100; ++i) {
    int64_t a = t.data<int64_t>()[2 * i], b = t.data<int64_t>()[2 * i + 1];
    ASSERT_TRUE(a >= 0 && a < 4 && b >= 0 && b < 5) << a << ", " << b;
    max0 = std::max(max0, a);
    max1 = std::max(max1, b);
  }
  EXPECT_EQ(max0, 3);
  EXPECT_EQ(max1, 4);
  // batch_dims shifts the dims the positions index.
  Graph g2;
  ValueId d2 = g2.add_constant("data", Tensor(DType::f32, {4, 5, 6}));
  ValueId i2 = add_input(g2, "idx", DType::i64);
  add_node(g2, "GatherND", "gnd", {d2, i2}, {{"batch_dims", int64_t{1}}});
  EXPECT_EQ(random_input_range(g2, i2, std::vector<int64_t>{4, 3, 2}).hi_per_last_axis, (std::vector<int64_t>{5, 6}));
}

TEST(RandomInputs, FallbackRanges) {
  Graph g;
  ValueId mask = add_input(g, "attention_mask", DType::i64);
  ValueId other = add_input(g, "token_type_ids", DType::u8);
  add_node(g, "Mul", "m", {mask, other});
  RandomRange rm = random_input_range(g, mask, std::vector<int64_t>{64});
  EXPECT_EQ(rm.hi, 2);
  EXPECT_EQ(rm.reason, "an integer mask (by its name): 0 or 1");
  auto [lo, hi] = min_max(random_input(g, mask, {64}, 1));
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 1);
  EXPECT_EQ(random_input_range(g, other, std::vector<int64_t>{64}).hi, 10);
  auto [lo2, hi2] = min_max(random_input(g, other, {500}, 1));
  EXPECT_EQ(lo2, 0);
  EXPECT_EQ(hi2, 9);
}

TEST(RandomInputs, EmptyAndScalarShapes) {
  Graph g;
  ValueId x = add_input(g, "x", DType::f32);
  EXPECT_EQ(random_input(g, x, {0, 3}, 1).numel(), 0);
  Tensor s = random_input(g, x, {}, 1);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.numel(), 1);
  ValueId e = g.add_constant("empty_table", Tensor(DType::f32, {0, 4}));
  ValueId ids = add_input(g, "ids", DType::i64);
  add_node(g, "Gather", "g", {e, ids});
  Tensor t = random_input(g, ids, {3}, 1);
  EXPECT_EQ(t.to_int64_vector(), (std::vector<int64_t>{0, 0, 0}));  // no valid index exists
}

}  // namespace
}  // namespace kiln
