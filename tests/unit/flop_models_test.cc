// The FLOP models of the core ops (formats/ops/flop_models.cc): every op has one, the counts of
// a few of each kind, and hostile shapes that must saturate rather than overflow.
#include <gtest/gtest.h>

#include <limits>

#include "formats/op_schema.h"
#include "formats/ops/flops.h"
#include "formats/summary.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::attr;

// One input of a test node: a graph input of a shape and dtype, or a constant.
struct In {
  Shape shape;
  DType dtype = DType::f32;
  Tensor constant;
};
In f32(std::vector<int64_t> d) { return In{Shape::of(d)}; }
In typed(std::vector<int64_t> d, DType t) { return In{Shape::of(d), t}; }
In constant(Tensor t) { return In{Shape::of(t.shape()), t.dtype(), t}; }

// A one-node graph of `op` (nullopt: an omitted input) whose output shapes are inferred, as
// export leaves them.
Graph one_node(const std::string& op, const std::vector<std::optional<In>>& in, std::vector<Attribute> attrs = {},
               size_t outputs = 1) {
  Graph g;
  Node n{.name = "n", .op = op};
  for (Attribute& a : attrs) n.set_attr(std::move(a.name), std::move(a.value));
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    if (!in[i]) n.inputs.push_back(kNoValue);
    else if (in[i]->constant.defined()) n.inputs.push_back(g.add_constant(name, in[i]->constant));
    else n.inputs.push_back(g.add_value(name, in[i]->dtype, in[i]->shape));
  }
  for (size_t i = 0; i < outputs; ++i) n.outputs.push_back(g.add_value("y" + std::to_string(i), DType::undefined));
  g.add_node(std::move(n));
  auto r = infer_node(g.nodes[0], g);
  EXPECT_TRUE(r.ok()) << op << ": " << r.error().message();
  if (r.ok())
    for (size_t i = 0; i < outputs; ++i) {
      g.value(g.nodes[0].outputs[i]).dtype = (*r)[i].dtype;
      g.value(g.nodes[0].outputs[i]).shape = (*r)[i].shape;
    }
  return g;
}

int64_t flops_of(const std::string& op, const std::vector<std::optional<In>>& in, std::vector<Attribute> attrs = {},
                 size_t outputs = 1) {
  Graph g = one_node(op, in, std::move(attrs), outputs);
  return node_flops(g.nodes[0], g);
}

TEST(FlopModels, EveryCoreOpHasOne) {
  std::string missing;
  for (const auto& [domain, schema] : core_ops().all())
    if (!schema->traits.flops) missing += (missing.empty() ? "" : ", ") + std::string(schema->name);
  EXPECT_EQ(missing, "") << "ops without a FLOP model: add them to kModels in formats/ops/flop_models.cc";
  // Ops that do no arithmetic say so by name, rather than by a missing model.
  for (const char* op : {"Reshape", "Transpose", "Gather", "Cast", "If"})
    EXPECT_EQ(core_ops().find("", op)->traits.flops, &flops::none) << op;
}

TEST(FlopModels, ElementwiseOpsCountPerOutputElement) {
  EXPECT_EQ(flops_of("Add", {f32({2, 3}), f32({2, 3})}), 6);
  EXPECT_EQ(flops_of("Add", {f32({4, 3}), f32({3})}), 12);  // the broadcast output's elements
  EXPECT_EQ(flops_of("Relu", {f32({2, 3})}), 6);
  EXPECT_EQ(flops_of("Exp", {f32({5})}), 5 * 4);       // a transcendental counts 4
  EXPECT_EQ(flops_of("Sigmoid", {f32({5})}), 5 * 7);   // negate, exp, add, divide
  EXPECT_EQ(flops_of("Gelu", {f32({5})}), 5 * 8);
  EXPECT_EQ(flops_of("Gelu", {f32({5})}, {attr("approximate", std::string("tanh"))}), 5 * 12);
  // Variadic: inputs − 1 per element, and Mean's divide.
  EXPECT_EQ(flops_of("Sum", {f32({2, 3}), f32({2, 3}), f32({2, 3})}), 12);
  EXPECT_EQ(flops_of("Mean", {f32({2, 3}), f32({2, 3}), f32({2, 3})}), 18);
  EXPECT_EQ(flops_of("Where", {typed({2, 3}, DType::boolean), f32({2, 3}), f32({3})}), 6);
  EXPECT_EQ(flops_of("Less", {f32({2, 3}), f32({2, 3})}), 6);
}

TEST(FlopModels, DataMovementCountsNothing) {
  EXPECT_EQ(flops_of("Reshape", {f32({2, 3}), constant(Tensor::from<int64_t>({2}, {3, 2}))}), 0);
  EXPECT_EQ(flops_of("Transpose", {f32({2, 3})}), 0);
  EXPECT_EQ(flops_of("Cast", {f32({2, 3})}, {attr("to", std::string("f16"))}), 0);
  // A scatter only writes, unless it reduces into the data.
  const std::vector<std::optional<In>> scatter = {f32({8}), typed({3, 1}, DType::i64), f32({3})};
  EXPECT_EQ(flops_of("ScatterND", scatter), 0);
  EXPECT_EQ(flops_of("ScatterND", scatter, {attr("reduction", std::string("add"))}), 3);
}

TEST(FlopModels, ReductionsAndNormalizationsCountPerInputElement) {
  const In axes = constant(Tensor::from<int64_t>({1}, {1}));
  EXPECT_EQ(flops_of("ReduceSum", {f32({4, 5}), axes}), 20);
  EXPECT_EQ(flops_of("ReduceSumSquare", {f32({4, 5}), axes}), 40);
  EXPECT_EQ(flops_of("Softmax", {f32({2, 10})}), 20 * 8);  // max, subtract, exp (4), sum, divide
  EXPECT_EQ(flops_of("LayerNormalization", {f32({2, 8}), f32({8}), f32({8})}), 16 * 7);
  EXPECT_EQ(flops_of("RMSNormalization", {f32({2, 8}), f32({8})}), 16 * 4);
  // TopK: ⌈log2 K⌉ comparisons per input element.
  EXPECT_EQ(flops_of("TopK", {f32({2, 100}), constant(Tensor::from<int64_t>({1}, {8}))}, {}, 2), 200 * 3);
}

TEST(FlopModels, PoolsCountTheirWindows) {
  const std::vector<int64_t> two = {2, 2};
  // 1x1x4x4 in 2x2 windows, stride 2: 4 outputs of 4 elements.
  EXPECT_EQ(flops_of("MaxPool", {f32({1, 1, 4, 4})}, {attr("kernel_shape", two), attr("strides", two)}), 16);
  EXPECT_EQ(flops_of("GlobalAveragePool", {f32({1, 3, 4, 4})}), 48);
}

TEST(FlopModels, ResizeCountsTapsOfTheResizedAxes) {
  const In scales = constant(Tensor::from<float>({4}, {1, 1, 2, 2}));
  const std::vector<std::optional<In>> in = {f32({1, 1, 2, 2}), std::nullopt, scales};
  // 16 outputs, 2 x 2 taps over the two resized axes, a multiply and an add each.
  EXPECT_EQ(flops_of("Resize", in, {attr("mode", std::string("linear"))}), 16 * 4 * 2);
  EXPECT_EQ(flops_of("Resize", in), 0);  // nearest copies
}

TEST(FlopModels, AttentionCountsBothProductsAndTheSoftmax) {
  // B 1, H 2, S 3, T 5, D 4, Dv 6: Q·Kᵀ 2·24·5, P·V 2·36·5, 30 scores × (scale + softmax 8).
  const int64_t expected = 2 * 24 * 5 + 2 * 36 * 5 + 30 * 9;
  EXPECT_EQ(flops_of("Attention", {f32({1, 2, 3, 4}), f32({1, 2, 5, 4}), f32({1, 2, 5, 6})}), expected);
  // The same problem with sequence-major [B, S, H·D] inputs.
  const std::vector<Attribute> heads = {attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{2})};
  EXPECT_EQ(flops_of("Attention", {f32({1, 3, 8}), f32({1, 5, 8}), f32({1, 5, 12})}, heads), expected);
  // A KV cache of 2 more keys (T 7), and a mask (1 per score).
  EXPECT_EQ(flops_of("Attention", {f32({1, 2, 3, 4}), f32({1, 2, 5, 4}), f32({1, 2, 5, 6}), f32({3, 7}),
                                   f32({1, 2, 2, 4}), f32({1, 2, 2, 6})}),
            2 * 24 * 7 + 2 * 36 * 7 + 42 * 10);
  // Grouped-query: 4 query heads read 2 KV heads; the work follows the query heads.
  EXPECT_EQ(flops_of("Attention", {f32({1, 4, 3, 4}), f32({1, 2, 5, 4}), f32({1, 2, 5, 6})}), 2 * expected);
  // Rotary caches (T = S = 3): RotaryEmbedding's 3 per element over Q (24) and K (24) on top.
  EXPECT_EQ(flops_of("Attention", {f32({1, 2, 3, 4}), f32({1, 2, 3, 4}), f32({1, 2, 3, 6}), std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt, f32({1, 3, 2}), f32({1, 3, 2})}),
            2 * 24 * 3 + 2 * 36 * 3 + 18 * 9 + 3 * (24 + 24));
}

TEST(FlopModels, FusedOpsAddTheirEpilogueToTheDenseCount) {
  const int64_t matmul = flops_of("MatMul", {f32({2, 3, 5}), f32({5, 7})});
  ASSERT_EQ(matmul, 2 * 42 * 5);
  EXPECT_EQ(flops_of("FusedMatMul", {f32({2, 3, 5}), f32({5, 7})}), matmul);
  // Bias add and Relu: 2 per output element.
  EXPECT_EQ(flops_of("FusedMatMul", {f32({2, 3, 5}), f32({5, 7}), f32({7})}, {attr("activation", std::string("Relu"))}),
            matmul + 42 * 2);
  // Then a residual add and a Sigmoid (7).
  EXPECT_EQ(flops_of("FusedMatMul", {f32({2, 3, 5}), f32({5, 7}), f32({7}), f32({2, 3, 7})},
                     {attr("activation", std::string("Relu")), attr("post_activation", std::string("Sigmoid"))}),
            matmul + 42 * (1 + 1 + 1 + 7));
  // Split outputs (Q, K and V from one product) count the whole product once.
  EXPECT_EQ(flops_of("FusedMatMul", {f32({2, 3, 5}), f32({5, 7}), f32({7})},
                     {attr("activation", std::string("Relu")), attr("splits", std::vector<int64_t>{4, 2, 1})}, 3),
            matmul + 42 * 2);
  // ... with the Relu on the first and last outputs only (24 and 6 of the 42 elements).
  EXPECT_EQ(flops_of("FusedMatMul", {f32({2, 3, 5}), f32({5, 7}), f32({7})},
                     {attr("activation", std::string("Relu")), attr("splits", std::vector<int64_t>{4, 2, 1}),
                      attr("activated", std::vector<int64_t>{1, 0, 1})},
                     3),
            matmul + 42 + 30);
  // A gated product (SwiGLU, gate_block): 24 outputs of [2, 3, 4], each a value and a gate
  // column (twice the products and bias adds), the gate's Sigmoid (7) and a multiply.
  EXPECT_EQ(flops_of("FusedMatMul", {f32({2, 3, 5}), f32({5, 8}), f32({8})},
                     {attr("activation", std::string("Sigmoid")), attr("gate_block", int64_t{2})}),
            24 * (2 * 2 * 5 + 2 + 7 + 1));
  const int64_t conv = flops_of("Conv", {f32({1, 8, 16, 16}), f32({4, 8, 3, 3})});
  EXPECT_EQ(flops_of("FusedConv", {f32({1, 8, 16, 16}), f32({4, 8, 3, 3}), f32({4})},
                     {attr("activation", std::string("Clip")), attr("activation_params", std::vector<double>{0, 6})}),
            conv + 4 * 14 * 14 * (1 + 2));
  // PointwiseDepthwiseConv: its FusedConv stages' counts (1x1 8 -> 24 with bias and Clip, then
  // 3x3 depthwise stride 2 with bias and SiLU, then the projection), both layouts.
  for (int64_t last : {0, 1}) {
    const std::vector<int64_t> x = last ? std::vector<int64_t>{1, 16, 16, 8} : std::vector<int64_t>{1, 8, 16, 16};
    const std::vector<int64_t> t = last ? std::vector<int64_t>{1, 16, 16, 24} : std::vector<int64_t>{1, 24, 16, 16};
    const Attribute cl = attr("channels_last", last);
    const std::vector<Attribute> window = {attr("group", int64_t{24}), attr("pads", std::vector<int64_t>{1, 1, 1, 1}),
                                           attr("strides", std::vector<int64_t>{2, 2}), cl, attr("activation", std::string("Silu"))};
    const int64_t pw = flops_of("FusedConv", {f32(x), f32({24, 8, 1, 1}), f32({24})},
                                {cl, attr("activation", std::string("Clip")), attr("activation_params", std::vector<double>{0, 6})});
    const int64_t dw = flops_of("FusedConv", {f32(t), f32({24, 1, 3, 3}), f32({24})}, window);
    ASSERT_EQ(pw, 256 * 24 * (2 * 8 + 1 + 2));
    std::vector<Attribute> fused = window;
    fused.push_back(attr("pointwise_activation", std::string("Clip")));
    fused.push_back(attr("pointwise_activation_params", std::vector<double>{0, 6}));
    EXPECT_EQ(flops_of("PointwiseDepthwiseConv", {f32(x), f32({24, 8, 1, 1}), f32({24}), f32({24, 1, 3, 3}), f32({24})}, fused), pw + dw);
    // With a projection 24 -> 8 (bias, LeakyRelu, residual Z), and without the expansion.
    const std::vector<int64_t> d = last ? std::vector<int64_t>{1, 8, 8, 24} : std::vector<int64_t>{1, 24, 8, 8};
    const std::vector<int64_t> y = {1, 8, 8, 8};  // 8 channels of 8x8 either way
    const int64_t pj = flops_of("FusedConv", {f32(d), f32({8, 24, 1, 1}), f32({8}), f32(y)},
                                {cl, attr("activation", std::string("LeakyRelu")), attr("activation_params", std::vector<double>{0.1})});
    ASSERT_EQ(pj, 64 * 8 * (2 * 24 + 1 + 2 + 1));
    fused.push_back(attr("projection_activation", std::string("LeakyRelu")));
    fused.push_back(attr("projection_activation_params", std::vector<double>{0.1}));
    EXPECT_EQ(flops_of("PointwiseDepthwiseConv",
                       {f32(x), f32({24, 8, 1, 1}), f32({24}), f32({24, 1, 3, 3}), f32({24}), f32({8, 24, 1, 1}), f32({8}), f32(y)}, fused),
              pw + dw + pj);
    EXPECT_EQ(flops_of("PointwiseDepthwiseConv", {f32(t), std::nullopt, std::nullopt, f32({24, 1, 3, 3}),
                                                  f32({24}), f32({8, 24, 1, 1}), f32({8}), f32(y)},
                       fused),
              dw + pj);
  }
}

TEST(FlopModels, OtherLayers) {
  // Einsum as a matrix product: 2 per multiply-accumulate, like MatMul.
  EXPECT_EQ(flops_of("Einsum", {f32({2, 3}), f32({3, 4})}, {attr("equation", std::string("ij,jk->ik"))}), 2 * 8 * 3);
  // RNN, X [S 3, B 2, I 4], H 5: per step and batch X·Wᵀ and H·Rᵀ (2·(20 + 25)), then + Wb + Rb
  // and tanh (6) per hidden unit.
  EXPECT_EQ(flops_of("RNN", {f32({3, 2, 4}), f32({1, 5, 4}), f32({1, 5, 5})}, {attr("hidden_size", int64_t{5})}, 2),
            6 * (2 * (20 + 25) + 5 * 6));
  // RotaryEmbedding: 3 per rotated element, the first 4 of each head's 8 features here.
  EXPECT_EQ(flops_of("RotaryEmbedding", {f32({1, 2, 3, 8}), f32({1, 3, 2}), f32({1, 3, 2})},
                     {attr("rotary_embedding_dim", int64_t{4})}),
            48 / 8 * 4 * 3);
  EXPECT_EQ(flops_of("QuantizeLinear", {f32({2, 3}), f32({}), typed({}, DType::u8)}), 6 * 5);
  EXPECT_EQ(flops_of("DequantizeLinear", {typed({2, 3}, DType::u8), f32({}), typed({}, DType::u8)}), 6 * 2);
}

TEST(FlopModels, InspectSumsEveryNode) {
  // Conv then Relu: the model's total is both nodes' counts.
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{1, 8, 16, 16}));
  ValueId w = g.add_value("w", DType::f32, Shape::of(std::vector<int64_t>{4, 8, 3, 3}));
  ValueId c = g.add_value("c", DType::f32, Shape::of(std::vector<int64_t>{1, 4, 14, 14}));
  ValueId y = g.add_value("y", DType::f32, Shape::of(std::vector<int64_t>{1, 4, 14, 14}));
  g.inputs = {x, w};
  g.add_node(Node{.name = "conv", .op = "Conv", .inputs = {x, w}, .outputs = {c}});
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {c}, .outputs = {y}});
  g.outputs = {y};
  EXPECT_EQ(summarize(m).flops, 2 * 4 * 14 * 14 * 8 * 3 * 3 + 4 * 14 * 14);
}

// Every model on every op, with inputs and outputs of unknown rank or of absurd sizes: a
// count (0 when a needed rank is unknown, saturated when huge), never a crash or a negative.
TEST(FlopModels, HostileShapesSaturate) {
  const int64_t big = int64_t{1} << 20;
  for (const Shape& s : {Shape::unknown_rank(), Shape::of(std::vector<int64_t>{big, big, big, big})}) {
    for (const auto& [domain, schema] : core_ops().all()) {
      const int max_in = schema->max_inputs == kVariadic ? schema->min_inputs + 1 : schema->max_inputs;
      for (int inputs : {schema->min_inputs, max_in}) {
        Graph g;
        Node n{.name = "n", .op = std::string(schema->name)};
        for (int i = 0; i < inputs; ++i) n.inputs.push_back(g.add_value("in" + std::to_string(i), DType::f32, s));
        for (int i = 0; i < std::max(schema->min_outputs, 1); ++i)
          n.outputs.push_back(g.add_value("y" + std::to_string(i), DType::f32, s));
        g.add_node(std::move(n));
        const int64_t f = node_flops(g.nodes[0], g);
        EXPECT_GE(f, 0) << schema->name << " with " << inputs << " inputs of shape " << s.str();
        if (!s.rank_known) {
          EXPECT_EQ(f, 0) << schema->name << " with " << inputs << " inputs of unknown rank";
        }
      }
    }
  }
  const int64_t huge = int64_t{1} << 40;
  EXPECT_EQ(flops_of("Attention", {f32({huge, 2, huge, 4}), f32({huge, 2, huge, 4}), f32({huge, 2, huge, 4})}),
            std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace kiln
