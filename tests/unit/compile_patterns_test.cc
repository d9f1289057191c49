// The exporter-pattern passes (LayerNormalization, RMSNormalization, Gelu, Attention): golden
// text of what each makes from the forms tests/models/make_models.py writes, the outputs before
// and after on the reference kernels, and the near misses each must leave alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "compile/pass.h"
#include "compile/passes/patterns.h"
#include "tests/unit/compile_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::GraphBuilder;
using testing::ints;
using testing::make;
using testing::nodes_text;
using testing::ramp;

constexpr float kF32Min = -3.4028234663852886e38f;

size_t apply(Model& m, Result<size_t> (*pass)(Graph&), const std::vector<Tensor>& inputs, double tol) {
  size_t made = 0;
  testing::expect_same_outputs(
      m,
      [&](Graph& g) {
        auto r = pass(g);
        ASSERT_TRUE(r.ok()) << r.error().message();
        made = *r;
      },
      inputs, tol);
  return made;
}

// torch's LayerNorm before opset 17; `shared_centered` gives x - mean a reader outside.
Model layer_norm(bool shared_centered) {
  GraphBuilder b;
  ValueId x = b.input("x", {2, 5, 8});
  ValueId axes = b.constant("axes", ints({-1}));
  ValueId mean = b.op("mean", "ReduceMean", {x, axes});
  ValueId c = b.op("centered", "Sub", {x, mean});
  ValueId var = b.op("var", "ReduceMean", {b.op("sq", "Pow", {c, b.scalar("two", 2)}), axes});
  ValueId sd = b.op("std", "Sqrt", {b.op("var_eps", "Add", {var, b.scalar("eps", 0.0009765625f)})});
  ValueId y = b.op("scaled", "Mul", {b.op("norm", "Div", {c, sd}), b.constant("w", ramp({8}, 0.3f))});
  ValueId out = b.op("out", "Add", {y, b.constant("bias", ramp({8}, 0.2f))});
  std::vector<ValueId> outs = {out};
  if (shared_centered) outs.push_back(b.op("leak", "Relu", {c}));
  return b.done(outs);
}

TEST(CompilePatterns, LayerNorm) {
  Model m = layer_norm(false);
  EXPECT_EQ(apply(m, fuse_layer_norm, {ramp({2, 5, 8})}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node norm: LayerNormalization(x, w, bias) -> (out) axis=-1 epsilon=0.0009765625 "
            "sources=[\"mean\", \"centered\", \"sq\", \"var\", \"var_eps\", \"std\", \"norm\", \"scaled\", \"out\"]\n");
  Model shared = layer_norm(true);
  const std::string before = nodes_text(shared.graph);
  EXPECT_EQ(apply(shared, fuse_layer_norm, {ramp({2, 5, 8})}, 0), 0u);
  EXPECT_EQ(nodes_text(shared.graph), before);
}

TEST(CompilePatterns, RmsNorm) {
  GraphBuilder b;
  ValueId x = b.input("x", {2, 3, 8});
  ValueId var = b.op("var", "ReduceMean", {b.op("sq", "Pow", {x, b.scalar("two", 2)}), b.constant("axes", ints({-1}))});
  ValueId sd = b.op("std", "Sqrt", {b.op("var_eps", "Add", {var, b.scalar("eps", 0.0009765625f)})});
  ValueId inv = b.op("inv", "Div", {b.scalar("one", 1), sd});
  ValueId y = b.op("out", "Mul", {b.constant("w", ramp({8}, 0.3f)), b.op("norm", "Mul", {x, inv})});
  Model m = b.done({y, b.op("residual", "Relu", {x})});
  EXPECT_EQ(apply(m, fuse_rms_norm, {ramp({2, 3, 8})}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node residual: Relu(x) -> (residual)\n"
            "node sq: RMSNormalization(x, w) -> (out) axis=-1 epsilon=0.0009765625 "
            "sources=[\"sq\", \"var\", \"var_eps\", \"std\", \"inv\", \"norm\", \"out\"]\n");
}

TEST(CompilePatterns, GeluForms) {
  // BERT: Mul(Mul(x, 1 + erf(x / √2)), 0.5); the half first: Mul(Mul(x, 0.5), 1 + erf(x * 1/√2));
  // GPT-2: Mul(Mul(0.5, x), 1 + tanh(√(2/π) · (x + 0.044715 · x³))).
  GraphBuilder b;
  ValueId x = b.input("x", {3, 16});
  ValueId e1 = b.op("e1", "Add", {b.op("erf1", "Erf", {b.op("d1", "Div", {x, b.scalar("sqrt2", 1.4142135381698608f)})}), b.scalar("one1", 1)});
  ValueId g1 = b.op("g1", "Mul", {b.op("xe1", "Mul", {x, e1}), b.scalar("half1", 0.5f)});
  ValueId e2 = b.op("e2", "Add", {b.scalar("one2", 1), b.op("erf2", "Erf", {b.op("d2", "Mul", {x, b.scalar("isqrt2", 0.70710678f)})})});
  ValueId g2 = b.op("g2", "Mul", {b.op("h2", "Mul", {x, b.scalar("half2", 0.5f)}), e2});
  ValueId cube = b.op("cube", "Pow", {x, b.scalar("three", 3)});
  ValueId inner = b.op("inner", "Add", {x, b.op("c3", "Mul", {b.scalar("k", 0.044715f), cube})});
  ValueId t = b.op("t", "Add", {b.scalar("one3", 1), b.op("tanh", "Tanh", {b.op("s3", "Mul", {b.scalar("sqrt2pi", 0.7978845608028654f), inner})})});
  ValueId g3 = b.op("g3", "Mul", {b.op("h3", "Mul", {b.scalar("half3", 0.5f), x}), t});
  // Near miss: 1 + erf(x / 2) is not GELU.
  ValueId e4 = b.op("e4", "Add", {b.op("erf4", "Erf", {b.op("d4", "Div", {x, b.scalar("two", 2)})}), b.scalar("one4", 1)});
  ValueId g4 = b.op("g4", "Mul", {b.op("xe4", "Mul", {x, e4}), b.scalar("half4", 0.5f)});
  Model m = b.done({g1, g2, g3, g4});
  EXPECT_EQ(apply(m, fuse_gelu, {ramp({3, 16})}, 1e-6), 3u);
  EXPECT_EQ(nodes_text(m.graph),
            "node d4: Div(x, two) -> (d4)\nnode erf4: Erf(d4) -> (erf4)\nnode e4: Add(erf4, one4) -> (e4)\n"
            "node xe4: Mul(x, e4) -> (xe4)\nnode g4: Mul(xe4, half4) -> (g4)\n"
            "node erf1: Gelu(x) -> (g1) sources=[\"d1\", \"erf1\", \"e1\", \"xe1\", \"g1\"]\n"
            "node erf2: Gelu(x) -> (g2) sources=[\"d2\", \"erf2\", \"e2\", \"h2\", \"g2\"]\n"
            "node tanh: Gelu(x) -> (g3) approximate=\"tanh\" sources=[\"cube\", \"c3\", \"inner\", \"s3\", \"tanh\", \"t\", \"h3\", \"g3\"]\n");
}

// BERT: K projected as [B, S, H, D] and transposed to Kᵀ in one Transpose, scores / √D, an
// additive padding mask.
TEST(CompilePatterns, AttentionBertForm) {
  GraphBuilder b;
  ValueId q = b.input("q", {1, 2, 4, 8}), kp = b.input("kp", {1, 4, 2, 8}), v = b.input("v", {1, 2, 4, 8});
  ValueId mask = b.input("mask", {1, 1, 1, 4});
  ValueId kt = b.op("kt", "Transpose", {kp}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})});
  ValueId s = b.op("scores", "Div", {b.op("qk", "MatMul", {q, kt}), b.scalar("sqrt_d", 2.828427f)});
  ValueId p = b.op("probs", "Softmax", {b.op("masked", "Add", {s, mask})}, {attr("axis", int64_t{-1})});
  Model m = b.done({b.op("ctx", "MatMul", {p, v})});
  Tensor mk = make<float>({1, 1, 1, 4}, {0, 0, 0, kF32Min});
  EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 2, 4, 8}), ramp({1, 4, 2, 8}, 0.3f), ramp({1, 2, 4, 8}, 0.2f), mk}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node kt_k: Transpose(kp) -> (kt_k) perm=ints[0, 2, 1, 3]\n"
            "node ctx: Attention(q, kt_k, v, mask) -> (ctx) scale=0.3535533966440824 "
            "sources=[\"kt\", \"qk\", \"scores\", \"masked\", \"probs\", \"ctx\"]\n");
}

// LLaMA's rotary embedding as exported: x·cos + Concat(-x[..., 4:], x[..., :4])·sin with the
// tables folded to constants [1, 1, S, D] (cat(freqs, freqs): halves equal). `halves_differ`
// breaks that, so the tables are not a RotaryEmbedding's caches.
Model rotary(bool halves_differ) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 2, 3, 8});
  Tensor cos(DType::f32, {1, 1, 3, 8}), sin(DType::f32, {1, 1, 3, 8});
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t e = 0; e < 8; ++e) {
      const double angle = (t + 1) * (e % 4 + 1) * 0.4;
      cos.data<float>()[t * 8 + e] = static_cast<float>(std::cos(angle));
      sin.data<float>()[t * 8 + e] = static_cast<float>(std::sin(angle)) + (halves_differ && e == 6 ? 0.1f : 0.f);
    }
  ValueId axes = b.constant("axes", ints({3})), one = b.constant("one", ints({1}));
  ValueId upper = b.op("upper", "Slice", {x, b.constant("four", ints({4})), b.constant("end", ints({std::numeric_limits<int64_t>::max()})), axes, one});
  ValueId lower = b.op("lower", "Slice", {x, b.constant("zero", ints({0})), b.constant("half", ints({4})), axes, one});
  ValueId rotated = b.op("rotated", "Concat", {b.op("neg", "Neg", {upper}), lower}, {attr("axis", int64_t{-1})});
  ValueId a = b.op("xc", "Mul", {x, b.constant("cos", cos)});
  ValueId s = b.op("rs", "Mul", {rotated, b.constant("sin", sin)});
  return b.done({b.op("y", "Add", {a, s})});
}

TEST(CompilePatterns, RotaryEmbedding) {
  Model m = rotary(false);
  EXPECT_EQ(apply(m, fuse_rotary, {ramp({1, 2, 3, 8})}, 1e-6), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node y: RotaryEmbedding(x, cos_cache, sin_cache) -> (y) sources=[\"upper\", \"lower\", \"neg\", \"rotated\", \"rs\", "
            "\"xc\", \"y\"]\n");
  EXPECT_EQ(m.graph.value(m.graph.find_value("cos_cache")).constant.shape(), (std::vector<int64_t>{1, 3, 4}));
  // Tables whose halves differ are not caches: nothing changes.
  Model other = rotary(true);
  EXPECT_EQ(apply(other, fuse_rotary, {ramp({1, 2, 3, 8})}, 0), 0u);
  EXPECT_EQ(other.graph.nodes.size(), 7u);
}

// The projections split into heads and the context merged back: BERT's Kᵀ in one Transpose
// (0,2,3,1), GPT-2's in two (0,2,1,3 then 0,1,3,2). The Attention reads the 3-D projections
// and writes the merged context; no Transpose is left. With `y_read_4d` the 4-D context has
// another reader, so the heads stay 4-D.
Model split_heads_attention(bool kt_in_one, bool y_read_4d) {
  GraphBuilder b;
  ValueId mask = b.input("mask", {1, 1, 1, 5});
  auto split = [&](const std::string& name, const std::vector<int64_t>& perm) {
    ValueId x = b.input(name, {1, 5, 24});
    ValueId r = b.op(name + "_4d", "Reshape", {x, b.constant(name + "_shape", ints({1, 5, 3, 8}))});
    return b.op(name + "_heads", "Transpose", {r}, {attr("perm", perm)});
  };
  ValueId q = split("q", {0, 2, 1, 3}), v = split("v", {0, 2, 1, 3});
  ValueId kt = kt_in_one ? split("k", {0, 2, 3, 1})
                         : b.op("kt", "Transpose", {split("k", {0, 2, 1, 3})}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  ValueId s = b.op("scores", "Div", {b.op("qk", "MatMul", {q, kt}), b.scalar("sqrt_d", 2.828427f)});
  ValueId p = b.op("probs", "Softmax", {b.op("masked", "Add", {s, mask})});
  ValueId ctx = b.op("ctx", "MatMul", {p, v});
  ValueId merged = b.op("ctx_t", "Transpose", {ctx}, {attr("perm", std::vector<int64_t>{0, 2, 1, 3})});
  ValueId out = b.op("out", "Reshape", {merged, b.constant("out_shape", ints({1, 5, 24}))});
  std::vector<ValueId> outs = {out};
  if (y_read_4d) outs.push_back(b.op("leak", "Relu", {ctx}));
  return b.done(outs);
}

TEST(CompilePatterns, AttentionSequenceMajor) {
  Tensor mk = make<float>({1, 1, 1, 5}, {0, 0, 0, 0, kF32Min});
  const std::vector<Tensor> inputs = {mk, ramp({1, 5, 24}), ramp({1, 5, 24}, 0.2f), ramp({1, 5, 24}, 0.3f)};
  for (bool kt_in_one : {true, false}) {
    SCOPED_TRACE(kt_in_one ? "Kt in one Transpose" : "Kt in two");
    Model m = split_heads_attention(kt_in_one, false);
    EXPECT_EQ(apply(m, fuse_attention, inputs, 1e-5), 1u);
    const std::string k_sources = kt_in_one ? "\"k_4d\", \"k_heads\"" : "\"k_4d\", \"k_heads\", \"kt\"";
    EXPECT_EQ(nodes_text(m.graph),
              "node ctx: Attention(q, k, v, mask) -> (out) kv_num_heads=3 q_num_heads=3 scale=0.3535533966440824 sources=[\"q_4d\", "
              "\"q_heads\", \"v_4d\", \"v_heads\", " + k_sources + ", \"qk\", \"scores\", \"masked\", \"probs\", \"ctx\", "
              "\"ctx_t\", \"out\"]\n");
  }
  // The 4-D context is read elsewhere: the Attention stays head-major.
  Model m = split_heads_attention(true, true);
  EXPECT_EQ(apply(m, fuse_attention, inputs, 1e-5), 1u);
  const std::string text = nodes_text(m.graph);
  EXPECT_NE(text.find("Attention(q_heads, k_heads_k, v_heads, mask) -> (ctx)"), std::string::npos) << text;
  EXPECT_EQ(text.find("q_num_heads"), std::string::npos) << text;
}

// BERT exported with a symbolic batch and sequence: each head split and the merge reshape by a
// shape computed from the projection's own (Concat(Shape(x)[0], Shape(x)[1], H, D)), so the
// dims between are unknown to inference. fold_constants makes the shapes [0, 0, H, D] and
// [0, 0, H·D] (copies of the dims, whatever they are); the Attention then reads the 3-D
// projections as when the shapes were numbers.
TEST(CompilePatterns, AttentionSequenceMajorWithComputedShapes) {
  GraphBuilder b;
  const Shape dynamic({Dim::sym("batch"), Dim::unknown(), Dim::known(24)});
  ValueId axes = b.constant("axes", ints({0}));
  auto leading_dims = [&](ValueId of, const std::string& name) {
    ValueId s = b.op(name + "_shape", "Shape", {of});
    std::vector<ValueId> dims;
    for (int64_t i : {0, 1}) {
      ValueId at = b.constant(name + "_at" + std::to_string(i), Tensor::from<int64_t>({}, {i}));
      dims.push_back(b.op(name + "_u" + std::to_string(i), "Unsqueeze", {b.op(name + "_d" + std::to_string(i), "Gather", {s, at}), axes}));
    }
    return dims;
  };
  auto split = [&](const std::string& name, const std::vector<int64_t>& perm) {
    ValueId x = b.input(name, dynamic);
    std::vector<ValueId> target = leading_dims(x, name);
    target.push_back(b.constant(name + "_heads", ints({3, 8})));
    ValueId r = b.op(name + "_4d", "Reshape", {x, b.op(name + "_target", "Concat", target, {attr("axis", int64_t{0})})});
    return b.op(name + "_split", "Transpose", {r}, {attr("perm", perm)});
  };
  ValueId q = split("q", {0, 2, 1, 3}), kt = split("k", {0, 2, 3, 1}), v = split("v", {0, 2, 1, 3});
  ValueId s = b.op("scores", "Div", {b.op("qk", "MatMul", {q, kt}), b.scalar("sqrt_d", 2.828427f)});
  ValueId ctx = b.op("ctx", "MatMul", {b.op("probs", "Softmax", {s}), v});
  ValueId merged = b.op("ctx_t", "Transpose", {ctx}, {attr("perm", std::vector<int64_t>{0, 2, 1, 3})});
  std::vector<ValueId> target = leading_dims(merged, "out");
  target.push_back(b.constant("out_width", ints({24})));
  Model m = b.done({b.op("out", "Reshape", {merged, b.op("out_target", "Concat", target, {attr("axis", int64_t{0})})})});
  // Without the constant shapes the pattern cannot see a head split.
  Model unfolded = m;
  EXPECT_EQ(apply(unfolded, fuse_attention, {ramp({2, 5, 24}), ramp({2, 5, 24}, 0.2f), ramp({2, 5, 24}, 0.3f)}, 1e-5), 1u);
  EXPECT_NE(nodes_text(unfolded.graph).find("Transpose"), std::string::npos);
  Model fused;
  for (int64_t seq : {5, 1}) {
    SCOPED_TRACE("sequence " + std::to_string(seq));
    fused = m;
    size_t made = 0;
    testing::expect_same_outputs(
        fused,
        [&](Graph& g) {
          Model folded;
          folded.graph = g;
          Target target;
          PassContext ctx{target, {}};
          ASSERT_TRUE(find_pass("fold_constants")->run(folded, ctx).ok());
          auto r = fuse_attention(folded.graph);
          ASSERT_TRUE(r.ok()) << r.error().message();
          made = *r;
          g = folded.graph;
        },
        {ramp({2, seq, 24}), ramp({2, seq, 24}, 0.2f), ramp({2, seq, 24}, 0.3f)}, 1e-5);
    EXPECT_EQ(made, 1u);
  }
  EXPECT_EQ(nodes_text(fused.graph),
            "node ctx: Attention(q, k, v) -> (out) kv_num_heads=3 q_num_heads=3 scale=0.3535533966440824 sources=[\"q_4d\", "
            "\"q_split\", \"k_4d\", \"k_split\", \"v_4d\", \"v_split\", \"qk\", \"scores\", \"probs\", \"ctx\", \"ctx_t\", \"out\"]\n");
}

// ViT: one qkv projection [B, S, 3·H·D] reshaped to [B, S, 3, H, D], permuted to [3, B, H, S, D],
// split on axis 0 and squeezed. The Attention reads Q, K and V cut from the projection by one
// Split along its features, and writes the merged context.
TEST(CompilePatterns, AttentionPackedQkv) {
  GraphBuilder b;
  ValueId qkv = b.input("qkv", {1, 5, 24});
  ValueId r = b.op("qkv_5d", "Reshape", {qkv, b.constant("qkv_shape", ints({1, 5, 3, 2, 4}))});
  ValueId t = b.op("qkv_t", "Transpose", {r}, {attr("perm", std::vector<int64_t>{2, 0, 3, 1, 4})});
  std::vector<ValueId> parts;
  for (const char* name : {"p0", "p1", "p2"}) parts.push_back(b.g.add_value(name, DType::undefined));
  Node split = testing::node("split", "Split", {t, b.constant("ones", ints({1, 1, 1}))}, parts);
  split.set_attr("axis", int64_t{0});
  b.g.add_node(std::move(split));
  ValueId zero = b.constant("zero", ints({0}));
  ValueId q = b.op("q", "Squeeze", {parts[0], zero}), k = b.op("k", "Squeeze", {parts[1], zero}), v = b.op("v", "Squeeze", {parts[2], zero});
  ValueId kt = b.op("kt", "Transpose", {k}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  ValueId s = b.op("scores", "Mul", {b.op("qk", "MatMul", {q, kt}), b.scalar("scale", 0.5f)});
  ValueId ctx = b.op("ctx", "MatMul", {b.op("probs", "Softmax", {s}), v});
  ValueId merged = b.op("ctx_t", "Transpose", {ctx}, {attr("perm", std::vector<int64_t>{0, 2, 1, 3})});
  Model m = b.done({b.op("out", "Reshape", {merged, b.constant("out_shape", ints({1, 5, 8}))})});
  EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 5, 24})}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node qkv_qkv: Split(qkv, qkv_qkv_sizes) -> (qkv_q, qkv_k, qkv_v) axis=2\n"
            "node ctx: Attention(qkv_q, qkv_k, qkv_v) -> (out) kv_num_heads=2 q_num_heads=2 scale=0.5 sources=[\"qkv_5d\", \"qkv_t\", "
            "\"split\", \"q\", \"k\", \"v\", \"kt\", \"qk\", \"scores\", \"probs\", \"ctx\", \"ctx_t\", \"out\"]\n");
}

// GPT-2: a causal Where(bool, scores, float minimum); ViT-style Mul by the scale.
TEST(CompilePatterns, AttentionCausalWhereAndScaleMul) {
  GraphBuilder b;
  ValueId q = b.input("q", {1, 2, 4, 8}), k = b.input("k", {1, 2, 4, 8}), v = b.input("v", {1, 2, 4, 8});
  ValueId causal = b.input("causal", {1, 1, 4, 4}, DType::boolean);
  ValueId kt = b.op("kt", "Transpose", {k}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  ValueId s = b.op("scores", "Mul", {b.op("qk", "MatMul", {q, kt}), b.scalar("scale", 0.125f)});
  ValueId w = b.op("w", "Where", {causal, s, b.scalar("min", kF32Min)});
  ValueId p = b.op("probs", "Softmax", {w});
  Model m = b.done({b.op("ctx", "MatMul", {p, v})});
  Tensor tri = make<bool>({1, 1, 4, 4}, {1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1});
  EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 2, 4, 8}), ramp({1, 2, 4, 8}, 0.3f), ramp({1, 2, 4, 8}, 0.2f), tri}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node causal_additive: Where(causal, causal_additive_zero, min) -> (causal_additive)\n"
            "node ctx: Attention(q, k, v, causal_additive) -> (ctx) scale=0.125 "
            "sources=[\"kt\", \"qk\", \"scores\", \"w\", \"probs\", \"ctx\"]\n");
}

// LLaMA: K and V repeated for 2 query heads per KV head; the Attention reads them unrepeated.
TEST(CompilePatterns, AttentionGroupedQuery) {
  GraphBuilder b;
  ValueId q = b.input("q", {1, 4, 3, 8}), k = b.input("k", {1, 2, 3, 8}), v = b.input("v", {1, 2, 3, 8});
  ValueId mask = b.input("mask", {1, 1, 3, 3});
  auto repeat = [&](ValueId t, const std::string& name) {
    ValueId u = b.op(name + "_unsq", "Unsqueeze", {t, b.constant(name + "_axes", ints({2}))});
    ValueId e = b.op(name + "_exp", "Expand", {u, b.constant(name + "_shape5", ints({1, 2, 2, 3, 8}))});
    return b.op(name + "_rep", "Reshape", {e, b.constant(name + "_shape4", ints({1, 4, 3, 8}))});
  };
  ValueId kr = repeat(k, "k"), vr = repeat(v, "v");
  ValueId kt = b.op("kt", "Transpose", {kr}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  ValueId s = b.op("scores", "Div", {b.op("qk", "MatMul", {q, kt}), b.scalar("sqrt_d", 2.828427f)});
  ValueId p = b.op("probs", "Softmax", {b.op("masked", "Add", {s, mask})});
  Model m = b.done({b.op("ctx", "MatMul", {p, vr})});
  Tensor causal = make<float>({1, 1, 3, 3}, {0, kF32Min, kF32Min, 0, 0, kF32Min, 0, 0, 0});
  EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 4, 3, 8}), ramp({1, 2, 3, 8}, 0.3f), ramp({1, 2, 3, 8}, 0.2f), causal}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node ctx: Attention(q, k, v, mask) -> (ctx) scale=0.3535533966440824 sources=[\"k_unsq\", \"k_exp\", \"k_rep\", "
            "\"v_unsq\", \"v_exp\", \"v_rep\", \"kt\", \"qk\", \"scores\", \"masked\", \"probs\", \"ctx\"]\n");
}

// LLaMA: Q and K split into heads and rotated (the RotaryEmbeddings fuse_rotary makes) by the
// same caches, K and V repeated for grouped-query heads, a causal mask, the context merged
// back. The Attention reads the 3-D projections before their rotation and takes the caches as
// rotary_cos / rotary_sin. `near_miss` 1: K rotated by caches of its own; 2: Q's pairs
// interleaved; either way both rotations stay, and so do the heads' transposes.
Model rotary_attention(int near_miss) {
  GraphBuilder b;
  const int64_t s = 5, d = 8;
  auto split = [&](const std::string& name, int64_t heads) {
    ValueId x = b.input(name, {1, s, heads * d});
    ValueId r = b.op(name + "_4d", "Reshape", {x, b.constant(name + "_shape", ints({1, s, heads, d}))});
    return b.op(name + "_heads", "Transpose", {r}, {attr("perm", std::vector<int64_t>{0, 2, 1, 3})});
  };
  auto repeat = [&](ValueId t, const std::string& name) {
    ValueId u = b.op(name + "_unsq", "Unsqueeze", {t, b.constant(name + "_axes", ints({2}))});
    ValueId e = b.op(name + "_exp", "Expand", {u, b.constant(name + "_shape5", ints({1, 2, 2, s, d}))});
    return b.op(name + "_rep", "Reshape", {e, b.constant(name + "_shape4", ints({1, 4, s, d}))});
  };
  ValueId cos = b.constant("cos", ramp({1, s, d / 2}, 0.1f)), sin = b.constant("sin", ramp({1, s, d / 2}, 0.2f));
  ValueId sin_k = near_miss == 1 ? b.constant("sin_k", ramp({1, s, d / 2}, 0.3f)) : sin;
  std::vector<Attribute> q_attrs;
  if (near_miss == 2) q_attrs.push_back(attr("interleaved", int64_t{1}));
  ValueId q = b.op("q_rot", "RotaryEmbedding", {split("q", 4), cos, sin}, q_attrs);
  ValueId k = b.op("k_rot", "RotaryEmbedding", {split("k", 2), cos, sin_k});
  ValueId v = split("v", 2);
  ValueId kt = b.op("kt", "Transpose", {repeat(k, "k")}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  ValueId scores = b.op("scores", "Div", {b.op("qk", "MatMul", {q, kt}), b.scalar("sqrt_d", 2.828427f)});
  Tensor causal(DType::f32, {1, 1, s, s});
  for (int64_t i = 0; i < s * s; ++i) causal.data<float>()[i] = i % s > i / s ? kF32Min : 0.f;
  ValueId p = b.op("probs", "Softmax", {b.op("masked", "Add", {scores, b.constant("causal", causal)})});
  ValueId ctx = b.op("ctx", "MatMul", {p, repeat(v, "v")});
  ValueId merged = b.op("ctx_t", "Transpose", {ctx}, {attr("perm", std::vector<int64_t>{0, 2, 1, 3})});
  return b.done({b.op("out", "Reshape", {merged, b.constant("out_shape", ints({1, s, 4 * d}))})});
}

TEST(CompilePatterns, AttentionTakesRotaryEmbeddings) {
  const std::vector<Tensor> inputs = {ramp({1, 5, 32}), ramp({1, 5, 16}, 0.3f), ramp({1, 5, 16}, 0.2f)};
  Model m = rotary_attention(0);
  EXPECT_EQ(apply(m, fuse_attention, inputs, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph),
            "node ctx: Attention(q, k, v, _, _, _, _, cos, sin) -> (out) is_causal=1 kv_num_heads=2 q_num_heads=4 scale=0.3535533966440824 "
            "sources=[\"q_4d\", \"q_heads\", \"q_rot\", \"k_4d\", \"k_heads\", \"k_rot\", \"v_4d\", \"v_heads\", \"k_unsq\", \"k_exp\", "
            "\"k_rep\", \"kt\", \"qk\", \"scores\", \"masked\", \"probs\", \"v_unsq\", \"v_exp\", \"v_rep\", \"ctx\", \"ctx_t\", \"out\"]\n");
  for (int near_miss : {1, 2}) {
    SCOPED_TRACE(near_miss);
    Model other = rotary_attention(near_miss);
    EXPECT_EQ(apply(other, fuse_attention, inputs, 1e-5), 1u);
    const std::string text = nodes_text(other.graph);
    EXPECT_NE(text.find("RotaryEmbedding(q_heads"), std::string::npos) << text;
    EXPECT_NE(text.find("RotaryEmbedding(k_heads"), std::string::npos) << text;
    EXPECT_EQ(text.find("q_num_heads"), std::string::npos) << text;
  }
}

// LLaMA and GPT-2 as exported for a fixed length: the causal mask is a constant (additive, or a
// Where's condition); the Attention gets is_causal instead of reading it.
TEST(CompilePatterns, AttentionConstantCausalMaskBecomesIsCausal) {
  Tensor additive = make<float>({1, 1, 3, 3}, {0, kF32Min, kF32Min, 0, 0, kF32Min, 0, 0, 0});
  Tensor keep = make<bool>({1, 1, 3, 3}, {1, 0, 0, 1, 1, 0, 1, 1, 1});
  Tensor not_causal = make<float>({1, 1, 3, 3}, {0, kF32Min, 0, 0, 0, kF32Min, 0, 0, 0});
  for (const Tensor* mask : {&additive, &keep, &not_causal}) {
    GraphBuilder b;
    ValueId q = b.input("q", {1, 2, 3, 8}), k = b.input("k", {1, 2, 3, 8}), v = b.input("v", {1, 2, 3, 8});
    ValueId kt = b.op("kt", "Transpose", {k}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
    ValueId s = b.op("qk", "MatMul", {q, kt});
    ValueId c = b.constant("mask", *mask);
    ValueId masked = mask == &keep ? b.op("masked", "Where", {c, s, b.scalar("min", kF32Min)}) : b.op("masked", "Add", {s, c});
    Model m = b.done({b.op("ctx", "MatMul", {b.op("probs", "Softmax", {masked}), v})});
    EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 2, 3, 8}), ramp({1, 2, 3, 8}, 0.3f), ramp({1, 2, 3, 8}, 0.2f)}, 1e-5), 1u);
    const Node& att = m.graph.nodes.back();
    ASSERT_EQ(att.op, "Attention");
    EXPECT_EQ(att.attr_int("is_causal", 0), mask == &not_causal ? 0 : 1);
    EXPECT_EQ(att.inputs.size(), mask == &not_causal ? 4u : 3u);
  }
}

// The LLaMA generator's mask, computed at run time from the sequence length: Where(Less(col,
// row), min, 0) over Range positions. It depends on constants alone once the length is known,
// so the pass computes it, sees that it is causal, and the nodes making it become dead.
TEST(CompilePatterns, AttentionComputedCausalMaskBecomesIsCausal) {
  GraphBuilder b;
  ValueId q = b.input("q", {1, 2, 5, 8}), k = b.input("k", {1, 2, 5, 8}), v = b.input("v", {1, 2, 5, 8});
  ValueId pos = b.op("pos", "Range", {b.constant("zero", make<int64_t>({}, {0})), b.constant("len", make<int64_t>({}, {5})),
                                      b.constant("one", make<int64_t>({}, {1}))});
  ValueId col = b.op("col", "Unsqueeze", {pos, b.constant("ax1", ints({1}))});
  ValueId future = b.op("future", "Less", {col, pos});
  ValueId mask = b.op("mask", "Where", {future, b.scalar("min", kF32Min), b.scalar("zero_f", 0.f)});
  ValueId mask4 = b.op("mask4", "Unsqueeze", {mask, b.constant("ax01", ints({0, 1}))});
  ValueId kt = b.op("kt", "Transpose", {k}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  ValueId s = b.op("masked", "Add", {b.op("qk", "MatMul", {q, kt}), mask4});
  Model m = b.done({b.op("ctx", "MatMul", {b.op("probs", "Softmax", {s}), v})});
  EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 2, 5, 8}), ramp({1, 2, 5, 8}, 0.3f), ramp({1, 2, 5, 8}, 0.2f)}, 1e-5), 1u);
  EXPECT_EQ(nodes_text(m.graph), "node ctx: Attention(q, k, v) -> (ctx) is_causal=1 scale=1.0 sources=[\"kt\", \"qk\", \"masked\", \"probs\", \"ctx\"]\n");
}

// The same masks built from a sequence length that is a symbol (a model compiled without
// --input-shape): GPT-2's condition Cast(Trilu(ConstantOfShape([S, S], 1)), bool) and LLaMA's
// Where(Less(col, row), min, 0) over Range(0, S, 1), S taken from Q's shape. They cannot be
// computed, but they are causal for every S by construction: is_causal, the same outputs at
// two lengths. Built from another length, or above the diagonal, they stay masks.
TEST(CompilePatterns, AttentionSymbolicCausalMaskBecomesIsCausal) {
  enum Form { gpt2, llama, gpt2_upper, llama_other_length };
  for (Form form : {gpt2, llama, gpt2_upper, llama_other_length}) {
    SCOPED_TRACE(static_cast<int>(form));
    GraphBuilder b;
    const Shape heads({Dim::sym("batch"), Dim::known(2), Dim::sym("sequence"), Dim::known(8)});
    ValueId q = b.input("q", heads), k = b.input("k", heads), v = b.input("v", heads);
    ValueId other = b.input("other", Shape({Dim::sym("batch"), Dim::sym("other")}));
    ValueId len = b.op("len", "Gather", {b.op("q_shape", "Shape", {form == llama_other_length ? other : q}), b.constant("at", make<int64_t>({}, {form == llama_other_length ? 1 : 2}))});
    ValueId kt = b.op("kt", "Transpose", {k}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
    ValueId s = b.op("qk", "MatMul", {q, kt});
    ValueId masked;
    if (form == gpt2 || form == gpt2_upper) {
      ValueId len1 = b.op("len1", "Unsqueeze", {len, b.constant("ax0", ints({0}))});
      ValueId square = b.op("square", "Concat", {len1, len1}, {attr("axis", int64_t{0})});
      ValueId ones = b.op("ones", "ConstantOfShape", {square}, {attr("value", make<int64_t>({1}, {1}))});
      ValueId tril = b.op("tril", "Trilu", {ones}, {attr("upper", int64_t{form == gpt2_upper ? 1 : 0})});
      ValueId cond = b.op("cond", "Cast", {tril}, {attr("to", std::string("bool"))});
      ValueId cond4 = b.op("cond4", "Unsqueeze", {cond, b.constant("ax01", ints({0, 1}))});
      masked = b.op("masked", "Where", {cond4, s, b.scalar("min", kF32Min)});
    } else {
      ValueId pos = b.op("pos", "Range", {b.constant("zero", make<int64_t>({}, {0})), len, b.constant("one", make<int64_t>({}, {1}))});
      ValueId col = b.op("col", "Unsqueeze", {pos, b.constant("ax1", ints({1}))});
      ValueId mask = b.op("mask", "Where", {b.op("future", "Less", {col, pos}), b.scalar("min", kF32Min), b.scalar("zero_f", 0.f)});
      masked = b.op("masked", "Add", {s, b.op("mask4", "Unsqueeze", {mask, b.constant("ax01", ints({0, 1}))})});
    }
    const Model built = b.done({b.op("ctx", "MatMul", {b.op("probs", "Softmax", {masked}), v})});
    for (int64_t seq : {5, 1}) {
      Model m = built;
      const std::vector<Tensor> in = {ramp({2, 2, seq, 8}), ramp({2, 2, seq, 8}, 0.3f), ramp({2, 2, seq, 8}, 0.2f), ramp({2, seq})};
      EXPECT_EQ(apply(m, fuse_attention, in, 1e-5), 1u);
      const Node& att = m.graph.nodes.back();
      ASSERT_EQ(att.op, "Attention");
      EXPECT_EQ(att.attr_int("is_causal", 0), form == gpt2 || form == llama ? 1 : 0) << nodes_text(m.graph);
    }
  }
}

// ViT: no mask, the scale a Mul; and no scale at all.
TEST(CompilePatterns, AttentionWithoutMask) {
  for (bool scaled : {true, false}) {
    GraphBuilder b;
    ValueId q = b.input("q", {1, 2, 5, 8}), k = b.input("k", {1, 2, 5, 8}), v = b.input("v", {1, 2, 5, 8});
    ValueId s = b.op("qk", "MatMul", {q, b.op("kt", "Transpose", {k}, {attr("perm", std::vector<int64_t>{0, 1, 3, 2})})});
    if (scaled) s = b.op("scores", "Mul", {s, b.scalar("scale", 0.125f)});
    Model m = b.done({b.op("ctx", "MatMul", {b.op("probs", "Softmax", {s}, {attr("axis", int64_t{-1})}), v})});
    EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 2, 5, 8}), ramp({1, 2, 5, 8}, 0.3f), ramp({1, 2, 5, 8}, 0.2f)}, 1e-5), 1u);
    ASSERT_EQ(m.graph.nodes.size(), 1u);
    EXPECT_EQ(m.graph.nodes[0].attr_float("scale", 0), scaled ? 0.125 : 1.0);
  }
}

TEST(CompilePatterns, AttentionLeavesScoresThatAreReadElsewhere) {
  GraphBuilder b;
  ValueId q = b.input("q", {1, 2, 4, 8}), k = b.input("k", {1, 2, 8, 4}), v = b.input("v", {1, 2, 4, 8});
  ValueId s = b.op("qk", "MatMul", {q, k});
  ValueId p = b.op("probs", "Softmax", {s});
  Model m = b.done({b.op("ctx", "MatMul", {p, v}), s});
  const std::string before = nodes_text(m.graph);
  EXPECT_EQ(apply(m, fuse_attention, {ramp({1, 2, 4, 8}), ramp({1, 2, 8, 4}), ramp({1, 2, 4, 8})}, 0), 0u);
  EXPECT_EQ(nodes_text(m.graph), before);
}

}  // namespace
}  // namespace kiln
