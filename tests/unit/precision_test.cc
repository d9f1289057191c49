// `kiln compile --precision bf16|fp16`: the lower_precision pass (which nodes it lowers, what
// it keeps f32, the ISA it asks of the target), the bf16 / f16 weights' reference semantics, and
// the fast kernels that run them (kiln.gemm_bf16_avx512, oneDNN's bf16 convolution, the f32
// kernels on widened f16 weights) against those references, compiled, saved and loaded.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <limits>
#include <map>

#include "compile/pass.h"
#include "compile/pipeline.h"
#include "formats/serialize.h"
#include "profile/profiler.h"
#include "runtime/cpu/rows.h"
#include "runtime/ref/nn_util.h"
#include "runtime/session.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::relative_l2;
using testing::run_reference;

// Values in [-1, 1).
Tensor random_f32(std::vector<int64_t> shape, uint32_t seed) { return testing::noise(std::move(shape), seed, 2.f); }

// An f32 tensor's values rounded to bf16 (to nearest even).
Tensor bf16_of(const Tensor& t) {
  Tensor r(DType::bf16, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.data<bfloat16>()[i] = bfloat16(t.data<float>()[i]);
  return r;
}

// A 3x3 conv of 5 channels, a 3x3 stride-2 conv of 16 and a channels-last pointwise
// FusedConv with a SiLU epilogue (kiln's GEMM's, not deferred to oneDNN), each read by a Relu
// that is a graph output, and two linear layers, the last of which writes a graph output. Odd
// sizes: every kernel's tails.
Model mixed_model() {
  testing::GraphBuilder b;
  ValueId x = b.input("x", {1, 5, 9, 9});
  ValueId c = b.op("conv", "Conv", {x, b.constant("w", random_f32({16, 5, 3, 3}, 1)), b.constant("wb", random_f32({16}, 2))},
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId r = b.op("relu", "Relu", {c});
  ValueId x2 = b.input("x2", {1, 16, 6, 7});
  ValueId c2 = b.op("conv2", "Conv", {x2, b.constant("w2", random_f32({48, 16, 3, 3}, 10)), b.constant("w2b", random_f32({48}, 11))},
                    {attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("strides", std::vector<int64_t>{2, 2})});
  ValueId r2 = b.op("relu2", "Relu", {c2});
  ValueId xl = b.input("xl", {1, 7, 5, 24});
  ValueId p = b.op("pw", "FusedConv", {xl, b.constant("pw_w", random_f32({40, 24, 1, 1}, 3)), b.constant("pw_b", random_f32({40}, 4))},
                   {attr("channels_last", int64_t{1}), attr("activation", std::string("Silu"))});
  ValueId pr = b.op("pw_relu", "Relu", {p});
  ValueId a = b.input("a", {37, 64});
  ValueId h = b.op("mm1", "MatMul", {a, b.constant("b1", random_f32({64, 100}, 5))});
  ValueId h2 = b.op("act", "Relu", {h});
  ValueId out = b.op("mm2", "MatMul", {h2, b.constant("b2", random_f32({100, 8}, 6))});
  return b.done({r, r2, pr, out});
}

std::vector<Tensor> mixed_inputs() {
  return {random_f32({1, 5, 9, 9}, 7), random_f32({1, 16, 6, 7}, 12), random_f32({1, 7, 5, 24}, 8), random_f32({37, 64}, 9)};
}

Result<PassResult> lower(Model& m, DType precision, const CpuFeatures& cpu, bool lower_output_layers = false) {
  Target target;
  target.cpu = cpu;
  PassContext ctx{target, {}, nullptr, precision, lower_output_layers};
  return find_pass("lower_precision")->run(m, ctx);
}

// The host's features with the ISA `precision` asks for (on a host without AVX-512, that ISA's
// `--target` preset): the pass's checks pass on any CPU.
CpuFeatures with_isa(DType precision) {
  const bool bf16 = precision == DType::bf16;
  if (!CpuFeatures::host().avx512f) return *CpuFeatures::named(bf16 ? "avx512-bf16" : "avx512-fp16");  // an AVX2 host
  CpuFeatures cpu = CpuFeatures::host();
  (bf16 ? cpu.avx512_bf16 : cpu.avx512_fp16) = true;
  return cpu;
}

// m compiled with --precision bf16 for the host's features, with or without AMX.
auto compile_bf16(Model& m, bool amx, int threads) {
  CompileOptions options;
  options.precision = DType::bf16;
  options.target.cpu = with_isa(DType::bf16);
  options.target.cpu.amx = amx;
  options.target.threads = threads;
  return compile_model(m, options);
}

// A compiled model saved and loaded, run on its kernels (`got`) and on the reference kernels
// (`want`); empty where a step failed (the test has failed then).
struct SavedRuns {
  std::vector<Tensor> got, want;
};

SavedRuns run_saved(const Model& m, const std::vector<Tensor>& in) {
  SavedRuns r;
  auto bytes = serialize_model(m);
  EXPECT_TRUE(bytes.ok()) << bytes.error().message();
  if (!bytes.ok()) return r;
  auto loaded = load_model_from_bytes(*bytes, "compiled.kiln");
  EXPECT_TRUE(loaded.ok()) << loaded.error().message();
  if (!loaded.ok()) return r;
  auto s = Session::create(*loaded);
  EXPECT_TRUE(s.ok()) << s.error().message();
  if (!s.ok()) return r;
  auto got = (*s)->run(in);
  EXPECT_TRUE(got.ok()) << got.error().message();
  if (!got.ok()) return r;
  r.got = std::move(*got);
  r.want = run_reference(*loaded, in);
  return r;
}

const Node& node_named(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes)
    if (n.name == name) return n;
  throw std::runtime_error("no node " + name);
}

// A weight's conversion (nn::store_from_f32, 8 values at a time where the CPU can) gives the
// bits half's and bfloat16's one at a time give, and f16 widens back (nn::to_f32) as half's does:
// every 251st bit pattern of a float (NaNs, infinities, subnormals), and for every exponent and
// sign the patterns on either side of both types' rounding ties, in a count that leaves a tail.
TEST(LowerPrecision, WeightsConvertedAsOneAtATime) {
  std::vector<uint32_t> bits;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 251) bits.push_back(static_cast<uint32_t>(b));
  for (uint32_t top = 0; top < 512; ++top)  // sign and exponent
    for (uint32_t mid = 0; mid < 1024; mid += 3)
      for (uint32_t tie : {0x1000u, 0x8000u})
        for (uint32_t low : {tie - 1, tie, tie + 1}) bits.push_back(top << 23 | (mid << 13 & 0x7fffffu) | low);
  bits.push_back(0x7f800001u);  // a signalling NaN
  const int64_t n = static_cast<int64_t>(bits.size());
  ASSERT_NE(n % 8, 0);
  Tensor f(DType::f32, {n}), h(DType::f16, {n}), b(DType::bf16, {n});
  std::memcpy(f.raw(), bits.data(), bits.size() * 4);
  nn::store_from_f32(f, h);
  nn::store_from_f32(f, b);
  const Tensor wide = nn::to_f32(h);
  for (int64_t i = 0; i < n; ++i) {
    const float v = f.data<float>()[i];
    ASSERT_EQ(h.data<half>()[i].bits, half(v).bits) << std::hex << bits[static_cast<size_t>(i)];
    ASSERT_EQ(b.data<bfloat16>()[i].bits, bfloat16(v).bits) << std::hex << bits[static_cast<size_t>(i)];
    const float back = static_cast<float>(h.data<half>()[i]);
    ASSERT_EQ(std::memcmp(&wide.data<float>()[i], &back, 4), 0) << std::hex << h.data<half>()[i].bits;
  }
}

TEST(LowerPrecision, LowersConstantWeightProductsAndKeepsTheFinalLayer) {
  for (DType precision : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(precision));
    Model m = mixed_model();
    Result<PassResult> r = lower(m, precision, with_isa(precision));
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(r->changed);
    const std::string name(dtype_name(precision));
    EXPECT_EQ(r->summary, "lowered 4 convolutions and matrix products to " + name +
                              " (their weights 59 KiB -> 29 KiB); kept f32 as it writes a graph output: 'mm2'")
        << r->summary;
    ASSERT_TRUE(verify_model(m).ok());
    const Graph& g = m.graph;
    for (const char* lowered : {"conv", "conv2", "pw", "mm1"}) {
      const Node& n = node_named(g, lowered);
      EXPECT_EQ(n.op, std::string(lowered) == "mm1" ? "FusedMatMul" : "FusedConv") << lowered;
      EXPECT_EQ(g.value(n.inputs[1]).dtype, precision) << lowered;
      EXPECT_EQ(g.value(n.inputs[1]).name, g.value(n.inputs[1]).name.substr(0, g.value(n.inputs[1]).name.find('.')) + "." + name);
    }
    const Node& last = node_named(g, "mm2");
    EXPECT_EQ(last.op, "MatMul");
    EXPECT_EQ(g.value(last.inputs[1]).dtype, DType::f32);
    // The plain f32 copies nobody reads any more are gone; the stored ones are the rounded values.
    EXPECT_EQ(g.find_value("b1"), kNoValue);
    const Tensor& b1 = g.value(g.find_value("b1." + name)).constant;
    const Tensor want = random_f32({64, 100}, 5);
    for (int64_t i = 0; i < want.numel(); ++i) {
      const float v = want.data<float>()[i];
      const float got = precision == DType::bf16 ? static_cast<float>(b1.data<bfloat16>()[i]) : static_cast<float>(b1.data<half>()[i]);
      ASSERT_EQ(got, precision == DType::bf16 ? static_cast<float>(bfloat16(v)) : static_cast<float>(half(v))) << i;
    }
    Result<PassResult> again = lower(m, precision, with_isa(precision));
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->changed) << "a second run finds nothing f32 to lower";
  }
}

// --lower-output-layers: the final layer is lowered too, its output still f32, and the model's
// fast kernels (a compile for the host's ISA, where it has it) stay near the exact f32 result.
TEST(LowerPrecision, LowerOutputLayersLowersTheFinalLayerToo) {
  for (DType precision : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(precision));
    Model m = mixed_model();
    const Model f32 = m;
    Result<PassResult> r = lower(m, precision, with_isa(precision), true);
    ASSERT_TRUE(r.ok()) << r.error().message();
    const std::string name(dtype_name(precision));
    EXPECT_EQ(r->summary, "lowered 5 convolutions and matrix products to " + name + " (their weights 62 KiB -> 31 KiB)") << r->summary;
    const Node& last = node_named(m.graph, "mm2");
    EXPECT_EQ(last.op, "FusedMatMul");
    EXPECT_EQ(m.graph.value(last.inputs[1]).dtype, precision);
    EXPECT_EQ(m.graph.value(last.outputs[0]).dtype, DType::f32);
    const std::vector<Tensor> in = mixed_inputs();
    const std::vector<Tensor> exact = run_reference(f32, in), lowered = run_reference(m, in);
    ASSERT_EQ(lowered.size(), 4u);
    const double err = relative_l2(lowered[3], exact[3]);
    EXPECT_LE(err, 1e-2);
    EXPECT_GT(err, 1e-6) << "the final layer's rounding changed nothing";
    const bool runs_here = precision == DType::bf16 ? CpuFeatures::host().avx512_bf16 : CpuFeatures::host().avx512_fp16;
    if (!runs_here) continue;
    CompileOptions options;
    options.precision = precision;
    options.lower_output_layers = true;
    options.target.cpu = CpuFeatures::host();
    Model compiled = f32;
    auto report = compile_model(compiled, options);
    ASSERT_TRUE(report.ok()) << report.error().message();
    const SavedRuns runs = run_saved(compiled, in);
    ASSERT_EQ(runs.got.size(), 4u);
    EXPECT_LE(relative_l2(runs.got[3], exact[3]), 1e-2);
    // As in FastKernelsMatchTheReferenceCompiledSavedAndLoaded: kiln.gemm_f16_avx512 rounds A to
    // f16 and sums in f16 over blocks of K; AMX's tiles sum in their own order.
    const double tolerance = precision == DType::f16 ? 5e-3 : options.target.cpu.amx ? 2e-3 : 1e-5;
    EXPECT_LE(relative_l2(runs.got[3], runs.want[3]), tolerance) << "the fast kernels against the lowered reference";
  }
}

TEST(LowerPrecision, Fp32IsNoChange) {
  Model m = mixed_model();
  Result<PassResult> r = lower(m, DType::f32, CpuFeatures{});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
  EXPECT_EQ(node_named(m.graph, "mm1").op, "MatMul");
}

TEST(LowerPrecision, TheTargetMustHaveTheIsa) {
  Model m = mixed_model();
  Result<PassResult> bf16 = lower(m, DType::bf16, *CpuFeatures::named("avx512-vnni"));
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.error().kind, ErrorKind::user);
  EXPECT_EQ(bf16.error().what, "--precision bf16: the target CPU lacks avx512-bf16 (--target names a CPU to compile for)");
  Result<PassResult> fp16 = lower(m, DType::f16, *CpuFeatures::named("avx512-bf16"));
  ASSERT_FALSE(fp16.ok());
  EXPECT_EQ(fp16.error().what, "--precision fp16: the target CPU lacks avx512-fp16 (--target names a CPU to compile for)");
  EXPECT_EQ(node_named(m.graph, "mm1").op, "MatMul") << "refused before any change";
  EXPECT_TRUE(lower(m, DType::f16, *CpuFeatures::named("avx512-fp16")).ok());
  EXPECT_EQ(CpuFeatures::named("avx512-fp16")->str(), "avx2 fma avx512f avx512bw avx512vl avx512-vnni avx512-bf16 avx512-fp16");
  EXPECT_EQ(CpuFeatures::named("amx")->str(), "avx2 fma avx512f avx512bw avx512vl avx512-vnni avx512-bf16 avx512-fp16 amx");
}

// The reference semantics: a bf16 weight multiplies the activations rounded to bf16, an f16
// weight the activations as they are, both summed in f32: the f32 graph on those values.
TEST(LowerPrecision, ReferenceIsTheF32GraphOnTheRoundedValues) {
  for (DType precision : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(precision));
    Model f32 = mixed_model(), lowered = f32;
    ASSERT_TRUE(lower(lowered, precision, with_isa(precision)).ok());
    const std::vector<Tensor> in = mixed_inputs();
    const std::vector<Tensor> got = run_reference(lowered, in), exact = run_reference(f32, in);
    // The f32 model with the lowered weights' values and, for bf16, the inputs rounded.
    Model rounded = f32;
    for (const char* w : {"w", "w2", "pw_w", "b1"}) {
      Tensor& t = rounded.graph.value(rounded.graph.find_value(w)).constant;
      for (int64_t i = 0; i < t.numel(); ++i) {
        float& v = t.data<float>()[i];
        v = precision == DType::bf16 ? static_cast<float>(bfloat16(v)) : static_cast<float>(half(v));
      }
    }
    std::vector<Tensor> rin;
    for (const Tensor& t : in) {
      Tensor& r = rin.emplace_back(t.dtype(), t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) {
        const float v = t.data<float>()[i];
        r.data<float>()[i] = precision == DType::bf16 ? static_cast<float>(bfloat16(v)) : v;
      }
    }
    const std::vector<Tensor> want = run_reference(rounded, rin);
    ASSERT_EQ(got.size(), 4u);
    ASSERT_EQ(want.size(), 4u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(relative_l2(got[i], want[i]), 1e-6) << "output " << i;
      const double err = relative_l2(got[i], exact[i]);
      EXPECT_LE(err, 1e-2) << "output " << i;
      EXPECT_GT(err, 1e-6) << "output " << i << ": the lowering changed nothing";
    }
    // The final layer is f32, but reads the lowered layer's output.
    EXPECT_LE(relative_l2(got[3], exact[3]), 1e-2);
  }
}

// The fast kernels compute what the references do, through a compile (kernel choice, packing),
// a save and a load. On an AMX target kiln.gemm_bf16_avx512 takes the same nodes (and runs them
// on the tiles there); the model so compiled runs here too, on VDPBF16PS where the CPU lacks AMX.
TEST(LowerPrecision, FastKernelsMatchTheReferenceCompiledSavedAndLoaded) {
  using Case = std::pair<DType, bool>;  // the precision, and whether the target has AMX
  for (const auto& [precision, amx] : {Case{DType::bf16, false}, Case{DType::f16, false}, Case{DType::bf16, true}}) {
    SCOPED_TRACE(std::string(dtype_name(precision)) + (amx ? " on an AMX target" : ""));
    if (precision == DType::bf16 && !CpuFeatures::host().avx512_bf16) {
      std::cout << "[  SKIPPED ] bf16: this CPU lacks avx512-bf16\n";
      continue;
    }
    Model m = mixed_model();
    CompileOptions options;
    options.precision = precision;
    options.target.cpu = with_isa(precision);  // what --target avx512-fp16 does where the host lacks it
    options.target.cpu.amx = amx;
    options.target.threads = 2;
    auto report = compile_model(m, options);
    ASSERT_TRUE(report.ok()) << report.error().message();
    const Graph& g = m.graph;
    if (precision == DType::bf16) {
      EXPECT_EQ(node_named(g, "mm1").kernel.name, "kiln.gemm_bf16_avx512");
      EXPECT_EQ(node_named(g, "pw").kernel.name, "kiln.gemm_bf16_avx512");
      EXPECT_EQ(node_named(g, "conv").kernel.name, "onednn.conv");
      EXPECT_EQ(node_named(g, "conv2").kernel.name, "onednn.conv");
      // The packed bf16 weights are stored as such: half the f32 bytes.
      const Tensor& w = g.value(node_named(g, "conv").inputs[1]).constant;
      EXPECT_TRUE(w.is_packed());
      EXPECT_EQ(w.dtype(), DType::bf16);
      const Tensor& b1 = g.value(node_named(g, "mm1").inputs[1]).constant;
      ASSERT_TRUE(b1.is_packed());
      EXPECT_EQ(b1.dtype(), DType::bf16);
      EXPECT_EQ(b1.layout()->packed_for, "kiln gemm_bf16 nr48");
      const Tensor plain = unpack(b1), want = random_f32({64, 100}, 5);
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_EQ(static_cast<float>(plain.data<bfloat16>()[i]), static_cast<float>(bfloat16(want.data<float>()[i]))) << i;
    } else {
      EXPECT_EQ(node_named(g, "mm1").kernel.name, "kiln.gemm_f16_avx512");
      EXPECT_EQ(node_named(g, "pw").kernel.name, "kiln.gemm_f16_avx512");
      EXPECT_EQ(node_named(g, "conv").kernel.name, "onednn.conv") << "5 channels in: oneDNN's";
      EXPECT_EQ(node_named(g, "conv2").kernel.name, "kiln.gemm_f16_avx512");
      EXPECT_FALSE(g.value(node_named(g, "conv").inputs[1]).constant.is_packed()) << "f16 weights stay f16";
      // The f16 GEMM's weights are stored in its panels, still f16: the 3x3 convolution's in the
      // windows' order.
      const Tensor& w2 = g.value(node_named(g, "conv2").inputs[1]).constant;
      ASSERT_TRUE(w2.is_packed());
      EXPECT_EQ(w2.dtype(), DType::f16);
      EXPECT_EQ(w2.layout()->packed_for, "kiln gemm_f16 nr64 windows");
      const Tensor& b1 = g.value(node_named(g, "mm1").inputs[1]).constant;
      ASSERT_TRUE(b1.is_packed());
      EXPECT_EQ(b1.layout()->packed_for, "kiln gemm_f16 nr64");
      const Tensor plain = unpack(b1), want = random_f32({64, 100}, 5);
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_EQ(static_cast<float>(plain.data<half>()[i]), static_cast<float>(half(want.data<float>()[i]))) << i;
      if (!CpuFeatures::host().avx512_fp16) {  // compiled for a CPU with AVX512-FP16: refused here
        auto s = Session::create(m);
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.error().message().find("avx512"), std::string::npos) << s.error().message();
        continue;
      }
    }
    auto bytes = serialize_model(m);
    ASSERT_TRUE(bytes.ok()) << bytes.error().message();
    auto loaded = load_model_from_bytes(*bytes, "lowered.kiln");
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    const std::vector<Tensor> in = mixed_inputs();
    const std::vector<Tensor> want = run_reference(*loaded, in);
    for (const Model* model : {&m, &*loaded}) {
      auto s = Session::create(*model);
      ASSERT_TRUE(s.ok()) << s.error().message();
      auto got = (*s)->run(in);
      ASSERT_TRUE(got.ok()) << got.error().message();
      ASSERT_EQ(got->size(), want.size());
      // kiln.gemm_f16_avx512 rounds A to f16 and sums in f16 over blocks of K, which the
      // reference (f32 products of the widened weights) does not.
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LE(relative_l2((*got)[i], want[i]), precision == DType::f16 ? 5e-3 : 1e-5) << "output " << i;
    }
  }
}

// A chain of convolutions, as a ResNet block has them: a 3x3 conv, a 3x3 max pool, a 1x1
// conv (also read by an average pool, an f32 reader), a 3x3 conv with the first's output as
// its residual, and a 1x1 conv with that one's output as its residual, whose ReLU is the graph
// output.
Model conv_chain_model() {
  testing::GraphBuilder b;
  const std::vector<Attribute> pad1 = {attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
  ValueId x = b.input("x", {1, 16, 9, 11});
  ValueId a = b.op("relu_a", "Relu", {b.op("a", "Conv", {x, b.constant("wa", random_f32({24, 16, 3, 3}, 21)), b.constant("ba", random_f32({24}, 22))}, pad1)});
  ValueId pa = b.op("pool_a", "MaxPool", {a}, {attr("kernel_shape", std::vector<int64_t>{3, 3}), pad1[0]});
  ValueId rb = b.op("relu_b", "Relu", {b.op("b", "Conv", {pa, b.constant("wb", random_f32({24, 24, 1, 1}, 23)), b.constant("bb", random_f32({24}, 24))})});
  ValueId pool = b.op("pool", "GlobalAveragePool", {rb});
  ValueId c = b.op("c", "Conv", {rb, b.constant("wc", random_f32({24, 24, 3, 3}, 25)), b.constant("bc", random_f32({24}, 26))}, pad1);
  ValueId rc = b.op("relu_c", "Relu", {b.op("add_c", "Add", {c, a})});
  ValueId d = b.op("d", "Conv", {rc, b.constant("wd", random_f32({24, 24, 1, 1}, 27)), b.constant("bd", random_f32({24}, 28))});
  ValueId rd = b.op("relu_d", "Relu", {b.op("add_d", "Add", {d, rc})});
  return b.done({rd, pool});
}

// On an AMX target the chain's activations stay bf16 where only convolutions and max pools read
// them: 'a' and 'c' write bf16 (read by the pool and as X and Z by the convolutions after them),
// the pool reads and writes bf16, 'b' and 'd' read bf16 and write f32 for the average pool and
// the output, and a Cast gives 'd' its residual (c's output) in f32. The result is the
// reference's (X and Z widened, Y rounded as stored) within bf16's rounding of Y, and within
// 1e-2 of f32. Elsewhere (no AMX) the activations stay f32.
TEST(LowerPrecision, AmxKeepsActivationsBf16BetweenConvolutions) {
  if (!CpuFeatures::host().avx512_bf16) GTEST_SKIP() << "this CPU lacks avx512-bf16";
  const std::vector<Tensor> in = {random_f32({1, 16, 9, 11}, 29)};
  const std::vector<Tensor> exact = run_reference(conv_chain_model(), in);
  // Per convolution, with AMX: X, Y and Z (undefined: none).
  const std::map<std::string, std::array<DType, 3>> amx_types = {
      {"a", {DType::f32, DType::bf16, DType::undefined}},
      {"b", {DType::bf16, DType::f32, DType::undefined}},
      {"c", {DType::f32, DType::bf16, DType::bf16}},
      {"d", {DType::bf16, DType::f32, DType::f32}}};
  for (bool amx : {true, false}) {
    SCOPED_TRACE(amx ? "AMX target" : "no AMX");
    Model m = conv_chain_model();
    auto report = compile_bf16(m, amx, 2);
    ASSERT_TRUE(report.ok()) << report.error().message();
    const Graph& g = m.graph;
    size_t casts = 0, convs = 0;
    for (const Node& n : g.nodes) {
      if (n.op == "Cast") {
        ++casts;
        EXPECT_EQ(n.kernel.name, "onednn.cast") << n.name;
        EXPECT_EQ(g.value(n.inputs[0]).dtype, DType::bf16);
        EXPECT_EQ(g.value(n.outputs[0]).dtype, DType::f32);
      }
      if (n.op == "MaxPool") {  // kiln's, on bf16 between bf16 convolutions, else on f32
        EXPECT_EQ(n.kernel.name, amx ? "kiln.max_pool_bf16_avx512" : "kiln.max_pool_f32_avx512");
        EXPECT_EQ(g.value(n.inputs[0]).dtype, amx ? DType::bf16 : DType::f32) << "the max pool between bf16 convolutions";
        EXPECT_EQ(g.value(n.outputs[0]).dtype, amx ? DType::bf16 : DType::f32);
      }
      if (n.op != "FusedConv") continue;
      ++convs;
      EXPECT_EQ(n.kernel.name, "onednn.conv") << n.name;
      std::array<DType, 3> want = {DType::f32, DType::f32, n.has_input(3) ? DType::f32 : DType::undefined};
      if (amx) want = amx_types.at(n.name);
      EXPECT_EQ(g.value(n.inputs[0]).dtype, want[0]) << n.name << " X";
      EXPECT_EQ(g.value(n.outputs[0]).dtype, want[1]) << n.name << " Y";
      EXPECT_EQ(n.has_input(3) ? g.value(n.inputs[3]).dtype : DType::undefined, want[2]) << n.name << " Z";
      EXPECT_EQ(n.attr_string("output_type", "f32"), dtype_name(want[1])) << n.name;
      EXPECT_EQ(g.value(n.inputs[2]).dtype, DType::f32) << n.name << " the bias";
    }
    EXPECT_EQ(convs, 4u);
    EXPECT_EQ(casts, amx ? 1u : 0u) << "d's residual";
    for (ValueId v : g.outputs) EXPECT_EQ(g.value(v).dtype, DType::f32);
    const SavedRuns r = run_saved(m, in);
    ASSERT_EQ(r.got.size(), 2u);
    ASSERT_EQ(r.want.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      // A sum in another order can round Y to the neighbouring bf16 (2^-8 apart) here and there.
      EXPECT_LE(relative_l2(r.got[i], r.want[i]), amx ? 2e-3 : 1e-5) << "output " << i;
      const double err = relative_l2(r.got[i], exact[i]);
      EXPECT_LE(err, 1e-2) << "output " << i;
      EXPECT_GT(err, 1e-6) << "output " << i << ": nothing was lowered";
    }
  }
}

// Two attentions over the same heads: the first's context goes through a linear layer, the
// second's is a graph output.
Model attention_model() {
  testing::GraphBuilder b;
  ValueId q = b.input("q", {1, 2, 40, 64}), k = b.input("k", {1, 2, 70, 64}), v = b.input("v", {1, 2, 70, 32});
  ValueId a = b.op("att", "Attention", {q, k, v}, {attr("is_causal", int64_t{1})});
  ValueId y = b.op("proj", "MatMul", {a, b.constant("w", random_f32({32, 16}, 30))});
  ValueId a2 = b.op("att_out", "Attention", {q, k, v});
  return b.done({y, a2});
}

TEST(LowerPrecision, AmxLowersAttentionProductsToBf16) {
  // On an AMX target bf16 also lowers attention's products (kiln.attention_bf16_amx); without
  // AMX, or where the attention writes a graph output, it stays f32.
  const std::vector<Tensor> in = {random_f32({1, 2, 40, 64}, 31), random_f32({1, 2, 70, 64}, 32), random_f32({1, 2, 70, 32}, 33)};
  const std::vector<Tensor> exact = run_reference(attention_model(), in);
  {
    Model m = attention_model();
    CpuFeatures cpu = with_isa(DType::bf16);
    cpu.amx = true;
    auto r = lower(m, DType::bf16, cpu);
    ASSERT_TRUE(r.ok()) << r.error().message();
    // proj and att_out write the graph's outputs.
    EXPECT_EQ(r->summary, "lowered 1 attention's products to bf16; kept f32 as it writes a graph output: 'proj' 'att_out'");
  }
  for (bool amx : {true, false}) {
    SCOPED_TRACE(amx ? "AMX target" : "no AMX");
    Model m = attention_model();
    auto report = compile_bf16(m, amx, 2);  // two threads: each configures its own tiles
    ASSERT_TRUE(report.ok()) << report.error().message();
    const Node& att = node_named(m.graph, "att");
    EXPECT_EQ(att.attr_string("product_type", "f32"), amx ? "bf16" : "f32");
    if (amx) EXPECT_EQ(att.kernel.name, "kiln.attention_bf16_amx");
    else EXPECT_EQ(att.kernel.name.find("bf16"), std::string::npos) << att.kernel.name;
    EXPECT_FALSE(node_named(m.graph, "att_out").has_attr("product_type")) << "it writes a graph output";
    if (amx != CpuFeatures::host().amx || !testing::runs_here(m)) continue;  // the compiled model runs here
    const SavedRuns r = run_saved(m, in);
    ASSERT_EQ(r.got.size(), 2u);
    ASSERT_EQ(r.want.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_LE(relative_l2(r.got[i], r.want[i]), 2e-4) << "output " << i;
      EXPECT_LE(relative_l2(r.got[i], exact[i]), 1e-2) << "output " << i;
    }
    if (amx) {
      EXPECT_GT(relative_l2(r.got[0], exact[0]), 1e-5) << "the attention was lowered";
    }
  }
}

// oneDNN's convolution (bf16 X, Y and Z in each combination) and max pool on bf16 activations
// against the reference on odd sizes, and the schema's rules for bf16 activations.
TEST(LowerPrecision, Bf16ActivationKernelsMatchTheReference) {
  if (!CpuFeatures::host().avx512_bf16) GTEST_SKIP() << "this CPU lacks avx512-bf16";
  // X and Y (with Z) in each type but f32 / f32, 1x1 and 3x3.
  using Types = std::pair<bool, bool>;  // X bf16, Y bf16
  for (const auto& [x_bf16, y_bf16] : {Types{true, true}, Types{true, false}, Types{false, true}}) {
    for (int64_t k : {1, 3}) {
      SCOPED_TRACE(std::string(x_bf16 ? "bf16" : "f32") + " X, " + (y_bf16 ? "bf16" : "f32") + " Y, " + std::to_string(k) + "x" + std::to_string(k));
      const Tensor x = random_f32({1, 7, 9, 24}, 31), z = random_f32({1, 7, 9, 40}, 34);
      std::vector<Attribute> attrs = {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>(4, k / 2)),
                                      attr("activation", std::string("Relu")), attr("post_activation", std::string("Relu"))};
      if (y_bf16) attrs.push_back(attr("output_type", std::string("bf16")));
      testing::Case c{"FusedConv",
                      {x_bf16 ? bf16_of(x) : x, bf16_of(random_f32({40, 24, k, k}, 32)), random_f32({40}, 33), y_bf16 ? bf16_of(z) : z},
                      {false, true, true, false},
                      attrs};
      // A bf16 Y: an element may round to the neighbouring bf16 (2^-8 apart).
      EXPECT_EQ(testing::check(c, y_bf16 ? 2e-3 : 1e-5), "onednn.conv");
    }
  }
  // A max pool on bf16 (between two bf16 convolutions): the reference's, bitwise; channels-last
  // on kiln's kernel (CpuKernels.MaxPoolOnBf16AndCodes), channels-first on oneDNN's.
  for (bool last : {true, false}) {
    std::vector<Attribute> a = {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                                attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
    if (last) a.push_back(attr("channels_last", int64_t{1}));
    const std::optional<cpu::Isa> isa = cpu::best_isa(CpuFeatures::host());
    EXPECT_EQ(testing::check({"MaxPool", {bf16_of(random_f32({1, 7, 9, 24}, 37))}, {false}, a}, 0.0),
              last && isa ? "kiln.max_pool_bf16_" + std::string(cpu::isa_name(*isa)) : "onednn.pool");
  }
  // bf16 activations come with a bf16 weight only, and Z has Y's type.
  auto infer_error = [&](DType x, const Tensor& w, const char* output_type, DType z) {
    testing::GraphBuilder b;
    std::vector<ValueId> in = {b.input("x", {1, 3, 3, 8}, x), b.constant("w", w)};
    if (z != DType::undefined) in.insert(in.end(), {kNoValue, b.input("z", {1, 3, 3, 8}, z)});
    b.g.outputs = {b.op("y", "FusedConv", in, {attr("channels_last", int64_t{1}), attr("output_type", std::string(output_type))})};
    auto inferred = infer_graph(b.g);
    return inferred.ok() ? std::string() : inferred.error().what;
  };
  const Tensor w32 = random_f32({8, 8, 1, 1}, 36), w16 = bf16_of(w32);
  EXPECT_EQ(infer_error(DType::bf16, w32, "f32", DType::undefined), "bf16 activations need a bf16 weight, not f32");
  EXPECT_EQ(infer_error(DType::f32, w32, "bf16", DType::undefined), "bf16 activations need a bf16 weight, not f32");
  EXPECT_EQ(infer_error(DType::f32, w16, "bf16", DType::f32), "the residual input Z is f32 but output_type is bf16");
  EXPECT_EQ(infer_error(DType::f32, w16, "f16", DType::undefined), "output_type 'f16' is neither f32 nor bf16");
  EXPECT_EQ(infer_error(DType::bf16, w16, "bf16", DType::bf16), "");
}

// kiln.dwconv_bf16_avx512, the channels-last depthwise convolution by a bf16 weight, pinned:
// X f32 (rounded to bf16 as the products take it) or bf16, Y f32 or bf16 with a residual Z of
// its type; 3x3 and 5x5 filters, stride 1 (row pairs) and 2; channels below, at and past a
// vector; rows of edge columns only and of inside ones; pads asymmetric; one and two threads
// (a ring of widened rows each, which a thread's next rows reuse). Then the default rule.
TEST(LowerPrecision, Bf16DepthwiseKernelMatchesTheReference) {
  if (cpu::best_isa(CpuFeatures::host()) != cpu::Isa::avx512) GTEST_SKIP() << "this CPU lacks AVX-512";
  const std::string name = "kiln.dwconv_bf16_avx512";
  for (int threads : {1, 2})
    for (int64_t k : {3, 5})
      for (int64_t stride : {1, 2})
        for (int64_t c : {5, 16, 40})
          for (int64_t width : {3, 14}) {
            const int64_t p = k / 2, images = 2, height = threads == 2 ? 40 : 9;  // two threads: work enough to share
            const int64_t oh = (height + p - k) / stride + 1, ow = (width + 2 * p + 1 - k) / stride + 1;
            const Tensor x = random_f32({images, height, width, c}, 41), w = bf16_of(random_f32({c, 1, k, k}, 42));
            const Tensor b = random_f32({c}, 43), z = random_f32({images, oh, ow, c}, 44);
            for (bool x_bf16 : {false, true})
              for (bool y_bf16 : {false, true}) {
                SCOPED_TRACE("k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " c=" + std::to_string(c) + " w=" +
                             std::to_string(width) + " threads=" + std::to_string(threads) + (x_bf16 ? " bf16 X" : " f32 X") +
                             (y_bf16 ? " bf16 Y" : " f32 Y"));
                std::vector<Attribute> a = {attr("group", c), attr("channels_last", int64_t{1}),
                                            attr("pads", std::vector<int64_t>{p, p + 1, 0, p}),
                                            attr("strides", std::vector<int64_t>{stride, stride}), attr("activation", std::string("Silu"))};
                if (y_bf16) a.push_back(attr("output_type", std::string("bf16")));
                // A bf16 Y: an element may round to the neighbouring bf16 (2^-8 apart).
                const double tol = y_bf16 ? 2e-3 : 1e-5;
                const Tensor xi = x_bf16 ? bf16_of(x) : x;
                EXPECT_EQ(testing::check({"FusedConv", {xi, w, b}, {false, true, true}, a, {true}, name, {}, threads}, tol), name);
                a.push_back(attr("post_activation", std::string("Relu")));
                EXPECT_EQ(testing::check({"FusedConv", {xi, w, Tensor(), y_bf16 ? bf16_of(z) : z}, {false, true, false, false}, a, {true},
                                          name, {}, threads},
                                         tol),
                          name);
              }
          }
  // The rule: kiln's for 3x3 and 5x5 filters with a SiLU but the 3x3 stride-2 ones; oneDNN's
  // for a Clip and for 7x7 filters (where the CPU runs oneDNN's bf16 convolution).
  if (!CpuFeatures::host().avx512_bf16) return;
  auto layer = [](int64_t k, int64_t stride, const char* act) {
    std::vector<Attribute> a = {attr("group", int64_t{32}), attr("channels_last", int64_t{1}),
                                attr("pads", std::vector<int64_t>(4, k / 2)), attr("strides", std::vector<int64_t>{stride, stride}),
                                attr("activation", std::string(act)), attr("output_type", std::string("bf16"))};
    if (std::string(act) == "Clip") a.push_back(attr("activation_params", std::vector<double>{0, 6}));
    SCOPED_TRACE("rule k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " " + act);
    return testing::check({"FusedConv", {bf16_of(random_f32({1, 10, 7, 32}, 45)), bf16_of(random_f32({32, 1, k, k}, 46))},
                           {false, true}, a},
                          2e-3);
  };
  EXPECT_EQ(layer(3, 1, "Silu"), name);
  EXPECT_EQ(layer(5, 1, "Silu"), name);
  EXPECT_EQ(layer(5, 2, "Silu"), name);
  EXPECT_EQ(layer(3, 2, "Silu"), name);  // the direct form's (on the ring, oneDNN's)
  EXPECT_EQ(layer(3, 1, "Clip"), name);  // the direct form's (on the ring, oneDNN's)
  EXPECT_EQ(layer(5, 1, "Clip"), "onednn.conv");
  EXPECT_EQ(layer(7, 1, "Silu"), "onednn.conv");
}

// kiln.dwconv_bf16_avx512's direct form (dwconv_bf16.h), pinned: 3x3 at stride 1 and 2 and 5x5
// at stride 2, one to three vectors of channels, rows of 3, 14 and 19 columns (the inside
// columns in blocks of 8, 4, 2 and 1, the edge ones apart; asymmetric padding), each activation
// it applies, X and Y each f32 or bf16, with and without a bias, two images on one and two
// threads. A 5x5 stride-1 layer, a residual, or channels past whole vectors keep the ring.
TEST(LowerPrecision, Bf16DepthwiseDirectForm) {
  if (!CpuFeatures::host().avx512_bf16) GTEST_SKIP() << "this CPU lacks avx512-bf16";
  const std::string name = "kiln.dwconv_bf16_avx512";
  struct Act {
    const char* name;
    std::vector<double> params;
  };
  for (int threads : {1, 2})
    for (const auto& [k, stride] : {std::pair<int64_t, int64_t>{3, 1}, {3, 2}, {5, 2}, {5, 1}})
      for (int64_t c : {16, 48})
        for (int64_t width : {3, 14, 19})
          for (const Act& act : {Act{"", {}}, Act{"Relu", {}}, Act{"Clip", {0, 6}}, Act{"Silu", {}}}) {
            const int64_t p = k / 2, images = 2, height = threads == 2 ? 24 : 7;
            const int64_t oh = (height + p - k) / stride + 1, ow = (width + 2 * p + 1 - k) / stride + 1;
            const Tensor x = random_f32({images, height, width, c}, 61), w = bf16_of(random_f32({c, 1, k, k}, 62));
            const Tensor b = random_f32({c}, 63), z = random_f32({images, oh, ow, c}, 64);
            for (bool x_bf16 : {false, true})
              for (bool y_bf16 : {false, true}) {
                SCOPED_TRACE("k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " c=" + std::to_string(c) + " w=" +
                             std::to_string(width) + " threads=" + std::to_string(threads) + " act=" + act.name +
                             (x_bf16 ? " bf16 X" : " f32 X") + (y_bf16 ? " bf16 Y" : " f32 Y"));
                std::vector<Attribute> a = {attr("group", c), attr("channels_last", int64_t{1}),
                                            attr("pads", std::vector<int64_t>{p, p + 1, 0, p}),
                                            attr("strides", std::vector<int64_t>{stride, stride})};
                if (*act.name) a.push_back(attr("activation", std::string(act.name)));
                if (!act.params.empty()) a.push_back(attr("activation_params", act.params));
                if (y_bf16) a.push_back(attr("output_type", std::string("bf16")));
                const double tol = y_bf16 ? 2e-3 : 1e-5;  // a bf16 Y: an element may round to the neighbouring bf16
                const Tensor xi = x_bf16 ? bf16_of(x) : x;
                const std::string direct = k == 5 && stride == 1 ? "" : "direct";
                std::string label;
                const bool bias = width != 14;  // without one on 14 columns
                EXPECT_EQ(testing::check({"FusedConv", {xi, w, bias ? b : Tensor()}, {false, true, true}, a, {true}, name, {}, threads}, tol,
                                         nullptr, nullptr, &label),
                          name);
                EXPECT_EQ(label, direct);
                if (act.params.empty() && *act.name == 'S') {  // a residual: the ring
                  EXPECT_EQ(testing::check({"FusedConv", {xi, w, b, y_bf16 ? bf16_of(z) : z}, {false, true, true, false}, a, {true}, name,
                                            {}, threads},
                                           tol, nullptr, nullptr, &label),
                            name);
                  EXPECT_EQ(label, "");
                }
              }
          }
  // Channels past a whole vector: the ring.
  const Tensor x5 = bf16_of(random_f32({1, 6, 6, 24}, 65)), w5 = bf16_of(random_f32({24, 1, 3, 3}, 66));
  std::string label;
  EXPECT_EQ(testing::check({"FusedConv", {x5, w5}, {false, true},
                            {attr("group", int64_t{24}), attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>(4, 1)),
                             attr("output_type", std::string("bf16"))},
                            {true}, name},
                           2e-3, nullptr, nullptr, &label),
            name);
  EXPECT_EQ(label, "");
}

// kiln.gemm_bf16_avx512 on bf16 activations (a pointwise FusedConv with X, or Y, bf16), pinned:
// X widened, Y rounded from the f32 product and its epilogue; an f32 Z beside an f32 Y; images
// of many pixels and of one (a squeeze-and-excitation's), K below and past an AMX step, one and
// two threads. Then the rule: kiln's for one pixel, oneDNN's for more.
TEST(LowerPrecision, Bf16GemmOnBf16Activations) {
  if (!CpuFeatures::host().avx512_bf16) GTEST_SKIP() << "this CPU lacks avx512-bf16";
  const std::string name = "kiln.gemm_bf16_avx512";
  using Types = std::pair<bool, bool>;  // X bf16, Y bf16
  for (int threads : {1, 2})
    for (const std::vector<int64_t>& xs : {std::vector<int64_t>{1, 7, 9, 24}, {1, 1, 1, 40}, {2, 5, 3, 70}})
      for (const auto& [x_bf16, y_bf16] : {Types{true, true}, Types{true, false}, Types{false, true}}) {
        const int64_t c = xs[3], k = 36;
        SCOPED_TRACE(std::to_string(xs[0] * xs[1] * xs[2]) + " pixels of " + std::to_string(c) + (x_bf16 ? ", bf16 X" : ", f32 X") +
                     (y_bf16 ? ", bf16 Y" : ", f32 Y") + ", threads " + std::to_string(threads));
        const Tensor x = random_f32(xs, 51), w = bf16_of(random_f32({k, c, 1, 1}, 52)), b = random_f32({k}, 53);
        std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("activation", std::string("Silu"))};
        if (y_bf16) a.push_back(attr("output_type", std::string("bf16")));
        const double tol = y_bf16 ? 2e-3 : 1e-5;  // a bf16 Y: an element may round to the neighbouring bf16
        const Tensor xi = x_bf16 ? bf16_of(x) : x;
        EXPECT_EQ(testing::check({"FusedConv", {xi, w, b}, {false, true, true}, a, {true}, name, {}, threads}, tol), name);
        if (!y_bf16) {  // the residual, f32 as Y
          a.push_back(attr("post_activation", std::string("Relu")));
          const Tensor z = random_f32({xs[0], xs[1], xs[2], k}, 54);
          EXPECT_EQ(testing::check({"FusedConv", {xi, w, b, z}, {false, true, true, false}, a, {true}, name, {}, threads}, tol), name);
        }
      }
  // A bf16 residual, pinned (widened into the workspace beside X over fewer than 16 pixels or
  // without AMX); by default oneDNN's over 9 pixels.
  const Tensor x16 = bf16_of(random_f32({1, 3, 3, 16}, 55)), w16 = bf16_of(random_f32({16, 16, 1, 1}, 56));
  std::vector<Attribute> out16 = {attr("channels_last", int64_t{1}), attr("output_type", std::string("bf16"))};
  for (int threads : {1, 2}) {
    std::vector<Attribute> post = out16;
    post.push_back(attr("post_activation", std::string("Relu")));
    EXPECT_EQ(testing::check({"FusedConv", {x16, w16, Tensor(), x16}, {false, true, false, false}, post, {true}, name, {}, threads}, 2e-3), name);
  }
  EXPECT_EQ(testing::check({"FusedConv", {x16, w16, Tensor(), x16}, {false, true, false, false}, out16}, 2e-3), "onednn.conv");
  // The rule, with a SiLU: one pixel kiln's, more oneDNN's.
  out16.push_back(attr("activation", std::string("Silu")));
  EXPECT_EQ(testing::check({"FusedConv", {bf16_of(random_f32({1, 1, 1, 16}, 57)), w16}, {false, true}, out16}, 2e-3), name);
  EXPECT_EQ(testing::check({"FusedConv", {x16, w16}, {false, true}, out16}, 2e-3), "onednn.conv");
}

// On AMX tiles (gemm_bf16_tiles): X and Y as they are, K up to a whole tile (16, 24 and 40
// channels) or read in place (64), the clamps on the registers and a SiLU through the block's
// values, a masked last tile (40 output channels), a bf16 residual, pinned; then the rule.
TEST(LowerPrecision, Bf16GemmOnAmxTiles) {
  if (!CpuFeatures::host().amx) GTEST_SKIP() << "the CPU has no AMX";
  const std::string name = "kiln.gemm_bf16_avx512";
  for (int threads : {1, 2})
    for (int64_t c : {16, 24, 40, 64})
      for (const char* act : {"", "Relu", "Clip", "Silu"}) {
        SCOPED_TRACE(std::to_string(c) + " channels, " + act + ", threads " + std::to_string(threads));
        std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("output_type", std::string("bf16"))};
        if (*act) a.push_back(attr("activation", std::string(act)));
        if (std::string(act) == "Clip") a.push_back(attr("activation_params", std::vector<double>{0, 0.5}));
        const Tensor x = bf16_of(random_f32({1, 7, 9, c}, 58)), w = bf16_of(random_f32({40, c, 1, 1}, 59)), b = random_f32({40}, 60);
        std::string label;
        EXPECT_EQ(testing::check({"FusedConv", {x, w, b}, {false, true, true}, a, {true}, name, {}, threads}, 2e-3, nullptr, nullptr, &label),
                  name);
        EXPECT_EQ(label, "bf16_amx_tiles_bf16_rows");
        // A bf16 residual, then a ReLU.
        const Tensor z = bf16_of(random_f32({1, 7, 9, 40}, 65));
        a.push_back(attr("post_activation", std::string("Relu")));
        EXPECT_EQ(testing::check({"FusedConv", {x, w, b, z}, {false, true, true, false}, a, {true}, name, {}, threads}, 2e-3, nullptr, nullptr,
                                 &label),
                  name);
        EXPECT_EQ(label, "bf16_amx_tiles_bf16_rows");
      }
  // The rule: a projection (no activation, K at least twice N, 32 output channels or more; a bf16
  // residual after it too) kiln's, a ReLU, fewer steps or fewer channels oneDNN's, one pixel kiln's.
  const Tensor x = bf16_of(random_f32({1, 7, 9, 64}, 61)), w = bf16_of(random_f32({32, 64, 1, 1}, 62));
  const std::vector<Attribute> plain = {attr("channels_last", int64_t{1}), attr("output_type", std::string("bf16"))};
  std::vector<Attribute> relu = plain;
  relu.push_back(attr("activation", std::string("Relu")));
  EXPECT_EQ(testing::check({"FusedConv", {x, w}, {false, true}, plain}, 2e-3), name);
  EXPECT_EQ(testing::check({"FusedConv", {x, w, Tensor(), bf16_of(random_f32({1, 7, 9, 32}, 66))}, {false, true, false, false}, plain}, 2e-3),
            name);
  EXPECT_EQ(testing::check({"FusedConv", {x, w}, {false, true}, relu}, 2e-3), "onednn.conv");
  EXPECT_EQ(testing::check({"FusedConv", {x, bf16_of(random_f32({40, 64, 1, 1}, 63))}, {false, true}, plain}, 2e-3), "onednn.conv");
  EXPECT_EQ(testing::check({"FusedConv", {bf16_of(random_f32({1, 7, 9, 48}, 64)), bf16_of(random_f32({24, 48, 1, 1}, 63))}, {false, true}, plain},
                           2e-3),
            "onednn.conv");
  EXPECT_EQ(testing::check({"FusedConv", {bf16_of(random_f32({1, 1, 1, 24}, 64)), bf16_of(random_f32({24, 24, 1, 1}, 63))}, {false, true}, relu},
                           2e-3),
            name);
}

// onednn.conv's chunked form: a pointwise convolution from bf16 to bf16 activations with a
// transcendental activation runs in chunks of pixels, oneDNN's bare product then kiln's
// epilogue and rounding (the label says so), against the reference: one chunk, several a
// thread, a chunk whose values end past the last whole 32 (the scalar rounding), a post
// activation; where no divisor of the pixels makes chunks enough for the threads, and with a
// Clip, the whole convolution with oneDNN's post-ops.
TEST(LowerPrecision, ChunkedBf16ConvolutionMatchesTheReference) {
  if (!CpuFeatures::host().avx512_bf16) GTEST_SKIP() << "this CPU lacks avx512-bf16";
  struct Shape4 {
    std::vector<int64_t> x;
    int64_t k;
    int threads;
    const char* act;
    std::string label;
  };
  for (const Shape4& c : {Shape4{{1, 16, 12, 24}, 40, 1, "Silu", "chunks of 192 pixels, kiln epilogue"},
                          Shape4{{1, 16, 12, 24}, 40, 2, "Silu", "chunks of 96 pixels, kiln epilogue"},
                          Shape4{{2, 40, 40, 16}, 48, 2, "Silu", "chunks of 800 pixels, kiln epilogue"},
                          Shape4{{1, 7, 13, 24}, 36, 1, "Sigmoid", "chunks of 91 pixels, kiln epilogue"},
                          Shape4{{1, 7, 13, 24}, 36, 2, "Silu", ""},
                          Shape4{{1, 16, 12, 24}, 40, 1, "Clip", ""}}) {
    SCOPED_TRACE(std::to_string(c.x[0] * c.x[1] * c.x[2]) + " pixels, " + std::to_string(c.threads) + " threads, " + c.act);
    std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("output_type", std::string("bf16")),
                                attr("activation", std::string(c.act)), attr("post_activation", std::string("Relu"))};
    if (std::string(c.act) == "Clip") a.push_back(attr("activation_params", std::vector<double>{0, 6}));
    testing::Case conv{"FusedConv",
                       {bf16_of(random_f32(c.x, 61)), bf16_of(random_f32({c.k, c.x[3], 1, 1}, 62)), random_f32({c.k}, 63)},
                       {false, true, true},
                       a,
                       {true},
                       "onednn.conv",
                       {},
                       c.threads};
    std::string label;
    EXPECT_EQ(testing::check(conv, 2e-3, nullptr, nullptr, &label), "onednn.conv");
    EXPECT_EQ(label, c.label);
  }
}

// The Cast between f32 and bf16 (a residual's, in a bf16 chain), bitwise the reference's: on
// oneDNN where the CPU has AVX512-BF16, on the reference elsewhere (oneDNN's AVX2 reorder drops
// the sign of -0).
TEST(LowerPrecision, CastBetweenF32AndBf16) {
  // Runs the Cast both ways and compares the bits (infinities and signed zeros included).
  auto same_bits = [](const Tensor& x, const char* to) {
    SCOPED_TRACE(std::string(dtype_name(x.dtype())) + " to " + to);
    testing::BothRuns r = testing::run_both(testing::Case{"Cast", {x}, {false}, {attr("to", std::string(to))}});
    EXPECT_EQ(r.kernel, CpuFeatures::host().avx512_bf16 ? "onednn.cast" : kReferenceKernel);
    ASSERT_EQ(r.fast.size(), 1u);
    ASSERT_EQ(r.ref.size(), 1u);
    ASSERT_EQ(r.fast[0].nbytes(), r.ref[0].nbytes());
    EXPECT_EQ(std::memcmp(r.fast[0].raw(), r.ref[0].raw(), r.ref[0].nbytes()), 0);
  };
  Tensor x = random_f32({3, 37}, 35);
  x.data<float>()[0] = 1.00390625f;  // halfway between two bf16: ties to even (down)
  x.data<float>()[1] = 1.01171875f;  // and up
  x.data<float>()[2] = -0.f;
  x.data<float>()[3] = -std::numeric_limits<float>::infinity();
  x.data<float>()[4] = 3.4e38f;  // rounds past bf16's largest: infinity
  same_bits(x, "bf16");
  same_bits(bf16_of(x), "f32");
}

TEST(LowerPrecision, SpeedWarning) {
  CpuFeatures cpu = *CpuFeatures::named("avx512-bf16");
  const std::map<std::string, double> slow = {{"f32", 230}, {"bf16", 230}}, fast = {{"f32", 230}, {"bf16", 464}};
  std::optional<std::string> w = precision_speed_warning(DType::bf16, cpu, slow);
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, "bf16 will not be faster than f32 on this CPU: its probed bf16 peak is 230 GFLOP/s against f32's 230 (no AMX); "
                "the weights take half the bytes");
  EXPECT_FALSE(precision_speed_warning(DType::bf16, cpu, fast));
  EXPECT_FALSE(precision_speed_warning(DType::bf16, cpu, {})) << "not probed (another target): nothing said";
  // With AVX512-FP16 (and its peak above f32's), the warning points to fp16.
  const std::map<std::string, double> with_f16 = {{"f32", 230}, {"bf16", 110}, {"f16", 460}};
  EXPECT_EQ(precision_speed_warning(DType::bf16, cpu, with_f16).value_or(""),
            "bf16 will not be faster than f32 on this CPU: its probed bf16 peak is 110 GFLOP/s against f32's 230 (no AMX); "
            "the weights take half the bytes");
  CpuFeatures fp16 = cpu;
  fp16.avx512_fp16 = true;
  EXPECT_EQ(precision_speed_warning(DType::bf16, fp16, with_f16).value_or(""),
            "bf16 will not be faster than f32 on this CPU: its probed bf16 peak is 110 GFLOP/s against f32's 230 (no AMX); "
            "the weights take half the bytes; --precision fp16 can be (its probed f16 peak is 460 GFLOP/s)");
  cpu.amx = true;
  EXPECT_FALSE(precision_speed_warning(DType::bf16, cpu, slow)) << "AMX multiplies bf16 tiles";
  EXPECT_FALSE(precision_speed_warning(DType::f16, cpu, fast)) << "a target with AVX512-FP16 multiplies f16";
  EXPECT_FALSE(precision_speed_warning(DType::f32, cpu, slow));
}

// kiln profile holds a node with bf16 weights to the bf16 peak, whichever kernel runs it, and
// the f16 GEMM's nodes to the f16 peak.
TEST(LowerPrecision, ProfileUsesTheBf16Ceiling) {
  EXPECT_EQ(profile::kernel_precision("onednn.conv", {DType::f32, DType::bf16, DType::f32}), "bf16");
  EXPECT_EQ(profile::kernel_precision("kiln.gemm_bf16_avx512", {DType::f32, DType::bf16}), "bf16");
  EXPECT_EQ(profile::kernel_precision("onednn.conv", {DType::f32, DType::f16}), "f32") << "f16 weights are widened";
  EXPECT_EQ(profile::kernel_precision("kiln.gemm_f16_avx512 f16_6x64", {DType::f32, DType::f16}), "f16");
  EXPECT_EQ(profile::kernel_precision("onednn.conv", {DType::f32, DType::f32}), "f32");
}

}  // namespace
}  // namespace kiln
