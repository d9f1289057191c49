// The int8 kernels against the reference kernels: QFusedConv on oneDNN's kernels on odd and
// SIMD-multiple sizes, u8 and s8 activations, per-channel and per-tensor weights, every
// epilogue, both layouts (kiln's own convolution kernels: int8_conv_kernels_test.cc);
// QFusedMatMul's paths (dequantize_output too), QAdd, QMul, QGlobalAveragePool,
// QLayerNormalization, QAttention, LookupTable, Quantize- and DequantizeLinear; max pooling on int8 tensors;
// and the lower_int8 rewrites that make the fused nodes. Int8 outputs must match within one quantization step (the reference divides by
// the scale, the kernels multiply by its inverse).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>

#include "compile/pipeline.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/gemm/woq.h"
#include "runtime/cpu/rows.h"
#include "tests/unit/compile_test_util.h"
#include "tests/unit/int8_test_util.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

TEST(Int8Kernels, QFusedConvShapesGroupsAndLayouts) {
  SKIP_WITHOUT_VNNI();
  for (QConv s : std::vector<QConv>{{1, 3, 11, 9, 5, 3, 2, 1}, {2, 16, 8, 8, 32, 1, 1, 1}, {1, 12, 9, 9, 18, 3, 1, 3},
                                    {1, 17, 9, 7, 17, 3, 1, 17}, {1, 40, 10, 10, 40, 5, 2, 40}, {1, 64, 7, 7, 67, 3, 1, 1}}) {
    for (bool last : {true, false}) {
      s.last = last;
      SCOPED_TRACE(std::to_string(s.c) + "->" + std::to_string(s.m) + " k" + std::to_string(s.k) + " group " +
                   std::to_string(s.group) + (last ? " nhwc" : " nchw"));
      Case c = qconv_case(s);
      c.kernel = "onednn.qconv";  // the 1x1 one is kiln's by default (x's zero point is not 0)
      expect_within_one_step(c, "onednn.qconv");
    }
  }
}

TEST(Int8Kernels, QFusedConvTypesAndEpilogues) {
  SKIP_WITHOUT_VNNI();
  // Pinned to oneDNN's (on AMX kiln's direct kernel takes the u8 ones by default).
  auto expect_within_one_step = [](const Case& c, const std::string& kernel) {
    Case pinned = c;
    pinned.kernel = kernel;
    kiln::expect_within_one_step(pinned, kernel);
  };
  for (DType act : {DType::u8, DType::i8}) {
    for (bool per_channel : {true, false}) {
      QConv s;
      s.c = 24;
      s.m = 19;
      s.act = act;
      s.per_channel = per_channel;
      SCOPED_TRACE(std::string(dtype_name(act)) + (per_channel ? " per channel" : " per tensor"));
      expect_within_one_step(qconv_case(s), "onednn.qconv");
      s.activation = "Relu";
      s.residual = true;
      s.post = "Relu";
      expect_within_one_step(qconv_case(s), "onednn.qconv");
      s.bias = false;
      s.activation = "Clip";
      s.post = "Sigmoid";
      expect_within_one_step(qconv_case(s), "onednn.qconv");
      s.activation = "HardSwish";
      s.residual = false;
      s.post.clear();
      expect_within_one_step(qconv_case(s), "onednn.qconv");
      // SiLU alone: oneDNN writes f32 values, kiln applies the SiLU and quantizes them; also a
      // depthwise one (EfficientNet's) and one over more pixels than a stretch of 4,096 values.
      s.activation = "Silu";
      for (QConv v : {s, QConv{1, 24, 7, 7, 24, 3, 1, 24}, QConv{1, 16, 30, 30, 24, 3, 2, 1}}) {
        v.act = act, v.per_channel = per_channel, v.activation = "Silu";
        SCOPED_TRACE("silu " + std::to_string(v.c) + "->" + std::to_string(v.m) + " group " + std::to_string(v.group));
        Case c = qconv_case(v);
        c.kernel = "onednn.qconv";  // a u8 depthwise one is kiln's by default
        const testing::BothRuns r = testing::run_both(c);
        EXPECT_EQ(r.kernel, "onednn.qconv");
        EXPECT_NE(r.label.find(", kiln silu"), std::string::npos) << r.label;
        ASSERT_EQ(r.fast.size(), 1u);
        EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1);
        const std::vector<double> y = r.ref[0].to_double_vector();
        EXPECT_GT(*std::max_element(y.begin(), y.end()) - *std::min_element(y.begin(), y.end()), 20);
      }
    }
  }
}

// Without VNNI, oneDNN 2.6's int8 convolutions sum pairs of u8 · s8 products in 16 bits
// (`vpmaddubsw`: 255 · 127 · 2 > 32767 saturates) and halve the weights of s8 activations:
// onednn.qconv declines such a CPU (AVX2, or AVX-512 before VNNI), leaving the reference.
TEST(Int8Kernels, OneDnnQConvDeclinesWithoutVnni) {
  for (const char* target : {"avx2", "avx512"}) {
    SCOPED_TRACE(target);
    const CpuFeatures cpu = *CpuFeatures::named(target);
    QConv s;
    s.c = 24;
    s.m = 19;
    const testing::BothRuns r = testing::run_both(qconv_case(s), &cpu);
    EXPECT_EQ(r.kernel, kReferenceKernel);
    const std::pair<std::string, std::string> why{"onednn.qconv", "the CPU lacks avx512-vnni (oneDNN's int8 products would saturate)"};
    EXPECT_NE(std::find(r.declined.begin(), r.declined.end(), why), r.declined.end());
    ASSERT_EQ(r.fast.size(), 1u);
    EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1);
  }
}

// y's zero point (nonzero where no ReLU precedes y: a residual block's downsampling) goes to
// oneDNN as part of the last post-op, not as its destination zero point, which its brgemm
// convolutions decline: they keep the convolution from the older jit kernels (1.2-1.7x the
// time on ResNet-50's downsampling layers), 1x1 and 3x3, stride 1 and 2, within a step.
TEST(Int8Kernels, OneDnnConvKeepsBrgemmWithAnOutputZeroPoint) {
  const CpuFeatures& cpu = CpuFeatures::host();
  if (!cpu.amx) GTEST_SKIP() << "oneDNN 2.6's int8 brgemm convolutions need AMX";
  for (QConv s : std::vector<QConv>{{1, 64, 14, 14, 128, 1, 1, 1}, {1, 64, 14, 14, 128, 1, 2, 1}, {1, 64, 14, 14, 64, 3, 1, 1}}) {
    SCOPED_TRACE("k" + std::to_string(s.k) + " stride " + std::to_string(s.stride));
    Case c = qconv_case(s);
    // x after a ReLU, as every convolution's but a network's first: oneDNN 2.6's brgemm
    // convolutions decline x's zero point too.
    c.inputs[2] = scalar_int(DType::u8, 0);
    c.kernel = "onednn.qconv";
    testing::BothRuns r = testing::run_both(c);
    EXPECT_EQ(r.kernel, "onednn.qconv");
    EXPECT_EQ(r.label.rfind("brgconv", 0), 0u) << r.label;
    ASSERT_EQ(r.fast.size(), 1u);
    EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1) << r.graph_text;
  }
}

TEST(Int8Kernels, QFusedConvDeclinesNonZeroWeightZeroPoints) {
  Case c = qconv_case(QConv{});
  c.inputs[5].data<int8_t>()[0] = 1;
  testing::BothRuns r = testing::run_both(c);
  EXPECT_EQ(r.kernel, "ref");
}

TEST(Int8Kernels, MaxPoolOnInt8) {
  for (DType t : {DType::u8, DType::i8}) {
    for (bool last : {false, true}) {
      std::vector<Attribute> a = {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                                  attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
      if (last) a.push_back(attr("channels_last", int64_t{1}));
      testing::BothRuns r = testing::run_both(Case{"MaxPool", {int8_noise({2, 13, 11, 5}, 9, t)}, {false}, a});
      // Channels-last ones are kiln's (CpuKernels.MaxPoolOnBf16AndCodes), the others oneDNN's.
      const std::optional<cpu::Isa> isa = cpu::best_isa(CpuFeatures::host());
      EXPECT_EQ(r.kernel, last && isa ? "kiln.max_pool_int8_" + std::string(cpu::isa_name(*isa)) : "onednn.pool");
      ASSERT_EQ(r.fast.size(), 1u);
      EXPECT_EQ(max_step(r.fast[0], r.ref[0]), 0);
    }
  }
}

struct QMatMul {
  std::vector<int64_t> a_shape = {37, 45};
  int64_t n = 29;
  DType act = DType::u8;
  DType out = DType::u8;  ///< f32: no y scale
  bool trans = false, per_channel = true, bias = true, residual = false;
  bool dequantize_output = false;  ///< with out u8: Y f32, the u8 result dequantized again
  std::string activation, post;
};

// y_scale of qmatmul_case's output.
float qmatmul_y_scale(const QMatMul& s) { return 0.003f * std::sqrt(static_cast<float>(s.a_shape.back())) * 4 / 64; }

Case qmatmul_case(const QMatMul& s) {
  const int64_t k = s.a_shape.back();
  const bool u8 = s.act == DType::u8;
  Tensor a = int8_noise(s.a_shape, 21, s.act);
  Tensor b = int8_noise(s.trans ? std::vector<int64_t>{s.n, k} : std::vector<int64_t>{k, s.n}, 22, DType::i8);
  Tensor bs(DType::f32, s.per_channel ? std::vector<int64_t>{s.n} : std::vector<int64_t>{});
  for (int64_t i = 0; i < bs.numel(); ++i) bs.data<float>()[i] = 0.002f + 0.0004f * static_cast<float>(i % 5);
  Tensor bz(DType::i8, bs.shape());
  for (int64_t i = 0; i < bz.numel(); ++i) bz.data<int8_t>()[i] = 0;
  const float sa = 1.f / 64, sy = qmatmul_y_scale(s);
  const bool int8_out = s.out != DType::f32;
  std::vector<Tensor> in = {a, scalar_f32(sa), scalar_int(s.act, u8 ? 129 : -2), b, bs, bz,
                            int8_out ? scalar_f32(sy) : Tensor(), int8_out ? scalar_int(s.out, s.out == DType::u8 ? 20 : 3) : Tensor(),
                            s.bias ? noise({s.n}, 23, 0.5f) : Tensor()};
  std::vector<bool> constant(9, true);
  constant[0] = false;
  if (s.residual) {
    std::vector<int64_t> ys = s.a_shape;
    ys.back() = s.n;
    in.push_back(int8_noise(ys, 24, s.act));
    in.push_back(scalar_f32(sy));
    in.push_back(scalar_int(s.act, u8 ? 100 : 7));
    constant.insert(constant.end(), {false, true, true});
  }
  std::vector<Attribute> attrs;
  if (s.trans) attrs.push_back(attr("transB", int64_t{1}));
  if (!s.activation.empty()) attrs.push_back(attr("activation", s.activation));
  if (!s.post.empty()) attrs.push_back(attr("post_activation", s.post));
  if (s.dequantize_output) attrs.push_back(attr("dequantize_output", int64_t{1}));
  return Case{"QFusedMatMul", in, constant, attrs};
}

// A quantized linear layer: every path of the VNNI and AMX kernels (u8 or f32 out in the
// micro-kernel's store with Z and a post activation, s8 out through a second pass; s8 A
// shifted) against the reference, within one quantization step (f32 outputs: within a few ulps
// of the scale).
TEST(Int8Kernels, QFusedMatMulPaths) {
  SKIP_WITHOUT_VNNI();
  std::vector<QMatMul> cases;
  for (DType act : {DType::u8, DType::i8})
    for (DType out : {DType::u8, DType::i8, DType::f32})
      for (bool trans : {false, true}) {
        QMatMul s;
        s.act = act;
        s.out = out;
        s.trans = trans;
        s.per_channel = !trans;
        cases.push_back(s);
        s.activation = "Relu";
        s.residual = out != DType::f32 && act == out;
        s.post = "Gelu";
        s.a_shape = {2, 7, 64};
        s.n = 48;
        cases.push_back(s);
        s.a_shape = {2, 20, 130};  // 40 rows: on an AMX host 32 on the tiles (K's last 2 on VNNI), 8 on VNNI
        s.n = 80;
        cases.push_back(s);
        s.activation = s.post = "";  // the residual alone: the tiles' one-pass store
        cases.push_back(s);
      }
  for (const QMatMul& s : cases) {
    SCOPED_TRACE(std::string(dtype_name(s.act)) + " -> " + std::string(dtype_name(s.out)) + (s.trans ? " transB" : "") +
                 (s.residual ? " residual" : "") + " " + s.activation + "/" + s.post);
    const Case c = qmatmul_case(s);
    if (s.out == DType::f32) {
      EXPECT_EQ(testing::check(c, 1e-5), "kiln.qmatmul_u8s8_avx512");
    } else {
      expect_within_one_step(c, "kiln.qmatmul_u8s8_avx512");
    }
    if (s.out != DType::u8) continue;
    // The same layer with its u8 result dequantized in the store (dequantize_output): f32 values
    // on the u8 grid, within one step of the reference's.
    QMatMul d = s;
    d.dequantize_output = true;
    testing::BothRuns r = testing::run_both(qmatmul_case(d));
    EXPECT_EQ(r.kernel, "kiln.qmatmul_u8s8_avx512");
    ASSERT_EQ(r.fast.size(), 1u);
    ASSERT_EQ(r.ref.size(), 1u);
    ASSERT_EQ(r.fast[0].dtype(), DType::f32);
    const std::vector<double> got = r.fast[0].to_double_vector(), want = r.ref[0].to_double_vector();
    const double step = qmatmul_y_scale(s);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LE(std::abs(got[i] - want[i]), step * 1.0001) << i;
      const double units = got[i] / step;  // (q − 20) on the grid
      ASSERT_NEAR(units, std::nearbyint(units), 1e-3) << i;
    }
    EXPECT_GT(*std::max_element(want.begin(), want.end()) - *std::min_element(want.begin(), want.end()), 20 * step);
  }
}

// The int8 GEMM's block of A's rows (max-autotune's `mc`): the s32 sums do not depend on it, so
// every block size gives the default's output exactly, u8 and f32 out, with a residual; it is
// rounded up to whole 8-row tiles, and a block of no rows is the model's error.
TEST(Int8Kernels, QFusedMatMulRowBlocks) {
  SKIP_WITHOUT_VNNI();
  for (DType out : {DType::u8, DType::f32}) {
    QMatMul s;
    s.a_shape = {3, 31, 70};  // 93 rows: blocks of 8 leave 5
    s.n = 100;
    s.out = out;
    s.residual = out == DType::u8;
    s.activation = "Relu";
    const Case c = qmatmul_case(s);
    const testing::BothRuns base = testing::run_both(c);
    ASSERT_EQ(base.fast.size(), 1u);
    EXPECT_EQ(base.label.rfind("u8s8_8x48_mc", 0), 0u) << base.label;
    for (int64_t mc : {1, 20, 64}) {
      Case pinned = c;
      pinned.kernel = "kiln.qmatmul_u8s8_avx512";
      pinned.kernel_params = {{"mc", mc}};
      const testing::BothRuns r = testing::run_both(pinned);
      ASSERT_EQ(r.fast.size(), 1u) << mc;
      EXPECT_EQ(r.label.rfind("u8s8_8x48_mc" + std::to_string((mc + 7) / 8 * 8), 0), 0u) << r.label;
      EXPECT_EQ(testing::relative_l2(r.fast[0], base.fast[0]), 0.0) << "mc " << mc;
    }
    Case bad = c;
    bad.kernel = "kiln.qmatmul_u8s8_avx512";
    bad.kernel_params = {{"mc", int64_t{0}}};
    std::vector<Tensor> feed;
    const Model model = testing::case_model(bad, feed);
    auto session = Session::create(model, SessionOptions{});
    ASSERT_TRUE(session.ok()) << session.error().message();
    auto refused = (*session)->run(feed);
    ASSERT_FALSE(refused.ok()) << "a block of no rows";
    EXPECT_NE(refused.error().message().find("mc = 0 is not positive"), std::string::npos) << refused.error().message();
  }
}

// A weight-only quantized linear layer: B's codes (s8, u8, s4, u4) per tensor, per output column
// or in blocks along K (one that does not divide K), with and without zero points, B plain and
// transposed, with the whole epilogue: the dequantizing kernel against the reference, f32 out.
struct Woq {
  std::vector<int64_t> a_shape = {3, 100};
  int64_t n = 70;
  DType codes = DType::u4;
  int64_t block = 32;  ///< 0: per column (or per tensor when !per_column)
  bool per_column = true, zero = true, trans = false, epilogue = false;
};

Case woq_case(const Woq& s) {
  const int64_t k = s.a_shape.back();
  const std::vector<int64_t> bshape = s.trans ? std::vector<int64_t>{s.n, k} : std::vector<int64_t>{k, s.n};
  const int lo = s.codes == DType::i8 ? -128 : s.codes == DType::i4 ? -8 : 0;
  const int levels = is_int4(s.codes) ? 16 : 256;
  Tensor b(s.codes, bshape);
  uint32_t r = 7;
  auto next = [&] { return r = r * 1664525u + 1013904223u, static_cast<int>(r >> 8); };
  for (int64_t i = 0; i < b.numel(); ++i) {
    const int v = lo + next() % levels;
    if (is_int4(s.codes)) set_int4(b.raw(), i, v);
    else if (s.codes == DType::u8) b.data<uint8_t>()[i] = static_cast<uint8_t>(v);
    else b.data<int8_t>()[i] = static_cast<int8_t>(v);
  }
  const int64_t k_axis = s.trans ? 1 : 0;
  std::vector<int64_t> pshape;
  if (s.block) {
    pshape = bshape;
    pshape[static_cast<size_t>(k_axis)] = (k + s.block - 1) / s.block;
  } else if (s.per_column) {
    pshape = {s.n};
  }
  Tensor scale(DType::f32, pshape), zero(s.codes, pshape);
  for (int64_t i = 0; i < scale.numel(); ++i) {
    scale.data<float>()[i] = (is_int4(s.codes) ? 0.02f : 0.002f) * (1 + static_cast<float>(next() % 5));
    const int z = lo + next() % levels;
    if (is_int4(s.codes)) set_int4(zero.raw(), i, z);
    else if (s.codes == DType::u8) zero.data<uint8_t>()[i] = static_cast<uint8_t>(z);
    else zero.data<int8_t>()[i] = static_cast<int8_t>(z);
  }
  std::vector<Tensor> in = {noise(s.a_shape, 31), b, scale, s.zero ? zero : Tensor()};
  std::vector<bool> constant = {false, true, true, true};
  std::vector<Attribute> attrs;
  if (s.trans) attrs.push_back(attr("transB", int64_t{1}));
  attrs.push_back(attr("axis", s.block ? k_axis : 1 - k_axis));
  if (s.block) attrs.push_back(attr("block_size", s.block));
  if (s.epilogue) {
    std::vector<int64_t> ys = s.a_shape;
    ys.back() = s.n;
    in.push_back(noise({s.n}, 32, 0.5f));
    in.push_back(noise(ys, 33));
    constant.insert(constant.end(), {true, false});
    attrs.push_back(attr("activation", std::string("Relu")));
    attrs.push_back(attr("post_activation", std::string("Gelu")));
  }
  return Case{"WoqFusedMatMul", in, constant, attrs};
}

TEST(Int8Kernels, WeightOnlyQuantizedLinear) {
  if (auto why = cpu::gemm::woq_lacks(CpuFeatures::host())) GTEST_SKIP() << *why;
  std::vector<Woq> cases;
  for (DType codes : {DType::i8, DType::u8, DType::i4, DType::u4})
    for (bool trans : {false, true}) {
      Woq s;
      s.codes = codes;
      s.trans = trans;
      cases.push_back(s);  // blocks of 32 along K = 100, zero points
      s.block = 0;
      s.zero = false;
      cases.push_back(s);  // per output column, no zero points
      s.per_column = false;
      s.zero = true;
      s.a_shape = {2, 9, 64};
      s.n = 130;
      s.epilogue = true;
      cases.push_back(s);  // per tensor, batched A (M = 18), the whole epilogue
      s.per_column = true;
      s.block = 16;
      s.a_shape = {1, 33};
      s.n = 47;
      cases.push_back(s);  // M = 1 (decode), a short last block
    }
  for (const Woq& s : cases) {
    SCOPED_TRACE(std::string(dtype_name(s.codes)) + (s.trans ? " transB" : "") + " block " + std::to_string(s.block) +
                 (s.per_column ? "" : " per tensor") + (s.zero ? " zero points" : "") + (s.epilogue ? " epilogue" : "") +
                 " M " + std::to_string(shape_numel(s.a_shape) / s.a_shape.back()));
    EXPECT_EQ(testing::check(woq_case(s), 1e-5), "kiln.matmul_woq_avx512");
  }
}

// An empty weight (K = 0): the fast kernel leaves it to the reference, which writes the bias.
TEST(Int8Kernels, WeightOnlyEmptyK) {
  Woq s;
  s.a_shape = {3, 0};
  s.block = 0;
  s.epilogue = true;
  EXPECT_NE(testing::check(woq_case(s), 1e-5), "kiln.matmul_woq_avx512");
}

// A dynamically quantized linear layer: A's scale and zero point computed at run time (graph
// inputs here), an f32 residual, f32 out; and DynamicQuantizeLinear itself, bit-exact.
TEST(Int8Kernels, DynamicallyQuantizedLinear) {
  for (bool trans : {false, true}) {
    if (cpu::gemm::lowp_lacks(CpuFeatures::host(), cpu::gemm::Lowp::u8s8)) break;  // the layer on VNNI
    QMatMul s;
    s.out = DType::f32;
    s.trans = trans;
    s.a_shape = {3, 5, 70};
    s.n = 33;
    s.activation = "Relu";
    Case c = qmatmul_case(s);
    c.constant[1] = c.constant[2] = false;  // run-time scale and zero point
    std::vector<int64_t> ys = s.a_shape;
    ys.back() = s.n;
    c.inputs.push_back(noise(ys, 25));  // an f32 Z
    c.constant.push_back(false);
    SCOPED_TRACE(trans ? "transB" : "B");
    EXPECT_EQ(testing::check(c, 1e-5), "kiln.qmatmul_u8s8_avx512");
  }
  const Tensor x = noise({7, 301}, 26, 6.f);
  for (float shift : {0.f, 4.f, -4.f}) {  // ranges across zero, above it and below it
    Tensor shifted(DType::f32, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) shifted.data<float>()[i] = x.data<float>()[i] + shift;
    testing::BothRuns r = testing::run_both(Case{"DynamicQuantizeLinear", {shifted}, {false}, {}, {true, true, true}});
    EXPECT_EQ(r.kernel, testing::host_kernel("kiln.dynamic_quantize"));
    ASSERT_EQ(r.fast.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r.fast[i].to_double_vector(), r.ref[i].to_double_vector()) << "output " << i;
  }
}

// A quantized residual add, every mix of u8 and s8, with and without Relu.
TEST(Int8Kernels, QAdd) {
  for (DType ta : {DType::u8, DType::i8})
    for (DType tb : {DType::u8, DType::i8})
      for (DType ty : {DType::u8, DType::i8})
        for (bool relu : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(ta)) + " + " + std::string(dtype_name(tb)) + " -> " + std::string(dtype_name(ty)) +
                       (relu ? " relu" : ""));
          std::vector<Attribute> attrs;
          if (relu) attrs.push_back(attr("activation", std::string("Relu")));
          const Case c{"QAdd",
                       {int8_noise({2, 9, 7, 19}, 31, ta), scalar_f32(0.02f), scalar_int(ta, ta == DType::u8 ? 120 : -4),
                        int8_noise({2, 9, 7, 19}, 32, tb), scalar_f32(0.035f), scalar_int(tb, tb == DType::u8 ? 130 : 6),
                        scalar_f32(0.04f), scalar_int(ty, ty == DType::u8 ? (relu ? 0 : 128) : (relu ? -128 : 0))},
                       {false, true, true, false, true, true, true, true},
                       attrs};
          expect_within_one_step(c, testing::host_kernel("kiln.qadd"));
        }
}

// QMul against the reference on each ISA path: channel gates (b [N, 1, 1, C], [1, 1, 1, C] and
// [C]) and b of a's shape, u8 and s8 in and out, channel counts under, at and past a vector,
// one and two threads on tensors that split into pieces, a NaN factor (the zero point).
TEST(Int8Kernels, QMul) {
  struct Gate {
    std::vector<int64_t> a, b;
  };
  for (const Gate& g : {Gate{{2, 5, 7, 19}, {2, 1, 1, 19}}, Gate{{1, 6, 5, 16}, {1, 1, 1, 16}}, Gate{{1, 9, 4, 67}, {67}},
                        Gate{{3, 11, 13}, {3, 11, 13}}, Gate{{1, 40, 40, 96}, {1, 1, 1, 96}}, Gate{{2, 301, 301}, {2, 301, 301}}})
    for (DType ta : {DType::u8, DType::i8})
      for (DType ty : {DType::u8, DType::i8}) {
        SCOPED_TRACE(std::to_string(g.a.back()) + " channels, b of rank " + std::to_string(g.b.size()) + " " +
                     std::string(dtype_name(ta)) + " -> " + std::string(dtype_name(ty)));
        Tensor b = noise(g.b, 35, 2.f);  // factors in [-1, 1): a sigmoid's range and past it
        b.data<float>()[std::min<int64_t>(3, b.numel() - 1)] = std::numeric_limits<float>::quiet_NaN();
        Case c{"QMul",
               {int8_noise(g.a, 34, ta), scalar_f32(0.03f), scalar_int(ta, ta == DType::u8 ? 125 : -3), b, scalar_f32(0.012f),
                scalar_int(ty, ty == DType::u8 ? 127 : 2)},
               {false, true, true, false, true, true}};
        c.threads = 2;
        for (const auto& [isa, cpu] : testing::isa_paths()) {
          SCOPED_TRACE(isa);
          testing::BothRuns r = testing::run_both(c, &cpu);
          EXPECT_EQ(r.kernel, "kiln.qmul_" + isa);
          ASSERT_EQ(r.fast.size(), 1u);
          EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1) << r.graph_text;
          const std::vector<double> v = r.ref[0].to_double_vector();
          EXPECT_GT(*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end()), 100);
          // The NaN factor's values: the zero point.
          const int64_t c_dim = g.b.back(), nan_at = std::min<int64_t>(3, b.numel() - 1);
          const double zy = ty == DType::u8 ? 127 : 2;
          if (g.a == g.b) EXPECT_EQ(r.fast[0].to_double_vector()[static_cast<size_t>(nan_at)], zy);
          else EXPECT_EQ(r.fast[0].to_double_vector()[static_cast<size_t>(nan_at % c_dim)], zy);
        }
      }
  // b broadcast otherwise (a per-pixel scale [N, H, W, 1]): the reference runs it.
  const Case other{"QMul",
                   {int8_noise({1, 4, 4, 8}, 36, DType::u8), scalar_f32(0.03f), scalar_int(DType::u8, 125), noise({1, 4, 4, 1}, 37),
                    scalar_f32(0.012f), scalar_int(DType::u8, 127)},
                   {false, true, true, false, true, true}};
  EXPECT_EQ(testing::run_both(other).kernel, "ref");
}

// QGlobalAveragePool against the reference on each ISA path: u8 and s8 in and out, other
// scales in and out, channel counts under and past a pass of 64, and images whose pixels two
// threads share.
TEST(Int8Kernels, QGlobalAveragePool) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{2, 7, 9, 19}, {1, 5, 5, 131}, {2, 64, 64, 40}, {1, 3, 300}})
    for (DType tx : {DType::u8, DType::i8})
      for (DType ty : {DType::u8, DType::i8}) {
        SCOPED_TRACE(std::to_string(shape[1]) + "x" + std::to_string(shape.back()) + " " + std::string(dtype_name(tx)) + " -> " +
                     std::string(dtype_name(ty)));
        // x's codes biased per channel, so that the means spread over many of y's steps.
        Tensor x = int8_noise(shape, 38, tx);
        for (int64_t i = 0; i < x.numel(); ++i) {
          const int64_t ch = i % shape.back(), v = static_cast<int64_t>(x.as_double(i)) / 4 + (ch * 7) % 90 - 45;
          if (tx == DType::u8) x.data<uint8_t>()[i] = static_cast<uint8_t>(v + 128);
          else x.data<int8_t>()[i] = static_cast<int8_t>(v);
        }
        Case c{"QGlobalAveragePool",
               {x, scalar_f32(0.02f), scalar_int(tx, tx == DType::u8 ? 130 : -1), scalar_f32(0.01f),
                scalar_int(ty, ty == DType::u8 ? 120 : 4)},
               {false, true, true, true, true},
               {attr("channels_last", int64_t{1})}};
        c.threads = 2;
        for (const auto& [isa, cpu] : testing::isa_paths()) {
          SCOPED_TRACE(isa);
          testing::BothRuns r = testing::run_both(c, &cpu);
          EXPECT_EQ(r.kernel, "kiln.qglobal_pool_" + isa);
          ASSERT_EQ(r.fast.size(), 1u);
          EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1) << r.graph_text;
          const std::vector<double> v = r.ref[0].to_double_vector();
          EXPECT_GT(*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end()), 50);
        }
      }
}

// LookupTable on each ISA path: u8 and s8 codes (every code, tails of 1-15, pieces for two
// threads), exactly the reference's entries.
TEST(Int8Kernels, LookupTable) {
  const Tensor table = noise({256}, 39, 8.f);
  for (int64_t n : {int64_t{256}, int64_t{300}, int64_t{1} << 18})
    for (DType t : {DType::u8, DType::i8}) {
      SCOPED_TRACE(std::to_string(n) + " " + std::string(dtype_name(t)));
      Tensor x = int8_noise({n}, 40, t);
      for (int64_t i = 0; i < 256; ++i) {  // every code
        if (t == DType::u8) x.data<uint8_t>()[i] = static_cast<uint8_t>(i);
        else x.data<int8_t>()[i] = static_cast<int8_t>(i - 128);
      }
      Case c{"LookupTable", {x, table}, {false, true}};
      c.threads = 2;
      for (const auto& [isa, cpu] : testing::isa_paths()) {
        SCOPED_TRACE(isa);
        testing::BothRuns r = testing::run_both(c, &cpu);
        EXPECT_EQ(r.kernel, "kiln.lookup_table_" + isa);
        ASSERT_EQ(r.fast.size(), 1u);
        EXPECT_EQ(r.fast[0].to_double_vector(), r.ref[0].to_double_vector());
        EXPECT_EQ(r.fast[0].data<float>()[0], table.data<float>()[0]);  // code 0 (u8) or -128 (s8): the first entry
      }
    }
}

// lower_int8 makes DQ -> Sigmoid (or another elementwise op) -> Reshape -> Transpose one
// LookupTable after the Reshape and Transpose, which move the codes (YOLO's detection head):
// the compiled model's outputs are exactly the quantized model's reference ones, and a u8 and
// an s8 one each.
TEST(Int8Kernels, ElementwiseOpOfCodesLoweredToLookupTable) {
  for (const char* op : {"Sigmoid", "Tanh", "Gelu"})
    for (DType t : {DType::u8, DType::i8}) {
      SCOPED_TRACE(std::string(op) + " " + std::string(dtype_name(t)));
      testing::GraphBuilder b;
      const ValueId x = b.input("x", {1, 4, 5, 12});
      const int zero = t == DType::u8 ? 120 : -6;
      const ValueId xq = b.op("xq", "QuantizeLinear", {x, b.scalar("xs", 0.05f), b.constant("xz", scalar_int(t, zero))});
      const ValueId xd = b.op("xd", "DequantizeLinear", {xq, b.scalar("xs2", 0.05f), b.constant("xz2", scalar_int(t, zero))});
      const ValueId f = b.op("f", op, {xd});
      const ValueId r = b.op("r", "Reshape", {f, b.constant("shape", testing::make<int64_t>({5}, {1, 4, 5, 3, 4}))});
      Model m = b.done({b.op("t", "Transpose", {r}, {attr("perm", std::vector<int64_t>{0, 3, 1, 2, 4})})});
      const std::vector<Tensor> in = {noise({1, 4, 5, 12}, 64, 12.f)};
      const std::vector<Tensor> want = testing::run_reference(m, in);
      CompileOptions options;
      auto report = compile_model(m, options);
      ASSERT_TRUE(report.ok()) << report.error().message();
      std::vector<std::string> ops;
      for (const Node& n : m.graph.nodes) ops.push_back(n.op);
      EXPECT_EQ(ops, (std::vector<std::string>{"QuantizeLinear", "Reshape", "Transpose", "LookupTable"})) << testing::nodes_text(m.graph);
      auto s = Session::create(m);
      ASSERT_TRUE(s.ok()) << s.error().message();
      auto got = (*s)->run(in);
      ASSERT_TRUE(got.ok()) << got.error().message();
      EXPECT_EQ((*got)[0].shape(), want[0].shape());
      EXPECT_EQ((*got)[0].to_double_vector(), want[0].to_double_vector());
    }
}

// Tensors large enough for the kernels to share them among threads, pieces and tails included.
TEST(Int8Kernels, LargeTensorsInPieces) {
  const std::vector<int64_t> shape = {3, 301, 301};  // 271,803 elements: 16 whole pieces and a tail
  const Case q{"QuantizeLinear", {noise(shape, 41, 8.f), scalar_f32(0.03f), scalar_int(DType::u8, 128)}, {false, true, true}};
  testing::BothRuns r = testing::run_both(q);
  ASSERT_EQ(r.fast.size(), 1u);
  EXPECT_EQ(r.kernel, testing::host_kernel("kiln.quantize"));
  EXPECT_EQ(max_step(r.fast[0], r.ref[0]), 0);
  const Case d{"DequantizeLinear", {int8_noise(shape, 42, DType::i8), scalar_f32(0.05f), scalar_int(DType::i8, -3)}, {false, true, true}};
  r = testing::run_both(d);
  ASSERT_EQ(r.fast.size(), 1u);
  EXPECT_EQ(r.fast[0].to_double_vector(), r.ref[0].to_double_vector());
  const Case add{"QAdd",
                 {int8_noise(shape, 43, DType::u8), scalar_f32(0.02f), scalar_int(DType::u8, 120), int8_noise(shape, 44, DType::u8),
                  scalar_f32(0.03f), scalar_int(DType::u8, 110), scalar_f32(0.04f), scalar_int(DType::u8, 0)},
                 {false, true, true, false, true, true, true, true},
                 {attr("activation", std::string("Relu"))}};
  expect_within_one_step(add, testing::host_kernel("kiln.qadd"));
}

// QLayerNormalization against the reference on each ISA path: u8 and s8 in and out, with and
// without B, rows of odd and SIMD-multiple lengths, one of constant codes, and a tensor large
// enough for two threads to share.
TEST(Int8Kernels, QLayerNormalization) {
  struct Shape3 {
    std::vector<int64_t> shape;
    int64_t axis;
  };
  for (const Shape3& sh : {Shape3{{3, 5, 37}, -1}, Shape3{{2, 64, 768}, 2}, Shape3{{4, 3, 16}, 1}})
    for (DType tx : {DType::u8, DType::i8})
      for (DType ty : {DType::u8, DType::i8})
        for (bool bias : {true, false}) {
          SCOPED_TRACE(std::to_string(sh.shape.back()) + " " + std::string(dtype_name(tx)) + " -> " + std::string(dtype_name(ty)) +
                       (bias ? " with B" : ""));
          std::vector<int64_t> norm(sh.shape.begin() + (sh.axis < 0 ? sh.axis + 3 : sh.axis), sh.shape.end());
          Tensor x = int8_noise(sh.shape, 51, tx);
          const int64_t row = shape_numel(norm);
          for (int64_t i = 0; i < row; ++i) std::memcpy(static_cast<std::byte*>(x.raw()) + i, x.raw(), 1);  // the first row constant
          std::vector<Tensor> in = {x, scalar_f32(0.021f), scalar_int(tx, tx == DType::u8 ? 125 : -2), noise(norm, 52, 1.5f),
                                    scalar_f32(0.02f), scalar_int(ty, ty == DType::u8 ? 128 : 0)};
          std::vector<bool> constant = {false, true, true, true, true, true};
          if (bias) {
            in.push_back(noise(norm, 53, 0.5f));
            constant.push_back(true);
          }
          Case c{"QLayerNormalization", in, constant, {attr("axis", sh.axis), attr("epsilon", 1e-5)}};
          c.threads = 2;
          for (const auto& [isa, cpu] : testing::isa_paths()) {
            SCOPED_TRACE(isa);
            testing::BothRuns r = testing::run_both(c, &cpu);
            EXPECT_EQ(r.kernel, "kiln.qnorm_" + isa);
            ASSERT_EQ(r.fast.size(), 1u);
            ASSERT_EQ(r.ref.size(), 1u);
            EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1) << r.graph_text;
            const std::vector<double> v = r.ref[0].to_double_vector();
            EXPECT_GT(*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end()), 20);
          }
        }
}

// QAttention's codes: Q, K, V (each with its scale and zero point), then the mask (or none),
// then y's scale and zero point when `y` is an int8 type.
std::vector<Tensor> qattention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, DType y) {
  std::vector<Tensor> in = {q, scalar_f32(0.05f), scalar_int(q.dtype(), q.dtype() == DType::u8 ? 131 : -3),
                            k, scalar_f32(0.04f), scalar_int(k.dtype(), k.dtype() == DType::u8 ? 120 : 5),
                            v, scalar_f32(0.02f), scalar_int(v.dtype(), v.dtype() == DType::u8 ? 127 : 0), mask};
  if (y != DType::f32) in.insert(in.end(), {scalar_f32(0.015f), scalar_int(y, y == DType::u8 ? 128 : 0)});
  return in;
}

// QAttention's AMX kernel against the reference (Attention of the dequantized codes): Q·Kᵀ on
// the codes less their zero points is exact, P·V within 2^-16 of each probability, so an f32 Y
// matches within 1e-5 and a quantized one within a step. u8 and s8 codes; a head of 80 steps
// (tiles of 32: padded to 96) and values of 48; 37 query rows (a pair of row tiles, then one),
// 45 keys (padded to 64); grouped-query heads; causal; an additive mask per head and a bool one
// with a whole row out (NaN, as the reference); 3-D heads over 600 keys, in blocks of 256 whose
// later ones raise the maximum, with Y quantized; two threads over KV heads that share evenly
// and that do not. A head past 256 steps (its sums would outgrow f32's integers) and a CPU
// without AMX: the reference kernel.
TEST(Int8Kernels, QAttentionOnAmx) {
  const bool amx = CpuFeatures::host().amx;
  const std::string name = amx ? "kiln.qattention_amx" : std::string(kReferenceKernel);
  auto run = [&](const std::vector<Tensor>& in, std::vector<Attribute> attrs, int threads = 1) {
    Case c{"QAttention", in, std::vector<bool>(in.size(), false), std::move(attrs)};
    for (size_t i : {1, 2, 4, 5, 7, 8, 10, 11})
      if (i < in.size()) c.constant[i] = true;
    c.threads = threads;
    testing::BothRuns r = testing::run_both(c);
    EXPECT_EQ(r.kernel, name);
    if (r.fast.size() != 1 || r.ref.size() != 1) {
      ADD_FAILURE() << "no outputs";
      return;
    }
    if (r.ref[0].dtype() == DType::f32) {
      EXPECT_LE(testing::relative_l2(r.fast[0], r.ref[0]), 1e-5) << r.graph_text;
    } else {
      EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1) << r.graph_text;
      const std::vector<double> y = r.ref[0].to_double_vector();
      EXPECT_GT(*std::max_element(y.begin(), y.end()) - *std::min_element(y.begin(), y.end()), 30);
    }
  };
  const auto causal = attr("is_causal", int64_t{1});
  for (DType t : {DType::u8, DType::i8}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor q = int8_noise({2, 4, 37, 80}, 81, t), k = int8_noise({2, 2, 45, 80}, 82, t), v = int8_noise({2, 2, 45, 48}, 83, t);
    run(qattention_inputs(q, k, v, Tensor(), DType::f32), {});
    run(qattention_inputs(q, k, v, noise({4, 1, 45}, 84, 8.f), DType::f32), {causal});
    Tensor keep(DType::boolean, {1, 1, 37, 45});
    for (int64_t i = 0; i < keep.numel(); ++i) keep.data<bool>()[i] = (i / 45) % 7 != 3 && (i * 13) % 11 != 0;
    run(qattention_inputs(q, k, v, keep, DType::f32), {});
    const Tensor lq = int8_noise({1, 200, 2 * 64}, 85, t), lk = int8_noise({1, 600, 64}, 86, t), lv = int8_noise({1, 600, 64}, 87, t);
    const std::vector<Attribute> heads = {attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{1})};
    run(qattention_inputs(lq, lk, lv, Tensor(), t), heads);
    std::vector<Attribute> causal_heads = heads;
    causal_heads.push_back(causal);
    run(qattention_inputs(lq, lk, lv, Tensor(), DType::f32), causal_heads);
  }
  for (int64_t kv : {1, 3, 6}) {
    SCOPED_TRACE("two threads, kv heads " + std::to_string(kv));
    const Tensor q = int8_noise({1, 6, 70, 32}, 88, DType::u8), k = int8_noise({1, kv, 300, 32}, 89, DType::u8);
    run(qattention_inputs(q, k, int8_noise({1, kv, 300, 16}, 90, DType::u8), Tensor(), DType::u8), {}, 2);
  }
  const Tensor big = int8_noise({1, 1, 4, 272}, 91, DType::u8);
  Case c{"QAttention", qattention_inputs(big, big, int8_noise({1, 1, 4, 16}, 92, DType::u8), Tensor(), DType::f32), {}, {}};
  EXPECT_EQ(testing::check(c, 1e-5), kReferenceKernel);
}

// Compiles m at two threads for this CPU, told it has AMX or not (QAttention's lowering needs it).
void compile_for_amx(Model& m, bool amx) {
  CompileOptions options;
  options.target.cpu = CpuFeatures::host();
  options.target.cpu.amx = amx;
  options.target.threads = 2;
  auto report = compile_model(m, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
}

// On a target with AMX, lower_int8 makes DQ(q), DQ(k), DQ(v) -> Attention -> Q one QAttention
// reading the codes and writing y's (the Q absorbed), and an attention whose output stays float
// a QAttention with an f32 Y; without AMX both stay f32 Attentions. The compiled model computes
// what the quantized one's reference does.
TEST(Int8Kernels, AttentionBetweenQdqLowered) {
  auto build = [] {
    testing::GraphBuilder b;
    auto qdq = [&](const std::string& name, ValueId x, float scale, int zero) {
      const ValueId q = b.op(name + "_q", "QuantizeLinear", {x, b.scalar(name + "_s", scale), b.constant(name + "_z", scalar_int(DType::u8, zero))});
      return b.op(name + "_dq", "DequantizeLinear", {q, b.scalar(name + "_s2", scale), b.constant(name + "_z2", scalar_int(DType::u8, zero))});
    };
    const ValueId q = qdq("q", b.input("q", {1, 40, 2 * 64}), 0.05f, 128), k = qdq("k", b.input("k", {1, 70, 2 * 64}), 0.04f, 125);
    const ValueId v = qdq("v", b.input("v", {1, 70, 2 * 32}), 0.03f, 130);
    const std::vector<Attribute> heads = {attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{2})};
    const ValueId a = b.op("att", "Attention", {q, k, v}, heads);
    std::vector<Attribute> causal = heads;
    causal.push_back(attr("is_causal", int64_t{1}));
    const ValueId a2 = b.op("att_f32", "Attention", {q, k, v}, causal);
    return b.done({qdq("y", a, 0.02f, 128), a2});
  };
  const std::vector<Tensor> in = {noise({1, 40, 128}, 93, 6.f), noise({1, 70, 128}, 94, 6.f), noise({1, 70, 64}, 95, 3.f)};
  const std::vector<Tensor> want = testing::run_reference(build(), in);
  for (bool amx : {true, false}) {
    SCOPED_TRACE(amx ? "AMX target" : "no AMX");
    Model m = build();
    ASSERT_NO_FATAL_FAILURE(compile_for_amx(m, amx));
    std::map<std::string, std::string> op_of;
    for (const Node& n : m.graph.nodes) op_of[n.name] = n.op;
    EXPECT_EQ(op_of["att"], amx ? "QAttention" : "Attention") << testing::nodes_text(m.graph);
    EXPECT_EQ(op_of["att_f32"], amx ? "QAttention" : "Attention") << testing::nodes_text(m.graph);
    EXPECT_EQ(op_of.count("y_q"), amx ? 0u : 1u) << "the output's QuantizeLinear absorbed";
    if (amx) {
      const Node& att = *std::find_if(m.graph.nodes.begin(), m.graph.nodes.end(), [](const Node& n) { return n.name == "att"; });
      EXPECT_EQ(m.graph.value(att.outputs[0]).dtype, DType::u8);
      for (size_t i : {0, 3, 6}) EXPECT_EQ(m.graph.value(att.inputs[i]).dtype, DType::u8) << "input " << i << " reads the codes";
    }
    if (amx != CpuFeatures::host().amx) continue;  // the compiled model runs here
    auto session = Session::create(m);
    ASSERT_TRUE(session.ok()) << session.error().message();
    auto got = (*session)->run(in);
    ASSERT_TRUE(got.ok()) << got.error().message();
    ASSERT_EQ(got->size(), 2u);
    ASSERT_EQ((*got)[0].shape(), want[0].shape());
    const std::vector<double> g = (*got)[0].to_double_vector(), w = want[0].to_double_vector();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(std::abs(g[i] - w[i]), 0.02 * 1.001) << i;  // one step of y's scale
    EXPECT_LE(testing::relative_l2((*got)[1], want[1]), 1e-5);
  }
}

// GPT-2's attention reads Q, K and V split from one projection's output (c_attn):
// Split(Reshape(DQ(qkv))). On AMX the codes are reshaped and split instead and QAttention takes
// the pieces; where something else reads a piece, the attention stays f32.
TEST(Int8Kernels, SplitQkvAttentionLowered) {
  auto build = [](bool shared) {
    testing::GraphBuilder b;
    const ValueId x = b.input("qkv", {40, 3 * 128});
    const ValueId xq = b.op("qkv_q", "QuantizeLinear", {x, b.scalar("qkv_s", 0.05f), b.constant("qkv_z", scalar_int(DType::u8, 124))});
    const ValueId xd = b.op("qkv_dq", "DequantizeLinear", {xq, b.scalar("qkv_s2", 0.05f), b.constant("qkv_z2", scalar_int(DType::u8, 124))});
    const ValueId r = b.op("heads", "Reshape", {xd, b.constant("shape", testing::make<int64_t>({3}, {1, 40, 3 * 128}))});
    const std::vector<ValueId> qkv =
        b.ops("split", "Split", {r, b.constant("sizes", testing::make<int64_t>({3}, {128, 128, 128}))}, 3, {attr("axis", int64_t{2})});
    const ValueId a = b.op("att", "Attention", {qkv[0], qkv[1], qkv[2]}, {attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{2})});
    const ValueId yq = b.op("y_q", "QuantizeLinear", {a, b.scalar("y_s", 0.02f), b.constant("y_z", scalar_int(DType::u8, 128))});
    const ValueId y = b.op("y_dq", "DequantizeLinear", {yq, b.scalar("y_s2", 0.02f), b.constant("y_z2", scalar_int(DType::u8, 128))});
    if (!shared) return b.done({y});
    return b.done({y, b.op("k_relu", "Relu", {qkv[1]})});
  };
  const std::vector<Tensor> in = {noise({40, 3 * 128}, 96, 6.f)};
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "K read elsewhere too" : "Q, K and V read by the attention alone");
    const std::vector<Tensor> want = testing::run_reference(build(shared), in);
    for (bool amx : {true, false}) {
      SCOPED_TRACE(amx ? "AMX target" : "no AMX");
      Model m = build(shared);
      ASSERT_NO_FATAL_FAILURE(compile_for_amx(m, amx));
      const bool lowered = amx && !shared;
      std::map<std::string, const Node*> by_name;
      for (const Node& n : m.graph.nodes) by_name[n.name] = &n;
      ASSERT_TRUE(by_name.count("att"));
      EXPECT_EQ(by_name["att"]->op, lowered ? "QAttention" : "Attention") << testing::nodes_text(m.graph);
      EXPECT_EQ(by_name.count("split_int8"), lowered ? 1u : 0u) << testing::nodes_text(m.graph);
      EXPECT_EQ(by_name.count("split"), lowered ? 0u : 1u) << testing::nodes_text(m.graph);
      if (lowered) {
        const Node& att = *by_name["att"];
        EXPECT_EQ(by_name["split_int8"]->outputs, (std::vector<ValueId>{att.inputs[0], att.inputs[3], att.inputs[6]}));
        for (size_t i : {0, 3, 6}) EXPECT_EQ(m.graph.value(att.inputs[i]).dtype, DType::u8) << "input " << i << " reads the codes";
        EXPECT_EQ(m.graph.value(att.outputs[0]).dtype, DType::u8);
      }
      if (amx != CpuFeatures::host().amx) continue;  // the compiled model runs here
      auto session = Session::create(m);
      ASSERT_TRUE(session.ok()) << session.error().message();
      auto got = (*session)->run(in);
      ASSERT_TRUE(got.ok()) << got.error().message();
      ASSERT_EQ(got->size(), want.size());
      const std::vector<double> g = (*got)[0].to_double_vector(), w = want[0].to_double_vector();
      ASSERT_EQ(g.size(), w.size());
      for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(std::abs(g[i] - w[i]), 0.02 * 1.001) << i;  // one step of y's scale
    }
  }
}

// compile's lower_int8 makes DQ -> LayerNormalization -> Q one QLayerNormalization, which
// computes what the three nodes' kernels did, within one quantization step; also where the
// rows' count is symbolic (a transformer compiled without --input-shape).
TEST(Int8Kernels, LayerNormBetweenQdqLowered) {
  for (bool symbolic : {false, true}) {
    SCOPED_TRACE(symbolic ? "batch x sequence x 48" : "2x9x48");
    testing::GraphBuilder b;
    const ValueId x = symbolic ? b.input("x", Shape({Dim::sym("batch"), Dim::sym("sequence"), Dim::known(48)}))
                               : b.input("x", {2, 9, 48});
    const ValueId xq = b.op("xq", "QuantizeLinear", {x, b.scalar("xs", 0.03f), b.constant("xz", scalar_int(DType::u8, 120))});
    const ValueId xd = b.op("xd", "DequantizeLinear", {xq, b.scalar("xs2", 0.03f), b.constant("xz2", scalar_int(DType::u8, 120))});
    const ValueId ln = b.op("ln", "LayerNormalization", {xd, b.constant("g", noise({48}, 61, 1.5f)), b.constant("beta", noise({48}, 62))},
                            {attr("axis", int64_t{-1}), attr("epsilon", 1e-5)});
    const ValueId yq = b.op("yq", "QuantizeLinear", {ln, b.scalar("ys", 0.025f), b.constant("yz", scalar_int(DType::i8, 3))});
    const ValueId y = b.op("yd", "DequantizeLinear", {yq, b.scalar("ys2", 0.025f), b.constant("yz2", scalar_int(DType::i8, 3))});
    Model m = b.done({y});
    const std::vector<Tensor> in = {noise({2, 9, 48}, 63, 6.f)};
    auto unfused = Session::create(m);
    ASSERT_TRUE(unfused.ok()) << unfused.error().message();
    auto want = (*unfused)->run(in);
    ASSERT_TRUE(want.ok()) << want.error().message();
    CompileOptions options;
    options.target.threads = 2;
    auto report = compile_model(m, options);
    ASSERT_TRUE(report.ok()) << report.error().message();
    std::vector<std::string> ops;
    for (const Node& n : m.graph.nodes) ops.push_back(n.op);
    EXPECT_EQ(ops, (std::vector<std::string>{"QuantizeLinear", "QLayerNormalization", "DequantizeLinear"})) << testing::nodes_text(m.graph);
    auto fused = Session::create(m);
    ASSERT_TRUE(fused.ok()) << fused.error().message();
    auto got = (*fused)->run(in);
    ASSERT_TRUE(got.ok()) << got.error().message();
    ASSERT_EQ(got->size(), 1u);
    const std::vector<double> g = (*got)[0].to_double_vector(), w = (*want)[0].to_double_vector();
    ASSERT_EQ(g.size(), w.size());
    size_t same = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_LE(std::abs(g[i] - w[i]), 0.025 * 1.001) << i;  // one step of y's scale
      same += g[i] == w[i];
    }
    EXPECT_GT(same, g.size() * 95 / 100);
  }
}

// lower_int8 lets a linear layer dequantize its own u8 output where only a DequantizeLinear of
// the same parameters reads it (before float ops, or a graph output), and not where an int8 op
// reads the u8 too; the compiled model runs as the quantized one's reference does.
TEST(Int8Kernels, LinearDequantizesItsOutputForFloatReaders) {
  testing::GraphBuilder b;
  auto q = [&](const std::string& name, ValueId v, float scale, int zero) {
    return b.op(name, "QuantizeLinear", {v, b.scalar(name + "_s", scale), b.constant(name + "_z", scalar_int(DType::u8, zero))});
  };
  auto dq = [&](const std::string& name, ValueId v, float scale, int zero) {
    return b.op(name, "DequantizeLinear", {v, b.scalar(name + "_s", scale), b.constant(name + "_z", scalar_int(DType::u8, zero))});
  };
  auto linear = [&](const std::string& name, ValueId x, int64_t k, int64_t n, uint32_t seed) {
    const ValueId w = b.op(name + "_w", "DequantizeLinear",
                           {b.constant(name + "_q", int8_noise({k, n}, seed, DType::i8)), b.scalar(name + "_ws", 0.004f),
                            b.constant(name + "_wz", scalar_int(DType::i8, 0))});
    return b.op(name, "MatMul", {x, w});
  };
  const ValueId x = b.input("x", {20, 64});
  const ValueId xd = dq("xd", q("xq", x, 0.02f, 128), 0.02f, 128);
  const ValueId a = dq("ad", q("aq", linear("mm1", xd, 64, 48, 71), 0.03f, 120), 0.03f, 120);
  const ValueId out_a = b.op("sm1", "Softmax", {a});
  const ValueId c = dq("cd", q("cq", linear("mm2", xd, 64, 48, 72), 0.03f, 125), 0.03f, 125);
  const ValueId out_b = b.op("sm2", "Softmax", {c});
  const ValueId out_c = dq("ed", q("eq", linear("mm3", c, 48, 32, 73), 0.05f, 110), 0.05f, 110);
  Model m = b.done({out_a, out_b, out_c});
  const std::vector<Tensor> in = {noise({20, 64}, 74, 4.f)};
  const std::vector<Tensor> want = testing::run_reference(m, in);
  CompileOptions options;
  options.target.cpu = testing::int8_target();
  options.target.threads = 2;
  auto report = compile_model(m, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
  std::map<std::string, int64_t> dequantized;
  size_t dqs = 0;
  for (const Node& n : m.graph.nodes) {
    if (n.op == "QFusedMatMul") dequantized[n.name] = n.attr_int("dequantize_output", 0);
    dqs += n.op == "DequantizeLinear";
  }
  // mm2's u8 output is mm3's input too: it keeps the DQ that sm2 reads.
  EXPECT_EQ(dequantized, (std::map<std::string, int64_t>{{"mm1", 1}, {"mm2", 0}, {"mm3", 1}})) << testing::nodes_text(m.graph);
  EXPECT_EQ(dqs, 1u) << testing::nodes_text(m.graph);
  if (!testing::runs_here(m)) return;
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto got = (*s)->run(in);
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_EQ(got->size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_LE(testing::relative_l2((*got)[i], want[i]), 1e-2) << i;
}

// On a target without int8 products (AVX2, AVX-512 without VNNI) lower_int8 leaves a
// convolution of dequantized codes f32 and marks it int8_operands: its sums stay direct, as the
// reference's, so the QuantizeLinear after it rounds them alike. Winograd's transforms (kiln's,
// and oneDNN's with AVX-512) would round the products and flip codes: a ResNet with QDQ whose
// 16-channel 3x3 layers went to kiln's F(4x4) read 0.9 % relative L2 off its reference.
TEST(Int8Kernels, ConvOfCodesKeptF32KeepsDirectSums) {
  testing::GraphBuilder b;
  const ValueId x = b.input("x", {1, 32, 20, 20});
  const ValueId xq = b.op("xq", "QuantizeLinear", {x, b.scalar("xq_s", 0.02f), b.constant("xq_z", scalar_int(DType::u8, 128))});
  const ValueId xd = b.op("xd", "DequantizeLinear", {xq, b.scalar("xd_s", 0.02f), b.constant("xd_z", scalar_int(DType::u8, 128))});
  const ValueId w = b.op("wd", "DequantizeLinear",
                         {b.constant("wq", int8_noise({32, 32, 3, 3}, 81, DType::i8)), b.scalar("wd_s", 0.003f),
                          b.constant("wd_z", scalar_int(DType::i8, 0))});
  const ValueId y = b.op("conv", "Conv", {xd, w, b.constant("bias", noise({32}, 82, 0.2f))},
                         {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  const ValueId yq = b.op("yq", "QuantizeLinear", {y, b.scalar("yq_s", 0.01f), b.constant("yq_z", scalar_int(DType::u8, 120))});
  const ValueId out = b.op("yd", "DequantizeLinear", {yq, b.scalar("yd_s", 0.01f), b.constant("yd_z", scalar_int(DType::u8, 120))});
  const Model quantized = b.done({out});
  for (const char* target : {"avx2", "avx512"}) {
    SCOPED_TRACE(target);
    Model m = quantized;
    CompileOptions options;
    options.target.cpu = *CpuFeatures::named(target);
    options.target.threads = 1;
    auto report = compile_model(m, options);
    ASSERT_TRUE(report.ok()) << report.error().message();
    const Node* conv = nullptr;
    for (const Node& n : m.graph.nodes)
      if (n.op == "FusedConv") conv = &n;
    ASSERT_NE(conv, nullptr) << testing::nodes_text(m.graph);
    EXPECT_EQ(conv->attr_int("int8_operands", 0), 1) << testing::nodes_text(m.graph);
    EXPECT_EQ(conv->kernel.name, "onednn.conv") << testing::nodes_text(m.graph);
    const std::string* algorithm = conv->kernel.param<std::string>("algorithm");
    EXPECT_TRUE(algorithm && *algorithm == "direct") << testing::nodes_text(m.graph);
    if (testing::runs_here(m)) {
      const std::vector<Tensor> in = {noise({1, 32, 20, 20}, 83, 2.f)};
      const std::vector<Tensor> want = testing::run_reference(m, in);
      auto s = Session::create(m);
      ASSERT_TRUE(s.ok()) << s.error().message();
      auto got = (*s)->run(in);
      ASSERT_TRUE(got.ok()) << got.error().message();
      EXPECT_LE(testing::relative_l2((*got)[0], want[0]), 1e-4);
    }
    // Anything but 0 or 1 is refused.
    for (Node& n : m.graph.nodes)
      if (n.op == "FusedConv") n.set_attr("int8_operands", int64_t{2});
    EXPECT_FALSE(verify_model(m).ok());
  }
  // The same convolution unmarked (an f32 model's) goes to kiln's Winograd on AVX2: the mark is
  // what keeps it off.
  testing::Case c{"FusedConv", {noise({1, 20, 20, 32}, 84), noise({32, 32, 3, 3}, 85, 0.3f)}, {false, true},
                  {attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("channels_last", int64_t{1})}};
  const CpuFeatures avx2 = *CpuFeatures::named("avx2");
  EXPECT_EQ(testing::check(c, 1e-5, &avx2), "kiln.winograd_f32_avx2");
  c.attrs.push_back(attr("int8_operands", int64_t{1}));
  EXPECT_EQ(testing::check(c, 1e-5, &avx2), "onednn.conv");
}

// A hostile model: a quantized op without a parameter it needs (the weight's scale here) is
// refused before any kernel sees it (the op's required inputs), a user error naming it.
TEST(Int8Kernels, MissingParametersAreUserErrors) {
  for (const char* op : {"QFusedConv", "QFusedMatMul"}) {
    const bool conv = std::string(op) == "QFusedConv";
    Graph g;
    const ValueId x = g.add_value("x", DType::u8, Shape::of(conv ? std::vector<int64_t>{1, 4, 5, 5} : std::vector<int64_t>{3, 4}));
    g.inputs.push_back(x);
    Node n;
    n.name = "q";
    n.op = op;
    Tensor w(DType::i8, conv ? std::vector<int64_t>{2, 4, 1, 1} : std::vector<int64_t>{4, 2});
    n.inputs = {x, g.add_constant("s", scalar_f32(0.1f)), g.add_constant("z", scalar_int(DType::u8, 0)), g.add_constant("w", w),
                kNoValue, g.add_constant("wz", scalar_int(DType::i8, 0)), g.add_constant("ys", scalar_f32(0.2f)),
                g.add_constant("yz", scalar_int(DType::u8, 0)), g.add_constant("b", noise({2}, 1))};
    const ValueId y = g.add_value("y", DType::undefined);
    n.outputs = {y};
    g.outputs.push_back(y);
    g.add_node(std::move(n));
    auto r = infer_graph(g);
    ASSERT_FALSE(r.ok()) << op;
    EXPECT_EQ(r.error().kind, ErrorKind::user) << op;
    EXPECT_NE(r.error().what.find("required input 4 of " + std::string(op) + " is missing"), std::string::npos)
        << op << ": " << r.error().what;
  }
}

// The quantize kernel multiplies by 1 / scale and corrects the quotient once (rows.inc): every
// value next to a rounding boundary (k + 1/2) · scale, over scales of many binades, rounds as
// the reference's division does.
TEST(Int8Kernels, QuantizeRoundsAsTheDivisionAtEveryBoundary) {
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int t = 0; t < 60; ++t) {
    const float scale = std::ldexp(1.f + static_cast<float>(next() >> 9) / 8388608.f, static_cast<int>(next() % 100) - 60);
    std::vector<float> xs;
    for (int k = -140; k <= 140; ++k) {
      const float mid = static_cast<float>((k + 0.5) * static_cast<double>(scale));
      float lo = mid, hi = mid;
      xs.push_back(mid);
      for (int u = 0; u < 6; ++u) {
        lo = std::nextafter(lo, -INFINITY);
        hi = std::nextafter(hi, INFINITY);
        xs.push_back(lo);
        xs.push_back(hi);
      }
    }
    const Tensor x = testing::make<float>({static_cast<int64_t>(xs.size())}, xs);
    for (DType ty : {DType::u8, DType::i8}) {
      SCOPED_TRACE("scale " + std::to_string(scale) + " " + std::string(dtype_name(ty)));
      const Case q{"QuantizeLinear", {x, scalar_f32(scale), scalar_int(ty, ty == DType::u8 ? 127 : -1)}, {false, true, true}};
      testing::BothRuns r = testing::run_both(q);
      EXPECT_EQ(r.kernel, testing::host_kernel("kiln.quantize"));
      ASSERT_EQ(r.fast.size(), 1u);
      EXPECT_EQ(r.fast[0].to_double_vector(), r.ref[0].to_double_vector());
    }
  }
}

// Where the int8 region starts and ends: bit-exact with the reference, ties, NaN, infinities
// and values far out of range included.
TEST(Int8Kernels, QuantizeAndDequantizePerTensor) {
  Tensor x = noise({3, 1001}, 11, 12.f);
  const float special[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), std::nanf(""), 0.f, -0.f, 126.5f, 127.5f};
  for (size_t i = 0; i < std::size(special); ++i) x.data<float>()[i * 7] = special[i];
  for (DType t : {DType::u8, DType::i8}) {
    for (float scale : {1.f, 0.037f, 3e-5f}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " scale " + std::to_string(scale));
      const Case q{"QuantizeLinear", {x, scalar_f32(scale), scalar_int(t, t == DType::u8 ? 128 : -7)}, {false, true, true}};
      testing::BothRuns r = testing::run_both(q);
      EXPECT_EQ(r.kernel, testing::host_kernel("kiln.quantize"));
      ASSERT_EQ(r.fast.size(), 1u);
      EXPECT_EQ(max_step(r.fast[0], r.ref[0]), 0);
      const Case d{"DequantizeLinear", {int8_noise({5, 333}, 12, t), scalar_f32(scale), scalar_int(t, t == DType::u8 ? 3 : -100)},
                   {false, true, true}};
      r = testing::run_both(d);
      EXPECT_EQ(r.kernel, testing::host_kernel("kiln.dequantize"));
      ASSERT_EQ(r.fast.size(), 1u);
      EXPECT_EQ(r.fast[0].to_double_vector(), r.ref[0].to_double_vector());
    }
  }
}

}  // namespace
}  // namespace kiln
