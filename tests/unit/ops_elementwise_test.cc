// Elementwise family: the broadcast iterator, and reference kernels run through a Session
// against hand-computed values — odd and even sizes, broadcasting, rank 0, zero-size,
// integer wrap-around and division by zero, type conversions, and user errors.
#include <gtest/gtest.h>

#include <cmath>

#include "formats/infer.h"
#include "runtime/ref/broadcast.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::make;
using testing::node;
using testing::ramp;
using testing::run_op;
using testing::stored_values;

TEST(ElementwiseBroadcast, IteratorMergesDimsAndGivesStrides) {
  std::vector<int64_t> out = {2, 3, 4, 5}, a = {2, 3, 4, 5}, b = {3, 1, 1};
  ref::BroadcastIter<2> it(out, {std::span<const int64_t>(a), std::span<const int64_t>(b)});
  int rows = 0;
  int64_t covered = 0;
  it.for_each_row([&](int64_t o, const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
    EXPECT_EQ(off[0], o);       // a is walked like the output
    EXPECT_EQ(st[0], 1);
    EXPECT_EQ(st[1], 0);        // b is constant along each row of 4*5 merged elements
    EXPECT_EQ(n, 20);
    EXPECT_EQ(off[1], (o / 20) % 3);
    covered += n;
    ++rows;
  });
  EXPECT_EQ(rows, 6);
  EXPECT_EQ(covered, 120);
  auto bs = ref::broadcast_shape(std::vector<std::vector<int64_t>>{{3, 1, 5}, {4, 1}});
  ASSERT_TRUE(bs.has_value());
  EXPECT_EQ(*bs, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_FALSE(ref::broadcast_shape(std::vector<std::vector<int64_t>>{{3}, {4}}).has_value());
}

TEST(ElementwiseKernels, AddBroadcastsOddShapes) {
  Tensor a = ramp({3, 1, 5}), b = ramp({4, 1}, -0.5f);
  auto out = run_op("Add", {a, b});
  ASSERT_TRUE(out.ok()) << out.error().message();
  const Tensor& y = (*out)[0];
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{3, 4, 5}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 5; ++k)
        EXPECT_FLOAT_EQ(y.data<float>()[(i * 4 + j) * 5 + k], a.data<float>()[i * 5 + k] + b.data<float>()[j]);
}

TEST(ElementwiseKernels, ScalarAndZeroSizeInputs) {
  auto out = run_op("Mul", {make<float>({}, {2.5f}), ramp({7})});
  ASSERT_TRUE(out.ok()) << out.error().message();
  EXPECT_EQ((*out)[0].shape(), (std::vector<int64_t>{7}));
  EXPECT_FLOAT_EQ((*out)[0].data<float>()[3], 2.5f * ramp({7}).data<float>()[3]);
  auto scalar = run_op("Sub", {make<float>({}, {1.f}), make<float>({}, {3.f})});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ((*scalar)[0].rank(), 0);
  EXPECT_FLOAT_EQ((*scalar)[0].data<float>()[0], -2.f);
  auto empty = run_op("Add", {Tensor(DType::f32, {0, 3}), ramp({3})});
  ASSERT_TRUE(empty.ok()) << empty.error().message();
  EXPECT_EQ((*empty)[0].shape(), (std::vector<int64_t>{0, 3}));
}

TEST(ElementwiseKernels, IntegerArithmeticWrapsAndTruncates) {
  auto add = run_op("Add", {make<int32_t>({2}, {INT32_MAX, -5}), make<int32_t>({2}, {1, 3})});
  ASSERT_TRUE(add.ok());
  EXPECT_EQ(stored_values<int32_t>((*add)[0]), (std::vector<int32_t>{INT32_MIN, -2}));
  auto div = run_op("Div", {make<int64_t>({4}, {-7, 7, -7, INT64_MIN}), make<int64_t>({4}, {2, -2, -2, -1})});
  ASSERT_TRUE(div.ok());
  EXPECT_EQ(stored_values<int64_t>((*div)[0]), (std::vector<int64_t>{-3, -3, 3, INT64_MIN}));
  auto mod = run_op("Mod", {make<int32_t>({3}, {-7, 7, -7}), make<int32_t>({3}, {3, -3, -3})});
  ASSERT_TRUE(mod.ok());
  EXPECT_EQ(stored_values<int32_t>((*mod)[0]), (std::vector<int32_t>{2, -2, -1}));
  auto fmod = run_op("Mod", {make<int32_t>({3}, {-7, 7, -7}), make<int32_t>({3}, {3, -3, -3})}, {{"fmod", int64_t{1}}});
  ASSERT_TRUE(fmod.ok());
  EXPECT_EQ(stored_values<int32_t>((*fmod)[0]), (std::vector<int32_t>{-1, 1, -1}));
  auto pow = run_op("Pow", {make<int64_t>({3}, {3, -2, 2}), make<int32_t>({3}, {4, 3, -1})});
  ASSERT_TRUE(pow.ok());
  EXPECT_EQ(stored_values<int64_t>((*pow)[0]), (std::vector<int64_t>{81, -8, 0}));
}

TEST(ElementwiseKernels, IntegerDivisionByZeroIsAUserError) {
  auto out = run_op("Div", {make<int32_t>({3}, {1, 2, 3}), make<int32_t>({3}, {1, 0, 1})});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().kind, ErrorKind::user);
  EXPECT_EQ(out.error().where, "node 'n'");
  EXPECT_EQ(out.error().what, "integer division by zero");
  auto mod = run_op("Mod", {make<uint8_t>({1}, {1}), make<uint8_t>({1}, {0})});
  ASSERT_FALSE(mod.ok());
  EXPECT_EQ(mod.error().what, "integer modulo by zero");
}

TEST(ElementwiseKernels, ComparisonsLogicAndBits) {
  auto eq = run_op("Less", {make<float>({3}, {1, 2, 3}), make<float>({}, {2})});
  ASSERT_TRUE(eq.ok());
  ASSERT_EQ((*eq)[0].dtype(), DType::boolean);
  EXPECT_EQ(stored_values<bool>((*eq)[0]), (std::vector<bool>{true, false, false}));
  auto x = run_op("Xor", {make<bool>({2, 1}, {true, false}), make<bool>({2}, {true, false})});
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(stored_values<bool>((*x)[0]), (std::vector<bool>{false, true, true, false}));
  auto sh = run_op("BitShift", {make<uint8_t>({3}, {1, 255, 16}), make<uint8_t>({3}, {3, 9, 2})},
                   {{"direction", std::string("LEFT")}});
  ASSERT_TRUE(sh.ok());
  EXPECT_EQ(stored_values<uint8_t>((*sh)[0]), (std::vector<uint8_t>{8, 0, 64}));
}

TEST(ElementwiseKernels, UnaryActivations) {
  Tensor x = make<float>({5}, {-2.f, -0.5f, 0.f, 0.5f, 3.f});
  auto relu = run_op("Relu", {x});
  ASSERT_TRUE(relu.ok());
  EXPECT_EQ(stored_values<float>((*relu)[0]), (std::vector<float>{0, 0, 0, 0.5f, 3.f}));
  auto gelu = run_op("Gelu", {x}, {{"approximate", std::string("tanh")}});
  ASSERT_TRUE(gelu.ok());
  for (int i = 0; i < 5; ++i) {
    float v = x.data<float>()[i];
    float want = 0.5f * v * (1.f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    EXPECT_NEAR((*gelu)[0].data<float>()[i], want, 1e-6f);
  }
  auto leaky = run_op("LeakyRelu", {x}, {{"alpha", 0.1}});
  ASSERT_TRUE(leaky.ok());
  EXPECT_FLOAT_EQ((*leaky)[0].data<float>()[0], -0.2f);
  auto round = run_op("Round", {make<float>({4}, {0.5f, 1.5f, -2.5f, 2.6f})});
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(stored_values<float>((*round)[0]), (std::vector<float>{0.f, 2.f, -2.f, 3.f}));
  auto half_sig = run_op("Sigmoid", {make<half>({2}, {half(0.f), half(-100.f)})});
  ASSERT_TRUE(half_sig.ok());
  EXPECT_FLOAT_EQ(static_cast<float>((*half_sig)[0].data<half>()[0]), 0.5f);
  EXPECT_FLOAT_EQ(static_cast<float>((*half_sig)[0].data<half>()[1]), 0.f);
  auto abs = run_op("Abs", {make<int8_t>({3}, {-128, -3, 4})});
  ASSERT_TRUE(abs.ok());
  EXPECT_EQ(stored_values<int8_t>((*abs)[0]), (std::vector<int8_t>{-128, 3, 4}));
}

TEST(ElementwiseKernels, WhereClipAndVariadic) {
  auto w = run_op("Where", {make<bool>({2, 1}, {true, false}), make<int64_t>({3}, {1, 2, 3}), make<int64_t>({}, {-1})});
  ASSERT_TRUE(w.ok()) << w.error().message();
  EXPECT_EQ(stored_values<int64_t>((*w)[0]), (std::vector<int64_t>{1, 2, 3, -1, -1, -1}));
  auto clip = run_op("Clip", {make<float>({3}, {-5, 0, 5}), make<float>({}, {-1}), make<float>({}, {2})});
  ASSERT_TRUE(clip.ok());
  EXPECT_EQ(stored_values<float>((*clip)[0]), (std::vector<float>{-1, 0, 2}));
  auto inverted = run_op("Clip", {make<float>({2}, {-5, 5}), make<float>({}, {3}), make<float>({}, {1})});
  ASSERT_TRUE(inverted.ok());
  EXPECT_EQ(stored_values<float>((*inverted)[0]), (std::vector<float>{1, 1}));
  auto only_max = run_op("Clip", {make<int32_t>({2}, {-5, 5}), Tensor(), make<int32_t>({}, {0})});
  ASSERT_TRUE(only_max.ok()) << only_max.error().message();
  EXPECT_EQ(stored_values<int32_t>((*only_max)[0]), (std::vector<int32_t>{-5, 0}));
  auto mx = run_op("Max", {make<float>({3}, {1, 5, 2}), make<float>({2, 1}, {3, 0}), make<float>({}, {1.5f})});
  ASSERT_TRUE(mx.ok());
  EXPECT_EQ(stored_values<float>((*mx)[0]), (std::vector<float>{3, 5, 3, 1.5f, 5, 2}));
  auto mean = run_op("Mean", {make<float>({2}, {1, 2}), make<float>({2}, {3, 5})});
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ(stored_values<float>((*mean)[0]), (std::vector<float>{2, 3.5f}));
}

TEST(ElementwiseKernels, CastConvertsLikeOnnx) {
  Tensor x = make<float>({5}, {-2.7f, -0.5f, 0.f, 1.9f, 300.f});
  auto i = run_op("Cast", {x}, {{"to", std::string("i32")}});
  ASSERT_TRUE(i.ok()) << i.error().message();
  EXPECT_EQ(stored_values<int32_t>((*i)[0]), (std::vector<int32_t>{-2, 0, 0, 1, 300}));
  auto b = run_op("Cast", {x}, {{"to", std::string("bool")}});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(stored_values<bool>((*b)[0]), (std::vector<bool>{true, true, false, true, true}));
  auto h = run_op("Cast", {x}, {{"to", std::string("f16")}});
  ASSERT_TRUE(h.ok());
  EXPECT_FLOAT_EQ(static_cast<float>((*h)[0].data<half>()[4]), 300.f);
  auto u = run_op("Cast", {make<int32_t>({2}, {-1, 256})}, {{"to", std::string("u8")}});
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(stored_values<uint8_t>((*u)[0]), (std::vector<uint8_t>{255, 0}));
  auto bad = run_op("Cast", {x}, {{"to", std::string("f8")}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
}

TEST(ElementwiseKernels, InvalidModelsAreUserErrors) {
  auto shapes = run_op("Add", {ramp({3}), ramp({4})});
  ASSERT_FALSE(shapes.ok());
  EXPECT_EQ(shapes.error().kind, ErrorKind::user);
  EXPECT_NE(shapes.error().what.find("cannot broadcast shapes 3 and 4"), std::string::npos) << shapes.error().what;
  auto types = run_op("Add", {ramp({3}), make<int32_t>({3}, {1, 2, 3})});
  ASSERT_FALSE(types.ok());
  EXPECT_EQ(types.error().what, "input types differ: f32 and i32");
  auto exp_int = run_op("Exp", {make<int32_t>({1}, {1})});
  ASSERT_FALSE(exp_int.ok());
  EXPECT_EQ(exp_int.error().what, "Exp does not support i32 (it takes floating-point types)");
  auto fmod = run_op("Mod", {ramp({2}), ramp({2})});
  ASSERT_FALSE(fmod.ok());
  EXPECT_EQ(fmod.error().what, "fmod must be 1 for floating-point inputs");
}

// Shape arithmetic on known data is computed by inference (export resolves Reshape targets).
TEST(ElementwiseInference, FoldsSmallKnownIntegerArithmetic) {
  Graph g;
  ValueId dims = g.add_constant("dims", make<int64_t>({3}, {2, 3, 4}));
  ValueId two = g.add_constant("two", make<int64_t>({}, {2}));
  ValueId axes = g.add_constant("axes", make<int64_t>({1}, {0}));
  ValueId half = g.add_value("half", DType::undefined);
  ValueId numel = g.add_value("numel", DType::undefined);
  ValueId as_float = g.add_value("as_float", DType::undefined);
  g.add_node(node("div", "Div", {dims, two}, {half}));
  g.add_node(node("prod", "ReduceProd", {dims, axes}, {numel}));
  Node cast = node("cast", "Cast", {half}, {as_float});
  cast.set_attr("to", std::string("f32"));
  g.add_node(std::move(cast));
  g.outputs = {half, numel, as_float};
  auto known = infer_graph(g);
  ASSERT_TRUE(known.ok()) << known.error().message();
  ASSERT_TRUE((*known)[static_cast<size_t>(half)].defined());
  EXPECT_EQ(stored_values<int64_t>((*known)[static_cast<size_t>(half)]), (std::vector<int64_t>{1, 1, 2}));
  ASSERT_TRUE((*known)[static_cast<size_t>(numel)].defined());
  EXPECT_EQ(stored_values<int64_t>((*known)[static_cast<size_t>(numel)]), (std::vector<int64_t>{24}));
  EXPECT_EQ(g.value(numel).shape, Shape::of(std::vector<int64_t>{1}));
  ASSERT_TRUE((*known)[static_cast<size_t>(as_float)].defined());
  EXPECT_EQ(stored_values<float>((*known)[static_cast<size_t>(as_float)]), (std::vector<float>{1, 1, 2}));

  Graph bad;
  ValueId a = bad.add_constant("a", make<int64_t>({1}, {5}));
  ValueId z = bad.add_constant("z", make<int64_t>({1}, {0}));
  ValueId q = bad.add_value("q", DType::undefined);
  bad.add_node(node("div", "Div", {a, z}, {q}));
  auto err = infer_graph(bad);
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().what, "integer division by zero");
}

}  // namespace
}  // namespace kiln
