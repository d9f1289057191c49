// The built-in quantizers' annotations on small exported-style graphs: which edges get which
// spec, the fused patterns PT2E's X86InductorQuantizer and XNNPACKQuantizer annotate as one,
// sharing through pooling / shape ops / Concat, and "the first annotation wins".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "compile/graph_util.h"
#include "compile/pipeline.h"
#include "formats/serialize.h"
#include "formats/verify.h"
#include "quant/config.h"
#include "quant/convert.h"
#include "quant/observer.h"
#include "quant/prepare.h"
#include "quant/quantizer.h"
#include "quant/report.h"
#include "runtime/cpu/gemm/lowp.h"
#include "tests/unit/compile_test_util.h"

namespace kiln::quant {
namespace {

using testing::GraphBuilder;

const QuantSpec* spec(const std::optional<EdgeSpec>& e) { return e ? std::get_if<QuantSpec>(&*e) : nullptr; }
const QuantSpec* input_spec(const NodeAnnotation& a, int slot) {
  auto it = a.inputs.find(slot);
  return it == a.inputs.end() ? nullptr : std::get_if<QuantSpec>(&it->second);
}

size_t node_index(const Model& m, const std::string& name) {
  for (size_t i = 0; i < m.graph.nodes.size(); ++i)
    if (m.graph.nodes[i].name == name) return i;
  ADD_FAILURE() << "no node " << name;
  return 0;
}

Tensor weights(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
  return testing::make<float>(std::move(shape), v);
}

// x → Conv → Relu → MaxPool → Flatten → MatMul(+bias Add) → out, and a residual Conv → Add.
Model cnn() {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 3, 8, 8});
  ValueId c1 = b.op("conv1", "Conv", {x, b.constant("w1", weights({4, 3, 3, 3})), b.constant("b1", weights({4}))},
                    {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  ValueId r1 = b.op("relu1", "Relu", {c1});
  ValueId c2 = b.op("conv2", "Conv", {r1, b.constant("w2", weights({4, 4, 1, 1}))});
  ValueId add = b.op("residual", "Add", {c2, r1});
  ValueId r2 = b.op("relu2", "Relu", {add});
  ValueId pool = b.op("pool", "MaxPool", {r2}, {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  ValueId flat = b.op("flat", "Flatten", {pool});
  ValueId mm = b.op("fc", "MatMul", {flat, b.constant("wfc", weights({64, 10}))});
  ValueId bias = b.op("fc_bias", "Add", {mm, b.constant("bfc", weights({10}))});
  return b.done({bias});
}

TEST(X86Quantizer, AnnotatesConvLinearAndTheirFusions) {
  Model m = cnn();
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  // conv1 + relu1: the conv's input and per-channel weight (axis 0), the relu's output.
  const NodeAnnotation& conv1 = a.at(node_index(m, "conv1"));
  EXPECT_EQ(conv1.pattern, "conv_Relu");
  ASSERT_NE(input_spec(conv1, 0), nullptr);
  EXPECT_EQ(input_spec(conv1, 0)->dtype, DType::u8);
  EXPECT_EQ(input_spec(conv1, 0)->observer, ObserverKind::histogram);
  ASSERT_NE(input_spec(conv1, 1), nullptr);
  EXPECT_EQ(input_spec(conv1, 1)->qscheme, QScheme::per_channel_symmetric);
  EXPECT_EQ(input_spec(conv1, 1)->ch_axis, 0);
  EXPECT_EQ(input_spec(conv1, 1)->qmin, -128);
  EXPECT_FALSE(conv1.inputs.count(2));  // the bias stays f32
  EXPECT_FALSE(conv1.output.has_value());  // no Q/DQ between the conv and its relu
  ASSERT_NE(spec(a.at(node_index(m, "relu1")).output), nullptr);
  // conv2 + residual Add + relu2: one pattern; the Add's other input is quantized too.
  EXPECT_EQ(a.at(node_index(m, "conv2")).pattern, "conv_add_relu");
  const NodeAnnotation& residual = a.at(node_index(m, "residual"));
  ASSERT_NE(input_spec(residual, 1), nullptr);
  EXPECT_FALSE(residual.output.has_value());
  EXPECT_NE(spec(a.at(node_index(m, "relu2")).output), nullptr);
  // MaxPool and Flatten follow quantized outputs: they share their input's spec.
  for (const char* name : {"pool", "flat"}) {
    const NodeAnnotation& p = a.at(node_index(m, name));
    ASSERT_TRUE(p.output.has_value()) << name;
    ASSERT_TRUE(std::holds_alternative<SharedSpec>(*p.output)) << name;
    EXPECT_EQ(std::get<SharedSpec>(*p.output).with, (Edge{node_index(m, name), 0}));
  }
  // The linear layer: MatMul by a [K, N] weight is per channel along N (axis 1), its bias Add is
  // part of it and carries the output.
  const NodeAnnotation& fc = a.at(node_index(m, "fc"));
  EXPECT_EQ(fc.pattern, "linear");
  EXPECT_EQ(input_spec(fc, 1)->ch_axis, 1);
  EXPECT_NE(spec(a.at(node_index(m, "fc_bias")).output), nullptr);
  EXPECT_EQ(a.size(), m.graph.nodes.size());
  for (const auto& [n, ann] : a) EXPECT_EQ(ann.quantizer, "x86");
}

// x → linear → GELU written out (erf form) → linear, and → linear → GELU (GPT-2's tanh form):
// each GELU is the activation of the linear layer before it, as Inductor's x86 quantizer
// annotates linear + GELU, so no Q/DQ pair splits them; compiled, the layer becomes one
// QFusedMatMul with a GELU epilogue that runs like the quantized model's reference.
Model linear_gelu() {
  GraphBuilder b;
  ValueId x = b.input("x", {4, 16});
  ValueId h = b.op("fc1_bias", "Add", {b.op("fc1", "MatMul", {x, b.constant("w1", weights({16, 32}))}), b.constant("b1", weights({32}))});
  ValueId e = b.op("e", "Add", {b.op("erf", "Erf", {b.op("div", "Div", {h, b.scalar("sqrt2", 1.4142135f)})}), b.scalar("one", 1)});
  ValueId g1 = b.op("half", "Mul", {b.op("xe", "Mul", {h, e}), b.scalar("half_c", 0.5f)});
  ValueId h2 = b.op("fc2", "MatMul", {g1, b.constant("w2", weights({32, 16}))});
  // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
  ValueId cube = b.op("cube", "Mul", {b.scalar("c", 0.044715f), b.op("pow", "Pow", {h2, b.scalar("three", 3)})});
  ValueId inner = b.op("outer", "Mul", {b.scalar("k", 0.7978845608f), b.op("sum", "Add", {h2, cube})});
  ValueId t = b.op("t1", "Add", {b.op("tanh", "Tanh", {inner}), b.scalar("one_t", 1)});
  ValueId g2 = b.op("half2", "Mul", {b.op("hx", "Mul", {b.scalar("half_t", 0.5f), h2}), t});
  ValueId out = b.op("fc3", "MatMul", {g2, b.constant("w3", weights({16, 8}))});
  return b.done({out});
}

// PT2E's prepare, calibration on `samples` (a run of a session observed for each) and convert
// of `m` by the annotations `a`; convert's counts into `stats` when given.
void calibrate_and_convert(Model& m, const Annotations& a, const std::vector<std::vector<Tensor>>& samples,
                           ConvertStats* stats = nullptr) {
  auto p = prepare(m.graph, a);
  ASSERT_TRUE(p.ok()) << p.error().message();
  {
    auto session = Session::create(m);
    ASSERT_TRUE(session.ok());
    Calibrator calibrator(m.graph, *p);
    (*session)->set_observer(&calibrator);
    for (const auto& in : samples) {
      ASSERT_TRUE(calibrator.observe_inputs(in).ok());
      ASSERT_TRUE((*session)->run(in).ok());
    }
  }
  auto converted = convert(m, *p);
  ASSERT_TRUE(converted.ok()) << converted.error().message();
  if (stats) *stats = *converted;
}

// One input sample per seed: a sine over the elements, amp · sin(step · i + seed), of `shape`.
std::vector<std::vector<Tensor>> sine_samples(const std::vector<int64_t>& shape, float step, float amp,
                                              std::initializer_list<uint32_t> seeds) {
  std::vector<std::vector<Tensor>> samples;
  for (uint32_t seed : seeds) {
    std::vector<float> xv(static_cast<size_t>(shape_numel(shape)));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(step * static_cast<float>(i) + static_cast<float>(seed)) * amp;
    samples.push_back({testing::make<float>(shape, xv)});
  }
  return samples;
}

// calibrate_and_convert on `samples`, the quantized model's reference outputs on the first
// into `want`, then `kiln compile` for one thread of a CPU with int8 products (this one, or the
// avx512-vnni preset where it lacks them).
void quantize_and_compile(Model& m, const Annotations& a, const std::vector<std::vector<Tensor>>& samples, std::vector<Tensor>& want) {
  ASSERT_NO_FATAL_FAILURE(calibrate_and_convert(m, a, samples));
  want = testing::run_reference(m, samples[0]);
  CompileOptions options;
  options.target.cpu = testing::int8_target();
  options.target.threads = 1;
  auto report = compile_model(m, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
}

// The compiled model's outputs on `in`, each within `tol` relative L2 of `want`'s, where this
// CPU runs it (X86Quantizer.WithoutVnniProductsStayFloat runs them elsewhere).
void expect_compiled_runs_like(const Model& m, const std::vector<Tensor>& in, const std::vector<Tensor>& want, double tol) {
  if (!testing::runs_here(m)) return;
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto got = (*s)->run(in);
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(testing::relative_l2((*got)[i], want[i]), tol) << i;
}

TEST(X86Quantizer, LinearTakesTheGeluAfterIt) {
  Model m = linear_gelu();
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  EXPECT_EQ(a.at(node_index(m, "fc1")).pattern, "linear_Gelu");
  EXPECT_EQ(a.at(node_index(m, "fc2")).pattern, "linear_Gelu");
  EXPECT_EQ(a.at(node_index(m, "fc3")).pattern, "linear");
  for (const char* name : {"fc1_bias", "div", "erf", "e", "xe", "pow", "cube", "sum", "outer", "tanh", "t1", "hx"}) {
    ASSERT_TRUE(a.count(node_index(m, name))) << name;
    EXPECT_FALSE(a.at(node_index(m, name)).output.has_value()) << name;  // inside the pattern
  }
  EXPECT_NE(spec(a.at(node_index(m, "half")).output), nullptr);
  EXPECT_NE(spec(a.at(node_index(m, "half2")).output), nullptr);
  // XNNPACK's quantizer fuses no GELU: its linear layers stand alone.
  Annotations x;
  ASSERT_TRUE(make_quantizer("xnnpack")->annotate(m.graph, x).ok());
  EXPECT_EQ(x.at(node_index(m, "fc1")).pattern, "linear");
  EXPECT_FALSE(x.count(node_index(m, "erf")));

  std::vector<float> xv(64);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.41f * static_cast<float>(i)) * 2;
  const std::vector<Tensor> in = {testing::make<float>({4, 16}, xv)};
  std::vector<Tensor> want;
  ASSERT_NO_FATAL_FAILURE(quantize_and_compile(m, a, {in}, want));
  std::vector<std::string> activations;
  for (const Node& n : m.graph.nodes)
    if (n.op == "QFusedMatMul") {
      activations.push_back(n.attr_string("activation", ""));
      // The weight stored in the kernel's panels (prepack_weights), which a session uses as it
      // lies, where the CPU runs kiln's int8 GEMM.
      if (cpu::gemm::lowp_lacks(CpuFeatures::host(), cpu::gemm::Lowp::u8s8)) continue;
      const Tensor& w = m.graph.value(n.inputs[3]).constant;
      ASSERT_TRUE(w.is_packed()) << n.name;
      EXPECT_EQ(w.layout()->packed_for.rfind("kiln gemm_u8s8", 0), 0u) << w.layout()->packed_for;
    }
  EXPECT_EQ(activations, (std::vector<std::string>{"Gelu", "GeluTanh", ""})) << testing::nodes_text(m.graph);
  expect_compiled_runs_like(m, in, want, 1e-3);
}

// x → Conv 1x1 → SiLU written out (x · Sigmoid(x), as EfficientNet's and YOLO's exporters
// write it) → Conv 3x3 → SiLU → Conv 1x1 (whose output a SiLU shares with a graph output: no
// SiLU in its pattern): the x86 quantizer takes each SiLU into its convolution's pattern, so no
// Q/DQ pair splits them and none sits on the f32 Sigmoid and Mul; compiled, each is one
// QFusedConv with a Silu epilogue (kiln's GEMM for the 1x1, oneDNN's swish post-op for the 3x3)
// that runs like the quantized model's reference.
TEST(X86Quantizer, ConvTakesTheSiluAfterIt) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 8, 6, 6});
  auto silu = [&](const std::string& name, ValueId v) { return b.op(name + "_mul", "Mul", {v, b.op(name + "_sig", "Sigmoid", {v})}); };
  ValueId c1 = b.op("conv1", "Conv", {x, b.constant("w1", weights({16, 8, 1, 1})), b.constant("b1", weights({16}))});
  ValueId s1 = silu("silu1", c1);
  ValueId c2 = b.op("conv2", "Conv", {s1, b.constant("w2", weights({16, 16, 3, 3})), b.constant("b2", weights({16}))},
                    {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  ValueId s2 = silu("silu2", c2);
  ValueId c3 = b.op("conv3", "Conv", {s2, b.constant("w3", weights({8, 16, 1, 1}))});
  Model m = b.done({silu("silu3", c3), c3});
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  EXPECT_EQ(a.at(node_index(m, "conv1")).pattern, "conv_Silu");
  EXPECT_EQ(a.at(node_index(m, "conv2")).pattern, "conv_Silu");
  EXPECT_EQ(a.at(node_index(m, "conv3")).pattern, "conv");
  for (const char* name : {"silu1_sig", "silu2_sig"}) {
    ASSERT_TRUE(a.count(node_index(m, name))) << name;
    EXPECT_FALSE(a.at(node_index(m, name)).output.has_value()) << name;  // inside the pattern
  }
  EXPECT_FALSE(a.at(node_index(m, "conv1")).output.has_value());
  EXPECT_NE(spec(a.at(node_index(m, "silu1_mul")).output), nullptr);
  EXPECT_NE(spec(a.at(node_index(m, "silu2_mul")).output), nullptr);
  EXPECT_FALSE(a.count(node_index(m, "silu3_sig")));
  // XNNPACK's quantizer fuses no SiLU.
  Annotations xa;
  ASSERT_TRUE(make_quantizer("xnnpack")->annotate(m.graph, xa).ok());
  EXPECT_EQ(xa.at(node_index(m, "conv1")).pattern, "conv");

  std::vector<float> xv(288);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i)) * 3;
  const std::vector<Tensor> in = {testing::make<float>({1, 8, 6, 6}, xv)};
  std::vector<Tensor> want;
  ASSERT_NO_FATAL_FAILURE(quantize_and_compile(m, a, {in}, want));
  std::vector<std::string> activations;
  for (const Node& n : m.graph.nodes)
    if (n.op == "QFusedConv") activations.push_back(n.attr_string("activation", ""));
  EXPECT_EQ(activations, (std::vector<std::string>{"Silu", "Silu"})) << testing::nodes_text(m.graph);
  expect_compiled_runs_like(m, in, want, 1e-2);
}

// For a CPU without VNNI (AVX2: AMD's before Zen 4, Intel's before Cascade Lake) lower_int8
// makes no QFusedConv or QFusedMatMul: oneDNN's int8 convolutions would saturate there and
// kiln's int8 GEMM is VNNI's. The convolutions and the linear layer stay f32 between their
// Q and DQ, their weights folded to f32, the compile says why, and the model (which runs on
// every CPU kiln runs on) computes what the quantized one's reference does.
TEST(X86Quantizer, WithoutVnniProductsStayFloat) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 8, 6, 6});
  ValueId c1 = b.op("conv1", "Conv", {x, b.constant("w1", weights({16, 8, 3, 3})), b.constant("b1", weights({16}))},
                    {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  ValueId r1 = b.op("relu1", "Relu", {c1});
  ValueId flat = b.op("flat", "Flatten", {b.op("gap", "GlobalAveragePool", {r1})});
  Model m = b.done({b.op("fc", "Gemm", {flat, b.constant("wf", weights({16, 5})), b.constant("bf", weights({5}))})});
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  const std::vector<std::vector<Tensor>> samples = sine_samples({1, 8, 6, 6}, 0.37f, 3, {1u, 2u});
  ASSERT_NO_FATAL_FAILURE(calibrate_and_convert(m, a, samples));
  const std::vector<Tensor> want = testing::run_reference(m, samples[0]);
  CompileOptions options;
  options.target.cpu = *CpuFeatures::named("avx2");
  options.target.threads = 1;
  auto report = compile_model(m, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
  std::string lowering;
  for (const PassRecord& p : report->passes)
    if (p.name == "lower_int8") lowering = p.result.summary;
  EXPECT_NE(lowering.find("; kept 2 convolutions and linear layers f32 (int8 products need avx512-vnni, which the target lacks)"),
            std::string::npos)
      << lowering;
  std::map<std::string, int> ops;
  for (const Node& n : m.graph.nodes) ++ops[n.op];
  EXPECT_EQ(ops["QFusedConv"] + ops["QFusedMatMul"], 0) << testing::nodes_text(m.graph);
  EXPECT_EQ(ops["FusedConv"], 1) << testing::nodes_text(m.graph);
  EXPECT_GE(ops["QuantizeLinear"], 1) << testing::nodes_text(m.graph);
  ASSERT_TRUE(testing::runs_here(m));
  expect_compiled_runs_like(m, samples[0], want, 1e-5);
}

// A squeeze-excite block as EfficientNet's exporter writes it: x → Conv 1x1 → SiLU → (GAP →
// Conv 1x1 → SiLU → Conv 1x1 → Sigmoid) → Mul of the SiLU's output by those channel scales →
// Conv 1x1. Compiled, the squeeze is a QGlobalAveragePool on the codes and the Mul a QMul
// that scales them: no DequantizeLinear of the image-sized tensor and no f32 Mul or
// QuantizeLinear of it stay; the model runs like the quantized one's reference.
TEST(X86Quantizer, SqueezeExciteStaysOnTheCodes) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 8, 10, 10});
  auto silu = [&](const std::string& name, ValueId v) { return b.op(name + "_mul", "Mul", {v, b.op(name + "_sig", "Sigmoid", {v})}); };
  ValueId c1 = silu("silu1", b.op("conv1", "Conv", {x, b.constant("w1", weights({24, 8, 1, 1})), b.constant("b1", weights({24}))}));
  ValueId squeeze = b.op("gap", "GlobalAveragePool", {c1});
  ValueId fc1 = silu("silu2", b.op("fc1", "Conv", {squeeze, b.constant("wf1", weights({6, 24, 1, 1})), b.constant("bf1", weights({6}))}));
  ValueId fc2 = b.op("fc2", "Conv", {fc1, b.constant("wf2", weights({24, 6, 1, 1})), b.constant("bf2", weights({24}))});
  ValueId scaled = b.op("scale", "Mul", {b.op("gate", "Sigmoid", {fc2}), c1});
  Model m = b.done({b.op("conv3", "Conv", {scaled, b.constant("w3", weights({8, 24, 1, 1}))})});
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  const std::vector<std::vector<Tensor>> samples = sine_samples({1, 8, 10, 10}, 0.29f, 3, {3u, 4u, 5u});
  std::vector<Tensor> want;
  ASSERT_NO_FATAL_FAILURE(quantize_and_compile(m, a, samples, want));
  std::map<std::string, int> ops;
  for (const Node& n : m.graph.nodes) ++ops[n.op];
  EXPECT_EQ(ops["QGlobalAveragePool"], 1) << testing::nodes_text(m.graph);
  EXPECT_EQ(ops["QMul"], 1) << testing::nodes_text(m.graph);
  EXPECT_EQ(ops["Mul"], 0) << testing::nodes_text(m.graph);
  // The codes conv1 writes are read by the pool and the QMul alone, never dequantized.
  const Node* mul = nullptr;
  for (const Node& n : m.graph.nodes)
    if (n.op == "QMul") mul = &n;
  ASSERT_NE(mul, nullptr);
  const ValueId codes = mul->inputs[0];
  for (const Node& n : m.graph.nodes) {
    const bool reads = std::find(n.inputs.begin(), n.inputs.end(), codes) != n.inputs.end();
    if (n.outputs[0] == codes) {
      EXPECT_EQ(n.name, "conv1");
    }
    if (reads) {
      EXPECT_TRUE(n.op == "QMul" || n.op == "QGlobalAveragePool") << n.name << "\n" << testing::nodes_text(m.graph);
    }
  }
  expect_compiled_runs_like(m, samples[0], want, 1e-2);
}

// A YOLOv8 C2f block and the neck's upsampling, as the exporter writes them: Conv 1x1 + SiLU →
// Split in halves → a bottleneck on the second (two Conv 3x3 + SiLU, then the shortcut Add of
// that half) → Concat of both halves and the bottleneck's sum → Conv 1x1 + SiLU → Resize
// (nearest, 2x) → Conv 1x1. The x86 quantizer shares one observer among the Split's input and
// pieces (later outputs annotated too), the Concat's inputs and output and the Resize's, and
// takes the shortcut Add into the second conv's pattern (conv_Silu_add); compiled, the Split,
// Concat and Resize move u8 codes and no QuantizeLinear or DequantizeLinear is left inside the
// model, which runs like the quantized one's reference.
TEST(X86Quantizer, YoloBlockStaysOnTheCodes) {
  GraphBuilder b;
  const ValueId x = b.input("x", {1, 8, 8, 8});
  auto silu = [&](const std::string& name, ValueId v) { return b.op(name + "_mul", "Mul", {v, b.op(name + "_sig", "Sigmoid", {v})}); };
  auto conv = [&](const std::string& name, ValueId v, int64_t cin, int64_t cout, int64_t k) {
    const int64_t p = k / 2;
    return silu(name, b.op(name, "Conv", {v, b.constant(name + "_w", weights({cout, cin, k, k})), b.constant(name + "_b", weights({cout}))},
                           {{"pads", std::vector<int64_t>{p, p, p, p}}}));
  };
  const ValueId cv1 = conv("cv1", x, 8, 16, 1);
  Node split = testing::node("split", "Split", {cv1, b.constant("halves", testing::make<int64_t>({2}, {8, 8}))}, {});
  const ValueId h0 = b.g.add_value("h0", DType::undefined), h1 = b.g.add_value("h1", DType::undefined);
  split.outputs = {h0, h1};
  split.set_attr("axis", int64_t{1});
  b.g.nodes.push_back(split);
  const ValueId m2 = conv("m_cv2", conv("m_cv1", h1, 8, 8, 3), 8, 8, 3);
  const ValueId shortcut = b.op("shortcut", "Add", {h1, m2});
  const ValueId joined = b.op("join", "Concat", {h0, h1, shortcut}, {{"axis", int64_t{1}}});
  const ValueId cv2 = conv("cv2", joined, 24, 16, 1);
  const ValueId up = b.op("up", "Resize", {cv2, kNoValue, b.constant("scales", testing::make<float>({4}, {1, 1, 2, 2}))},
                          {{"mode", std::string("nearest")}, {"coordinate_transformation_mode", std::string("asymmetric")},
                           {"nearest_mode", std::string("floor")}});
  Model m = b.done({b.op("head", "Conv", {up, b.constant("head_w", weights({4, 16, 1, 1}))})});
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  const size_t si = node_index(m, "split");
  EXPECT_EQ(a.at(si).pattern, "shared: Split");
  ASSERT_TRUE(a.at(si).later_outputs.count(1));
  EXPECT_EQ(a.at(node_index(m, "m_cv2")).pattern, "conv_Silu_add");
  EXPECT_EQ(a.at(node_index(m, "join")).pattern, "shared: Concat");
  EXPECT_EQ(a.at(node_index(m, "up")).pattern, "shared: Resize");
  auto p = prepare(m.graph, a);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->group_of.at(Edge::output(si, 1)), p->group_of.at(Edge{si, 0}));  // the pieces share the input's observer

  const std::vector<std::vector<Tensor>> samples = sine_samples({1, 8, 8, 8}, 0.23f, 2, {8u, 9u, 10u});
  std::vector<Tensor> want;
  ASSERT_NO_FATAL_FAILURE(quantize_and_compile(m, a, samples, want));
  std::map<std::string, int> ops;
  for (const Node& n : m.graph.nodes) {
    ++ops[n.op];
    if (n.op == "Split" || n.op == "Concat" || n.op == "Resize")
      for (ValueId o : n.outputs)  // (fold_split_concat drops the piece the Concat took back)
        if (o != kNoValue) {
          EXPECT_EQ(m.graph.value(o).dtype, DType::u8) << n.name << "\n" << testing::nodes_text(m.graph);
        }
  }
  EXPECT_EQ(ops["QuantizeLinear"], 1) << testing::nodes_text(m.graph);    // x's
  EXPECT_EQ(ops["DequantizeLinear"], 1) << testing::nodes_text(m.graph);  // the head's input (its output stays f32)
  EXPECT_EQ(ops["QFusedConv"], 4) << testing::nodes_text(m.graph);
  expect_compiled_runs_like(m, samples[0], want, 1e-2);
}

// GPT-2's layers multiply 2-D rows between Reshapes (Reshape -> Gemm -> Reshape back): the x86
// quantizer takes the Reshape into the linear layer's GELU and residual-Add patterns, and the
// compiled model (drop_linear_reshapes, then lower_int8) runs the block on int8 nodes alone, as
// a BERT layer's: the GELU in the up-projection, the residual in the down-projection, and the
// down-projection reading the up-projection's codes (the Q/DQ pair the quantizer put on each
// side of the Reshape between them is dropped: the same scale).
TEST(X86Quantizer, LinearLayersBetweenReshapesKeepTheirPatterns) {
  GraphBuilder b;
  const ValueId x = b.input("x", {1, 8, 16});
  auto rows = [&](const std::string& name, ValueId v, int64_t k) {
    return b.op(name, "Reshape", {v, b.constant(name + "_shape", testing::make<int64_t>({2}, {-1, k}))});
  };
  auto back = [&](const std::string& name, ValueId v, int64_t n) {
    return b.op(name, "Reshape", {v, b.constant(name + "_shape", testing::make<int64_t>({3}, {1, 8, n}))});
  };
  const ValueId up = back("up_back", b.op("up", "Gemm", {rows("up_rows", x, 16), b.constant("w1", weights({16, 32})), b.constant("b1", weights({32}))}), 32);
  // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as GPT-2's exporter writes it
  const ValueId cube = b.op("cube", "Mul", {b.scalar("c", 0.044715f), b.op("pow", "Pow", {up, b.scalar("three", 3)})});
  const ValueId inner = b.op("outer", "Mul", {b.scalar("k", 0.7978845608f), b.op("sum", "Add", {up, cube})});
  const ValueId t = b.op("t1", "Add", {b.op("tanh", "Tanh", {inner}), b.scalar("one_t", 1)});
  const ValueId gelu = b.op("half2", "Mul", {b.op("hx", "Mul", {b.scalar("half_t", 0.5f), up}), t});
  const ValueId down = back("down_back", b.op("down", "Gemm", {rows("down_rows", gelu, 32), b.constant("w2", weights({32, 16})), b.constant("b2", weights({16}))}), 16);
  Model m = b.done({b.op("residual", "Add", {x, down})});

  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  EXPECT_EQ(a.at(node_index(m, "up")).pattern, "linear_Gelu");
  EXPECT_EQ(a.at(node_index(m, "down")).pattern, "linear_add");
  for (const char* name : {"up_back", "down_back"}) {
    ASSERT_TRUE(a.count(node_index(m, name))) << name;
    EXPECT_FALSE(a.at(node_index(m, name)).output.has_value()) << name << ": inside the pattern";
  }
  const std::vector<std::vector<Tensor>> samples = sine_samples({1, 8, 16}, 0.37f, 2, {5u, 6u, 7u});
  std::vector<Tensor> want;
  ASSERT_NO_FATAL_FAILURE(quantize_and_compile(m, a, samples, want));
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op);
  // x quantized for the up-projection and, as the residual, for the down-projection's epilogue.
  EXPECT_EQ(ops, (std::vector<std::string>{"QuantizeLinear", "QFusedMatMul", "QuantizeLinear", "QFusedMatMul"}))
      << testing::nodes_text(m.graph);
  EXPECT_EQ(m.graph.nodes[1].attr_string("activation", ""), "GeluTanh");
  EXPECT_EQ(m.graph.value(m.graph.nodes[1].outputs[0]).dtype, DType::u8);
  EXPECT_EQ(m.graph.nodes[3].inputs[0], m.graph.nodes[1].outputs[0]) << "the codes, not requantized";
  expect_compiled_runs_like(m, samples[0], want, 1e-2);
}

// A weight computed from constants is folded before annotation, so that the quantizers see it:
// GPT-2's tied LM head multiplies by Transpose(wte), wte also being the embedding Gather's
// table. A node of such a chain that something else reads stays.
TEST(X86Quantizer, ComputedWeightsAreFoldedForTheQuantizers) {
  GraphBuilder b;
  ValueId ids = b.input("ids", {1, 4}, DType::i64);
  ValueId wte = b.constant("wte", weights({12, 8}));
  ValueId emb = b.op("embed", "Gather", {wte, ids});
  ValueId logits = b.op("lm_head", "MatMul", {emb, b.op("wte_t", "Transpose", {wte})});
  ValueId scaled = b.op("scale", "Mul", {b.constant("w2", weights({8, 8})), b.constant("two", testing::make<float>({}, {2}))});
  ValueId fc2 = b.op("fc2", "MatMul", {emb, scaled});
  ValueId seen = b.op("seen", "Relu", {scaled});  // the folded weight read elsewhere too
  ValueId neg = b.op("neg", "Neg", {b.constant("w3", weights({8, 8}))});
  ValueId fc3 = b.op("fc3", "MatMul", {emb, b.op("neg_t", "Transpose", {neg})});
  ValueId kept = b.op("kept", "Relu", {neg});  // the chain's first node, read by another
  Model m = b.done({logits, fc2, seen, fc3, kept});
  const std::vector<Tensor> in = {testing::make<int64_t>({1, 4}, {3, 0, 11, 7})};
  const std::vector<Tensor> want = testing::run_reference(m, in);

  Annotations before;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, before).ok());
  EXPECT_FALSE(before.count(node_index(m, "lm_head")));
  auto folded = fold_computed_weights(m.graph);
  ASSERT_TRUE(folded.ok()) << folded.error().message();
  EXPECT_EQ(*folded, 3u);
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.name);
  EXPECT_EQ(ops, (std::vector<std::string>{"embed", "lm_head", "fc2", "seen", "neg", "fc3", "kept"}));
  ASSERT_TRUE(verify_graph(m.graph).ok());
  const std::vector<Tensor> got = testing::run_reference(m, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(testing::relative_l2(got[k], want[k]), 0.0) << k;
  Annotations after;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, after).ok());
  for (const char* name : {"lm_head", "fc2", "fc3"}) {
    ASSERT_TRUE(after.count(node_index(m, name))) << name;
    EXPECT_EQ(after.at(node_index(m, name)).pattern, "linear") << name;
  }
  auto again = fold_computed_weights(m.graph);  // nothing left to fold
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
}

// A compiled int8 model loaded from its file: the session runs its linear layer's weight from
// memory that asks for huge pages rather than from the mapped file (unless the machine gave them
// slowly), with the outputs of the model it was saved from.
TEST(X86Quantizer, LoadedInt8WeightsRunFromHugePages) {
  if (auto why = cpu::gemm::lowp_lacks(CpuFeatures::host(), cpu::gemm::Lowp::u8s8)) GTEST_SKIP() << *why;
  std::string mode;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), mode);
  if (!huge_pages_enabled(mode)) GTEST_SKIP() << "transparent huge pages are off: '" << mode << "'";
  GraphBuilder b;
  ValueId x = b.input("x", {4, 1536});
  Model m = b.done({b.op("fc", "MatMul", {x, b.constant("w", weights({1536, 1536}))})});  // 2.25 MiB in int8
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  std::vector<float> xv(4 * 1536);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i));
  const std::vector<Tensor> in = {testing::make<float>({4, 1536}, xv)};
  ASSERT_NO_FATAL_FAILURE(calibrate_and_convert(m, a, {in}));
  CompileOptions options;
  options.target.threads = 1;
  ASSERT_TRUE(compile_model(m, options).ok());
  const auto path = std::filesystem::temp_directory_path() / ("kiln-huge-" + std::to_string(::getpid()) + ".kiln");
  ASSERT_TRUE(save_model(m, path.string()).ok());
  auto loaded = load_model(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  auto from_file = Session::create(*loaded), in_memory = Session::create(m);
  ASSERT_TRUE(from_file.ok() && in_memory.ok());
  bool moved = false;
  for (size_t v = 0; v < loaded->graph.values.size(); ++v) {
    const Tensor& w = loaded->graph.values[v].constant;
    if (w.is_packed() && w.dtype() == DType::i8) moved = (*from_file)->graph().values[v].constant.raw() != w.raw();
  }
  // Where the machine gave the pages slowly (weights_on_huge_pages stops then), the weight stays
  // in the file: the session says which.
  EXPECT_EQ((*from_file)->huge_page_eligible_bytes(), 1536u * 1536);
  EXPECT_EQ(moved, (*from_file)->huge_page_weight_bytes() == 1536u * 1536) << testing::nodes_text(loaded->graph);
  EXPECT_EQ((*in_memory)->huge_page_eligible_bytes(), 0u);  // nothing in a mapped file
  auto got = (*from_file)->run(in), want = (*in_memory)->run(in);
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ((*got)[0].nbytes(), (*want)[0].nbytes());
  EXPECT_EQ(std::memcmp((*got)[0].raw(), (*want)[0].raw(), (*want)[0].nbytes()), 0);
}

TEST(X86Quantizer, PoolingAfterFloatStaysFloat) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 2, 4, 4});
  ValueId p = b.op("pool", "MaxPool", {x}, {{"kernel_shape", std::vector<int64_t>{2, 2}}});
  Model m = b.done({p});
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  EXPECT_TRUE(a.empty());  // its input comes from no quantized pattern
}

TEST(XnnpackQuantizer, SymmetricWeightsAddMulAndPropagation) {
  Model m = cnn();
  Annotations a;
  ASSERT_TRUE(make_quantizer("xnnpack", /*per_channel=*/false)->annotate(m.graph, a).ok());
  const NodeAnnotation& conv1 = a.at(node_index(m, "conv1"));
  EXPECT_EQ(conv1.pattern, "conv_Relu");
  EXPECT_EQ(input_spec(conv1, 0)->dtype, DType::i8);
  EXPECT_EQ(input_spec(conv1, 0)->qmin, -128);
  EXPECT_EQ(input_spec(conv1, 1)->qmin, -127);  // restricted symmetric
  EXPECT_EQ(input_spec(conv1, 1)->qscheme, QScheme::per_tensor_symmetric);
  // No conv + add fusion in xnnpack: conv2 alone, then add_relu on its own.
  EXPECT_EQ(a.at(node_index(m, "conv2")).pattern, "conv");
  EXPECT_NE(spec(a.at(node_index(m, "conv2")).output), nullptr);
  const NodeAnnotation& add = a.at(node_index(m, "residual"));
  EXPECT_EQ(add.pattern, "add_relu");
  EXPECT_NE(input_spec(add, 0), nullptr);
  EXPECT_NE(input_spec(add, 1), nullptr);
  EXPECT_NE(spec(a.at(node_index(m, "relu2")).output), nullptr);
  EXPECT_TRUE(std::holds_alternative<SharedSpec>(*a.at(node_index(m, "pool")).output));
  Annotations per_channel;
  ASSERT_TRUE(make_quantizer("xnnpack", true)->annotate(m.graph, per_channel).ok());
  EXPECT_EQ(input_spec(per_channel.at(node_index(m, "fc")), 1)->qscheme, QScheme::per_channel_symmetric);
}

TEST(XnnpackQuantizer, ConcatSharesInputZero) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 2});
  ValueId y = b.input("y", {1, 3});
  ValueId c = b.op("cat", "Concat", {x, y}, {{"axis", int64_t{1}}});
  Model m = b.done({c});
  Annotations a;
  ASSERT_TRUE(make_quantizer("xnnpack")->annotate(m.graph, a).ok());
  const NodeAnnotation& cat = a.at(0);
  EXPECT_NE(input_spec(cat, 0), nullptr);
  ASSERT_TRUE(std::holds_alternative<SharedSpec>(cat.inputs.at(1)));
  EXPECT_EQ(std::get<SharedSpec>(cat.inputs.at(1)).with, (Edge{0, 0}));
  EXPECT_EQ(std::get<SharedSpec>(*cat.output).with, (Edge{0, 0}));
}

TEST(ComposableQuantizer, TheFirstAnnotationWins) {
  Model m = cnn();
  std::vector<std::unique_ptr<Quantizer>> parts;
  parts.push_back(make_quantizer("xnnpack"));
  parts.push_back(make_quantizer("x86"));
  ComposableQuantizer both(std::move(parts));
  EXPECT_EQ(both.name(), "xnnpack+x86");
  Annotations a;
  ASSERT_TRUE(both.annotate(m.graph, a).ok());
  for (const auto& [n, ann] : a) EXPECT_EQ(ann.quantizer, "xnnpack") << m.graph.nodes[n].name;
  EXPECT_EQ(make_quantizer("tflite"), nullptr);
  for (const QuantConfig& c : {x86_config(), xnnpack_config(true), xnnpack_config(false)}) {
    EXPECT_TRUE(validate(c.activation, "activation").ok());
    EXPECT_TRUE(validate(c.weight, "weight").ok());
  }
}

// prepare groups the x86 annotations of the CNN as PT2E's implicit and explicit sharing do:
// one observer for relu1's output, which conv2 and the residual Add read; one for relu2's
// output, the pool, Flatten and the linear layer's input; the weights observed at once.
TEST(Prepare, GroupsSharedEdgesAndObservesWeights) {
  Model m = cnn();
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  auto p = prepare(m.graph, a);
  ASSERT_TRUE(p.ok()) << p.error().message();
  const size_t conv1 = node_index(m, "conv1"), relu1 = node_index(m, "relu1"), conv2 = node_index(m, "conv2"),
               residual = node_index(m, "residual"), relu2 = node_index(m, "relu2"), pool = node_index(m, "pool"),
               flat = node_index(m, "flat"), fc = node_index(m, "fc"), fc_bias = node_index(m, "fc_bias");
  auto group = [&](size_t node, int input) { return p->group_of.at(Edge{node, input}); };
  EXPECT_EQ(group(relu1, Edge::kOutput), group(conv2, 0));
  EXPECT_EQ(group(relu1, Edge::kOutput), group(residual, 1));
  for (auto [node, input] : std::vector<std::pair<size_t, int>>{
           {pool, 0}, {pool, Edge::kOutput}, {flat, 0}, {flat, Edge::kOutput}, {fc, 0}})
    EXPECT_EQ(group(relu2, Edge::kOutput), group(node, input)) << m.graph.nodes[node].name << " " << input;
  EXPECT_NE(group(conv1, 0), group(relu1, Edge::kOutput));
  EXPECT_NE(group(relu1, Edge::kOutput), group(relu2, Edge::kOutput));
  // x, relu1's, relu2's and the bias Add's outputs, three weights: 7 groups.
  EXPECT_EQ(p->groups.size(), 7u);
  // The weights are constants: observed now, per channel along the output channels.
  const ObserverGroup& w1 = p->groups[group(conv1, 1)];
  ASSERT_NE(w1.observer, nullptr);
  EXPECT_EQ(w1.observer->qparams().scale.size(), 4u);
  EXPECT_EQ(p->groups[group(fc, 1)].observer->qparams().scale.size(), 10u);
  EXPECT_FALSE(p->watch.count(m.graph.nodes[conv1].inputs[1]));
  // Calibration observes the watched values of each run: the input, the activations.
  auto session = Session::create(m);
  ASSERT_TRUE(session.ok()) << session.error().message();
  Calibrator calibrator(m.graph, *p);
  (*session)->set_observer(&calibrator);
  for (float scale : {1.0f, 3.0f}) {
    std::vector<float> v(3 * 64);
    for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (static_cast<float>(i % 17) / 8.0f - 1.0f);
    std::vector<Tensor> inputs = {testing::make<float>({1, 3, 8, 8}, v)};
    ASSERT_TRUE(calibrator.observe_inputs(inputs).ok());
    ASSERT_TRUE((*session)->run(inputs).ok());
  }
  ASSERT_TRUE(calibrator.status().ok());
  const Observer& input_obs = *p->groups[group(conv1, 0)].observer;
  ASSERT_EQ(input_obs.min_vals().size(), 1u);
  EXPECT_LT(input_obs.min_vals()[0], -2.0f);  // the second, wider run is in
  const QParams relu = p->groups[group(relu1, Edge::kOutput)].observer->qparams();
  EXPECT_EQ(relu.zero_point[0], 0);  // a Relu's output is ≥ 0: u8 affine puts zero at 0
  EXPECT_GT(relu.scale[0], 1.0f / 4096);
  const QParams out = p->groups[group(fc_bias, Edge::kOutput)].observer->qparams();
  EXPECT_GT(out.scale[0], 1.0f / 4096);
}

double sqnr_db(const Tensor& ref, const Tensor& got) {
  double signal = 0, noise = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data<float>()[i], d = r - got.data<float>()[i];
    signal += r * r;
    noise += d * d;
  }
  return 10 * std::log10(signal / std::max(noise, 1e-30));
}

// annotate → prepare → calibrate → convert on the CNN: explicit Q/DQ, weights stored as i8, and
// the quantized model's output within 8-bit noise of the float one.
TEST(Convert, QdqModelRunsCloseToFloat) {
  Model m = cnn();
  std::vector<std::vector<Tensor>> samples;
  for (unsigned seed = 1; seed <= 8; ++seed) {
    std::vector<float> v(3 * 64);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i * seed)) * 1.5f;
    samples.push_back({testing::make<float>({1, 3, 8, 8}, v)});
  }
  const std::vector<Tensor> reference = testing::run_reference(m, samples[7]);
  Annotations a;
  ASSERT_TRUE(make_quantizer("x86")->annotate(m.graph, a).ok());
  const size_t nodes_before = m.graph.nodes.size();
  ConvertStats converted;
  ASSERT_NO_FATAL_FAILURE(calibrate_and_convert(m, a, samples, &converted));
  EXPECT_EQ(m.stage, Stage::quantized);
  EXPECT_EQ(converted.quantized_weights, 3u);
  EXPECT_EQ(m.graph.nodes.size(), nodes_before + converted.quantize_nodes + converted.dequantize_nodes);
  Status v = verify_model(m);
  ASSERT_TRUE(v.ok()) << v.error().message();
  // Every Conv / MatMul reads its input and weight through a DequantizeLinear; the weights are i8.
  std::map<ValueId, const Node*> producer;
  for (const Node& n : m.graph.nodes)
    for (ValueId o : n.outputs) producer[o] = &n;
  for (const Node& n : m.graph.nodes) {
    if (n.op != "Conv" && n.op != "MatMul") continue;
    for (size_t slot : {size_t{0}, size_t{1}}) {
      const Node* dq = producer[n.inputs[slot]];
      ASSERT_NE(dq, nullptr) << n.name;
      EXPECT_EQ(dq->op, "DequantizeLinear") << n.name << " input " << slot;
      if (slot == 1) {
        EXPECT_EQ(m.graph.value(dq->inputs[0]).constant.dtype(), DType::i8);
        if (n.op == "Conv") EXPECT_EQ(dq->attr_int("axis", -1), 0);
        else EXPECT_EQ(dq->attr_int("axis", -1), 1);
      } else {
        EXPECT_EQ(m.graph.value(dq->inputs[0]).dtype, DType::u8);
      }
    }
  }
  const std::vector<Tensor> quantized = testing::run_reference(m, samples[7]);
  ASSERT_EQ(quantized.size(), 1u);
  const double db = sqnr_db(reference[0], quantized[0]);
  EXPECT_GT(db, 25.0) << db;
  RecordProperty("sqnr_db", std::to_string(db));
  EXPECT_LT(db, 80.0);  // it did quantize
}

// Weight-only: only the linear layers' weights, stored as u4 in blocks of 32 along K (the last
// block short: K = 100) or as i8 per output channel; the DQ says how; without any calibration
// the model's error is what the same quantization computed independently gives.
TEST(WeightOnly, BlockedInt4AndPerChannelInt8Weights) {
  GraphBuilder b;
  ValueId x = b.input("x", {2, 100});
  std::vector<float> wv(100 * 24);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = std::sin(0.7f * static_cast<float>(i)) * (1 + static_cast<float>(i % 100) / 50);
  ValueId mm = b.op("fc1", "MatMul", {x, b.constant("w1", testing::make<float>({100, 24}, wv))});
  ValueId g = b.op("fc2", "Gemm", {mm, b.constant("w2", weights({5, 24}))}, {{"transB", int64_t{1}}});
  Model m = b.done({g});
  std::vector<float> xv(200);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::cos(0.3f * static_cast<float>(i));
  const std::vector<Tensor> in = {testing::make<float>({2, 100}, xv)};
  const std::vector<Tensor> reference = testing::run_reference(m, in);
  for (int bits : {4, 8}) {
    SCOPED_TRACE("int" + std::to_string(bits));
    Model q = m;
    Annotations a;
    ASSERT_TRUE(make_weight_only_quantizer(bits, bits == 4 ? 32 : 0)->annotate(q.graph, a).ok());
    ASSERT_EQ(a.size(), 2u);
    for (const auto& [n, ann] : a) {
      EXPECT_FALSE(ann.output.has_value());
      EXPECT_EQ(ann.inputs.count(0), 0u);  // activations stay float
      const QuantSpec* w = input_spec(ann, 1);
      ASSERT_NE(w, nullptr);
      EXPECT_EQ(w->dtype, bits == 4 ? DType::u4 : DType::i8);
      EXPECT_EQ(w->block_size, bits == 4 ? 32 : 0);
    }
    auto p = prepare(q.graph, a);
    ASSERT_TRUE(p.ok()) << p.error().message();
    EXPECT_TRUE(p->watch.empty());  // nothing to calibrate
    auto stats = convert(q, *p);
    ASSERT_TRUE(stats.ok()) << stats.error().message();
    EXPECT_EQ(stats->quantized_weights, 2u);
    EXPECT_EQ(stats->quantize_nodes, 0u);
    Status v = verify_model(q);
    ASSERT_TRUE(v.ok()) << v.error().message();
    for (const Node& n : q.graph.nodes) {
      if (n.op != "DequantizeLinear") continue;
      const Tensor& codes = q.graph.value(n.inputs[0]).constant;
      const Tensor& scale = q.graph.value(n.inputs[1]).constant;
      EXPECT_EQ(codes.dtype(), bits == 4 ? DType::u4 : DType::i8);
      const bool gemm = codes.shape() == std::vector<int64_t>{5, 24};
      if (bits == 4) {  // blocks along K: axis 0 of [K, N], axis 1 of Gemm's [N, K]
        EXPECT_EQ(n.attr_int("block_size", 0), 32);
        EXPECT_EQ(n.attr_int("axis", -1), gemm ? 1 : 0);
        EXPECT_EQ(scale.shape(), gemm ? std::vector<int64_t>({5, 1}) : std::vector<int64_t>({4, 24}));
        EXPECT_EQ(codes.nbytes(), static_cast<size_t>(codes.numel() + 1) / 2);
      } else {
        EXPECT_FALSE(n.has_attr("block_size"));
        EXPECT_EQ(n.attr_int("axis", -1), gemm ? 0 : 1);
        EXPECT_EQ(scale.shape(), std::vector<int64_t>({gemm ? 5 : 24}));
      }
    }
    // The same quantization in numpy (PT2E's formulas: u4 affine per block with the range
    // widened to 0, i8 symmetric with scale max|w| / 127.5) gives these SQNRs on this data,
    // whose sinusoidal weights are as hard on 4 bits as uniform noise.
    const std::vector<Tensor> out = testing::run_reference(q, in);
    const double db = sqnr_db(reference[0], out[0]);
    EXPECT_NEAR(db, bits == 4 ? 7.996 : 33.687, 0.01) << db;
  }
}

// The per-channel observer in blocks: one range per block along ch_axis and index of the others.
TEST(WeightOnly, BlockedObserverRanges) {
  QuantSpec s = weight_only_spec(4, 2);
  s.ch_axis = 0;
  auto obs = make_observer(s);
  // [K = 5, N = 2]: blocks of rows {0, 1}, {2, 3}, {4}, per column.
  ASSERT_TRUE(obs->observe(testing::make<float>({5, 2}, {1, -1, 3, -2, -4, 5, 2, 0, 7, -9})).ok());
  EXPECT_EQ(obs->min_vals(), (std::vector<float>{1, -2, -4, 0, 7, -9}));
  EXPECT_EQ(obs->max_vals(), (std::vector<float>{3, -1, 2, 5, 7, -9}));
  const QParams q = obs->qparams();
  EXPECT_EQ(q.block_size, 2);
  ASSERT_EQ(q.scale.size(), 6u);
  // u4 affine, the range widened to hold 0: block (rows 2-3, column 0) is [-4, 2] → scale 6/15.
  EXPECT_FLOAT_EQ(q.scale[2], 6.0f / 15);
  EXPECT_EQ(q.zero_point[2], 10);
}

TEST(Prepare, ASharedSpecNamingNoAnnotationIsAQuantizersBug) {
  Model m = cnn();
  Annotations a;
  NodeAnnotation bad;
  bad.inputs[0] = SharedSpec{Edge{0, 0}};
  a[node_index(m, "pool")] = bad;
  auto p = prepare(m.graph, a);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().kind, ErrorKind::internal);
  EXPECT_NE(p.error().message().find("has no annotation"), std::string::npos) << p.error().message();
}

// --config: a node's name wins over its op type, which wins over the global setting; null is
// float; without "global" the command line's setting applies.
TEST(QuantConfig, PrecedenceAndFloat) {
  auto c = quant::parse_quantizer_config(
      R"({"global": {"quantizer": "xnnpack"}, "op_types": {"Conv": {"quantizer": "x86"}, "Gemm": null},
          "nodes": {"special": {"quantizer": "xnnpack", "per_tensor": true}, "skip": null}})",
      "q.json");
  ASSERT_TRUE(c.ok()) << c.error().message();
  Node conv, special, skip, gemm, other;
  conv.name = "c", conv.op = "Conv";
  special.name = "special", special.op = "Conv";
  skip.name = "skip", skip.op = "Relu";
  gemm.name = "g", gemm.op = "Gemm";
  other.name = "o", other.op = "Relu";
  const quant::MaybeSetting cli = quant::QuantizerSetting{"x86", false};
  EXPECT_EQ(c->setting_for(conv, cli), (quant::QuantizerSetting{"x86", false}));
  EXPECT_EQ(c->setting_for(special, cli), (quant::QuantizerSetting{"xnnpack", true}));
  EXPECT_FALSE(c->setting_for(skip, cli));
  EXPECT_FALSE(c->setting_for(gemm, cli));
  EXPECT_EQ(c->setting_for(other, cli), (quant::QuantizerSetting{"xnnpack", false}));
  auto no_global = quant::parse_quantizer_config(R"({"nodes": {"skip": null}})", "q.json");
  ASSERT_TRUE(no_global.ok());
  EXPECT_EQ(no_global->setting_for(other, cli), cli);
  EXPECT_FALSE(no_global->setting_for(skip, cli));
  for (const char* bad : {"[]", "{\"global\": 3}", "{\"nodes\": {\"x\": {}}}", "{\"op_types\": {\"Conv\": {\"quantizer\": \"x86\", \"bits\": 4}}}"}) {
    auto r = quant::parse_quantizer_config(bad, "q.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().kind, ErrorKind::user);
  }
}

// --report's SQNR: 10·log10(signal / noise) summed over every sample added, +inf when exact.
TEST(QuantReport, SqnrSumsOverSamples) {
  quant::Sqnr s;
  const float f1[] = {3, 4}, q1[] = {3, 4};
  s.add(f1, q1, 2);
  EXPECT_TRUE(std::isinf(s.db()) && s.db() > 0);
  const float f2[] = {0, 0}, q2[] = {0.5f, 0.5f};  // Σf² = 25, Σ(q − f)² = 0.5
  s.add(f2, q2, 2);
  EXPECT_NEAR(s.db(), 10 * std::log10(25 / 0.5), 1e-9);
  EXPECT_EQ(s.elements, 4);
  quant::Sqnr silent;
  silent.add(f2, q2, 2);
  EXPECT_TRUE(std::isinf(silent.db()) && silent.db() < 0);
}

}  // namespace
}  // namespace kiln::quant
