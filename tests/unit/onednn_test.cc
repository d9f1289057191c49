// The oneDNN provider against the reference kernels: every op it takes, on odd and
// SIMD-multiple sizes, with the fused epilogues; and what it declines.
#include <gtest/gtest.h>

#include "formats/infer.h"
#include "runtime/compare.h"
#include "runtime/onednn/onednn.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::check;
using testing::Case;
using testing::noise;

// The default kernels less kiln's Winograd, which the default rule prefers for channels-last 3x3
// stride-1 convolutions of 16 channels or more on AVX2 (CpuKernels.WinogradConv): oneDNN's
// convolution on them, for the tests of what it does.
const KernelRegistry& without_kiln_winograd() {
  static const KernelRegistry r = default_kernels().without({"kiln.winograd_f32_avx512", "kiln.winograd_f32_avx2"});
  return r;
}

std::vector<Attribute> conv_attrs(std::vector<int64_t> pads, std::vector<int64_t> strides, std::vector<int64_t> dil, int64_t group) {
  return {attr("pads", pads), attr("strides", strides), attr("dilations", dil), attr("group", group)};
}

TEST(OneDnn, Conv2dShapesGroupsAndEpilogues) {
  struct Shape2 { int64_t n, c, h, w, m, k, group; };
  // (Depthwise convolutions go to kiln's own kernel first: cpu_kernels_test.cc.)
  for (const Shape2& s : std::vector<Shape2>{{1, 3, 7, 9, 5, 3, 1}, {2, 16, 16, 16, 32, 3, 1}, {1, 32, 8, 8, 32, 1, 1},
                                            {1, 12, 9, 9, 18, 3, 3}, {1, 8, 9, 9, 16, 3, 8}}) {
    SCOPED_TRACE(std::to_string(s.c) + "->" + std::to_string(s.m) + " group " + std::to_string(s.group));
    Tensor x = noise({s.n, s.c, s.h, s.w}, 1), w = noise({s.m, s.c / s.group, s.k, s.k}, 2, 0.3f), b = noise({s.m}, 3);
    const int64_t p = s.k / 2;
    EXPECT_EQ(check({"Conv", {x, w, b}, {false, true, true}, conv_attrs({p, p, p, p}, {1, 1}, {1, 1}, s.group)}), "onednn.conv");
    EXPECT_EQ(check({"Conv", {x, w}, {false, true}, conv_attrs({0, 1, 1, 0}, {2, 2}, {1, 1}, s.group)}), "onednn.conv");
    if (s.k == 3) {
      EXPECT_EQ(check({"Conv", {x, w, b}, {false, true, false}, conv_attrs({2, 2, 2, 2}, {1, 1}, {2, 2}, s.group)}), "onednn.conv");
    }
    // Fused: bias, Relu, residual, Silu; and HardSigmoid (two post-ops) alone.
    const int64_t oh = s.h, ow = s.w;
    Tensor z = noise({s.n, s.m, oh, ow}, 4);
    std::vector<Attribute> fa = conv_attrs({p, p, p, p}, {1, 1}, {1, 1}, s.group);
    fa.push_back(attr("activation", std::string("Relu")));
    fa.push_back(attr("post_activation", std::string("Silu")));
    EXPECT_EQ(check({"FusedConv", {x, w, b, z}, {false, true, true, false}, fa}), "onednn.conv");
    std::vector<Attribute> hs = conv_attrs({p, p, p, p}, {1, 1}, {1, 1}, s.group);
    hs.push_back(attr("activation", std::string("HardSigmoid")));
    hs.push_back(attr("activation_params", std::vector<double>{0.2, 0.5}));
    EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, hs}), "onednn.conv");
  }
}

TEST(OneDnn, EveryActivation) {
  Tensor x = noise({1, 8, 6, 6}, 5, 4.f), w = noise({8, 8, 3, 3}, 6, 0.3f);
  for (const char* act : {"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "GeluTanh", "Silu"}) {
    std::vector<Attribute> a = conv_attrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1);
    a.push_back(attr("activation", std::string(act)));
    if (std::string(act) == "LeakyRelu") a.push_back(attr("activation_params", std::vector<double>{0.1}));
    if (std::string(act) == "Clip") a.push_back(attr("activation_params", std::vector<double>{-1, 2}));
    if (std::string(act) == "HardSigmoid") a.push_back(attr("activation_params", std::vector<double>{0.3, 0.4}));
    EXPECT_EQ(check({"FusedConv", {x, w}, {false, true}, a}), "onednn.conv") << act;
  }
}

// A channels-last 3x3 with SiLU and a residual (YOLO's bottlenecks): oneDNN 2.6's AVX2 JIT
// kernels lack the swish-then-sum post-ops and it offered its reference convolution (145 ms of
// YOLO's 171 at one thread), so the kernel runs the bare JIT one and kiln's epilogue after it.
TEST(OneDnn, ChannelsLastEpilogueOffTheReference) {
  std::vector<Attribute> a = conv_attrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1);
  a.push_back(attr("activation", std::string("Silu")));
  a.push_back(attr("channels_last", int64_t{1}));
  const testing::Case c{"FusedConv", {noise({1, 20, 20, 16}, 41, 2.f), noise({16, 16, 3, 3}, 42, 0.3f), noise({16}, 43), noise({1, 20, 20, 16}, 44)},
                        {false, true, true, false}, a};
  std::string label;
  EXPECT_EQ(testing::check(c, 1e-5, nullptr, &without_kiln_winograd(), &label), "onednn.conv");
  EXPECT_EQ(label, CpuFeatures::host().avx512f ? "" : "kiln epilogue");
}

TEST(OneDnn, Conv1dAnd3dAndAutoPad) {
  EXPECT_EQ(check({"Conv", {noise({2, 5, 19}, 7), noise({7, 5, 3}, 8)}, {false, true}, {attr("auto_pad", std::string("SAME_UPPER"))}}),
            "onednn.conv");
  EXPECT_EQ(check({"Conv", {noise({1, 4, 5, 6, 7}, 9), noise({6, 4, 3, 3, 3}, 10, 0.3f)}, {false, true},
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1, 1, 1})}}),
            "onednn.conv");
}

TEST(OneDnn, MatMulForms) {
  // 2-D, a batch over one weight (folded into M), batched with broadcast, computed B. (Layers of
  // up to 32768 multiply-adds with a constant weight go to XNNPACK: xnnpack_test.cc; kiln's
  // GEMM takes the others first, so it is left out here.)
  const KernelRegistry r = default_kernels().without({"kiln.gemm_f32_avx512", "kiln.gemm_f32_avx2"});
  auto check = [&](const testing::Case& c) { return testing::check(c, 1e-5, nullptr, &r); };
  EXPECT_EQ(check({"MatMul", {noise({37, 33}, 1), noise({33, 29}, 2)}, {false, true}}), "onednn.matmul");
  EXPECT_EQ(check({"MatMul", {noise({2, 7, 64}, 3), noise({64, 48}, 4)}, {false, true}}), "onednn.matmul");
  EXPECT_EQ(check({"MatMul", {noise({2, 3, 5, 8}, 5), noise({1, 3, 8, 6}, 6)}, {false, false}}), "onednn.matmul");
  EXPECT_EQ(check({"MatMul", {noise({3, 1, 5, 8}, 7), noise({4, 8, 6}, 8)}, {false, false}}), "onednn.matmul");
  // Fused: bias, GELU, residual.
  EXPECT_EQ(check({"FusedMatMul", {noise({2, 9, 64}, 9), noise({64, 33}, 10), noise({33}, 11), noise({2, 9, 33}, 12)},
                   {false, true, true, false}, {attr("activation", std::string("Gelu"))}}),
            "onednn.matmul");
  // Gemm: transposed operands, a row C and a full C.
  EXPECT_EQ(check({"Gemm", {noise({9, 5}, 13), noise({11, 9}, 14), noise({11}, 15)}, {false, true, true},
                   {attr("transA", int64_t{1}), attr("transB", int64_t{1})}}),
            "onednn.matmul");
  EXPECT_EQ(check({"Gemm", {noise({5, 9}, 16), noise({9, 11}, 17), noise({5, 11}, 18)}, {false, false, false}}), "onednn.matmul");
}

TEST(OneDnn, Pools) {
  Tensor x = noise({2, 5, 13, 11}, 19);
  EXPECT_EQ(check({"MaxPool", {x}, {}, {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                                         attr("pads", std::vector<int64_t>{1, 1, 1, 1})}}),
            "onednn.pool");
  EXPECT_EQ(check({"MaxPool", {x}, {}, {attr("kernel_shape", std::vector<int64_t>{2, 2}), attr("strides", std::vector<int64_t>{2, 2}),
                                         attr("ceil_mode", int64_t{1})}}),
            "onednn.pool");
  for (int64_t include : {0, 1})
    EXPECT_EQ(check({"AveragePool", {x}, {}, {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("pads", std::vector<int64_t>{1, 1, 1, 1}),
                                               attr("count_include_pad", include)}}),
              "onednn.pool");
  EXPECT_EQ(check({"AveragePool", {x}, {}, {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                                             attr("ceil_mode", int64_t{1})}}),
            "onednn.pool");
  EXPECT_EQ(check({"GlobalAveragePool", {x}}), "onednn.pool");
  EXPECT_EQ(check({"GlobalMaxPool", {noise({1, 7, 5, 3, 4}, 20)}}), "onednn.pool");
}

// channels_last FusedConv and pools (what `kiln compile` makes of them): [N, H, W, C] tensors
// straight into oneDNN, against the reference kernel on the transposed tensors. Grouped and
// depthwise ones with channel counts off the SIMD width included.
TEST(OneDnn, ChannelsLastConvAndPools) {
  struct Shape2 { int64_t c, h, w, m, k, stride, group; };
  for (const Shape2& s : std::vector<Shape2>{{3, 11, 9, 5, 3, 2, 1}, {16, 8, 8, 32, 1, 1, 1}, {12, 9, 9, 18, 3, 1, 3},
                                            {17, 9, 7, 17, 3, 1, 17}, {40, 10, 10, 40, 5, 2, 40}, {24, 6, 6, 144, 1, 1, 1}}) {
    SCOPED_TRACE(std::to_string(s.c) + "->" + std::to_string(s.m) + " k" + std::to_string(s.k) + " group " + std::to_string(s.group));
    const int64_t p = s.k / 2, oh = (s.h + 2 * p - s.k) / s.stride + 1, ow = (s.w + 2 * p - s.k) / s.stride + 1;
    Tensor x = noise({2, s.h, s.w, s.c}, 1), w = noise({s.m, s.c / s.group, s.k, s.k}, 2, 0.3f), b = noise({s.m}, 3);
    std::vector<Attribute> a = conv_attrs({p, p, p, p}, {s.stride, s.stride}, {1, 1}, s.group);
    a.push_back(attr("channels_last", int64_t{1}));
    EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, a}), "onednn.conv");
    a.push_back(attr("activation", std::string("Clip")));
    a.push_back(attr("activation_params", std::vector<double>{0, 6}));
    a.push_back(attr("post_activation", std::string("Silu")));
    EXPECT_EQ(check({"FusedConv", {x, w, b, noise({2, oh, ow, s.m}, 4)}, {false, true, true, false}, a}), "onednn.conv");
  }
  Tensor x = noise({2, 13, 11, 5}, 5);
  const std::vector<Attribute> last = {attr("channels_last", int64_t{1})};
  auto with = [&](std::vector<Attribute> a) {
    a.push_back(last[0]);
    return a;
  };
  // kiln.max_pool and kiln.global_pool take the f32 max and global ones by default
  // (CpuKernels.MaxPool, CpuKernels.GlobalPool).
  const KernelRegistry without_kiln = default_kernels().without(
      {"kiln.global_pool_f32_avx512", "kiln.global_pool_f32_avx2", "kiln.max_pool_f32_avx512", "kiln.max_pool_f32_avx2"});
  EXPECT_EQ(check({"MaxPool", {x}, {}, with({attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                                              attr("pads", std::vector<int64_t>{1, 1, 1, 1})})},
                  1e-5, nullptr, &without_kiln),
            "onednn.pool");
  EXPECT_EQ(check({"AveragePool", {x}, {}, with({attr("kernel_shape", std::vector<int64_t>{2, 3}), attr("ceil_mode", int64_t{1}),
                                                  attr("strides", std::vector<int64_t>{2, 2})})}),
            "onednn.pool");
  EXPECT_EQ(check({"GlobalAveragePool", {x}, {}, last}, 1e-5, nullptr, &without_kiln), "onednn.pool");
  EXPECT_EQ(check({"GlobalMaxPool", {x}, {}, last}, 1e-5, nullptr, &without_kiln), "onednn.pool");
}

// 3x3 stride-1 ungrouped convolutions of 32 channels and more: oneDNN's Winograd where the CPU
// has it (AVX-512), NHWC and NCHW, with bias, activations (as post-ops, or after it on kiln's
// row kernels when Winograd has no such post-op) and a residual, odd channel counts
// and sizes; within 1e-5 of the direct reference. A stride of 2, too few channels (16 in and
// out, YOLO's 80x80 ones) or a 5x5 kernel stay direct. Without kiln's Winograd, which the
// default rule prefers for the channels-last ones (CpuKernels.WinogradConv).
TEST(OneDnn, WinogradConvolutions) {
  const bool wino = CpuFeatures::host().avx512f;
  const KernelRegistry* kernels = &without_kiln_winograd();
  struct Shape2 { int64_t c, h, w, m; };
  for (const Shape2& s : std::vector<Shape2>{{32, 9, 9, 48}, {64, 14, 14, 64}, {33, 7, 11, 40}})
    for (bool last : {true, false}) {
      SCOPED_TRACE(std::to_string(s.c) + "->" + std::to_string(s.m) + (last ? " nhwc" : " nchw"));
      Tensor x = noise(last ? std::vector<int64_t>{2, s.h, s.w, s.c} : std::vector<int64_t>{2, s.c, s.h, s.w}, 1);
      Tensor w = noise({s.m, s.c, 3, 3}, 2, 0.3f), b = noise({s.m}, 3);
      Tensor z = noise(last ? std::vector<int64_t>{2, s.h, s.w, s.m} : std::vector<int64_t>{2, s.m, s.h, s.w}, 4);
      std::vector<Attribute> a = conv_attrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1);
      if (last) a.push_back(attr("channels_last", int64_t{1}));
      a.push_back(attr("activation", std::string("Relu")));
      std::string label;
      // (On AVX2, oneDNN's JIT kernels lack the residual's sum post-op: kiln's epilogue after them.)
      const std::string with_z = wino ? "winograd" : "kiln epilogue";
      EXPECT_EQ(check({"FusedConv", {x, w, b, z}, {false, true, true, false}, a}, 1e-5, nullptr, kernels, &label), "onednn.conv");
      EXPECT_EQ(label, with_z);
      EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, a}, 1e-5, nullptr, kernels, &label), "onednn.conv");
      EXPECT_EQ(label, wino ? "winograd" : "");
      // Silu, which Winograd's post-ops lack: kiln's epilogue follows it.
      a.back() = attr("activation", std::string("Silu"));
      a.push_back(attr("post_activation", std::string("Relu")));
      EXPECT_EQ(check({"FusedConv", {x, w, b, z}, {false, true, true, false}, a}, 1e-5, nullptr, kernels, &label), "onednn.conv");
      EXPECT_EQ(label, with_z);
    }
  std::string label;
  Tensor x = noise({1, 16, 12, 12}, 5);
  EXPECT_EQ(check({"Conv", {x, noise({16, 16, 3, 3}, 6)}, {false, true}, conv_attrs({1, 1, 1, 1}, {2, 2}, {1, 1}, 1)}, 1e-5, nullptr,
                  nullptr, &label),
            "onednn.conv");
  EXPECT_EQ(label, "");
  for (int64_t c : {8, 16}) {
    EXPECT_EQ(check({"Conv", {noise({1, c, 12, 12}, 7), noise({16, c, 3, 3}, 8)}, {false, true}, conv_attrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1)},
                    1e-5, nullptr, kernels, &label),
              "onednn.conv");
    EXPECT_EQ(label, "") << c << " channels";
  }
  EXPECT_EQ(check({"Conv", {x, noise({16, 16, 5, 5}, 9)}, {false, true}, conv_attrs({2, 2, 2, 2}, {1, 1}, {1, 1}, 1)}, 1e-5, nullptr,
                  nullptr, &label),
            "onednn.conv");
  EXPECT_EQ(label, "");
}

TEST(OneDnn, DeclinesWhatItCannotRun) {
  // Weights computed at run time, 1-D MatMul operands, alpha != 1, an empty K.
  EXPECT_EQ(check({"Conv", {noise({1, 3, 5, 5}, 1), noise({4, 3, 3, 3}, 2)}, {false, false}}), kReferenceKernel);
  EXPECT_EQ(check({"MatMul", {noise({8}, 3), noise({8, 4}, 4)}, {false, true}}), kReferenceKernel);
  EXPECT_EQ(check({"Gemm", {noise({3, 4}, 5), noise({4, 2}, 6)}, {false, true}, {attr("alpha", 2.0)}}), kReferenceKernel);
  EXPECT_EQ(check({"MatMul", {Tensor(DType::f32, {2, 0}), Tensor(DType::f32, {0, 3})}, {false, false}}), kReferenceKernel);
  EXPECT_EQ(check({"AveragePool", {noise({1, 2, 5, 5}, 7)}, {}, {attr("kernel_shape", std::vector<int64_t>{2, 2}), attr("strides", std::vector<int64_t>{2, 2}),
                                                                  attr("ceil_mode", int64_t{1}), attr("count_include_pad", int64_t{1})}}),
            kReferenceKernel);
}

// kiln's reading of oneDNN's blocked layouts (PackedLayout) agrees with oneDNN: weights
// reordered by oneDNN into the layouts its matmuls and convolutions pick, unpacked by kiln, are
// the weights; packed by kiln, they are oneDNN's bytes, padding included.
TEST(OneDnnPacking, LayoutsAgreeWithOneDnn) {
  using dnnl::memory;
  using tag = memory::format_tag;
  struct Case { std::vector<int64_t> dims; tag t; };
  for (const Case& c : std::vector<Case>{{{37, 70}, tag::BA16a64b4a}, {{37, 70}, tag::AB16b64a}, {{50, 33}, tag::BA16a48b},
                                         {{37, 70}, tag::ba}, {{20, 24, 3, 3}, tag::OIhw16i16o},
                                         {{2, 9, 5, 3, 3}, tag::gOIhw16i16o}}) {
    SCOPED_TRACE(shape_str(c.dims));
    const Tensor w = noise(c.dims, 21);
    const memory::dims d(c.dims.begin(), c.dims.end());
    memory src(onednn::plain(c.dims), onednn::cpu_engine(), const_cast<void*>(w.raw()));
    memory dst(memory::desc(d, memory::data_type::f32, c.t), onednn::cpu_engine());
    dnnl::reorder(src, dst).execute(onednn::cpu_stream(), src, dst);
    onednn::cpu_stream().wait();
    const std::optional<PackedLayout> layout = onednn::layout_of(dst.get_desc());
    ASSERT_TRUE(layout);
    const size_t bytes = dst.get_desc().get_size();
    ASSERT_FALSE(check_layout(*layout, w.numel(), bytes, 4)) << *check_layout(*layout, w.numel(), bytes, 4);
    const Tensor theirs = Tensor::packed(DType::f32, c.dims, *layout, bytes, dst.get_data_handle(), nullptr);
    const Tensor back = unpack(theirs);
    EXPECT_EQ(std::memcmp(back.raw(), w.raw(), w.nbytes()), 0);
    const Tensor ours = pack(w, *layout);
    ASSERT_EQ(ours.nbytes(), bytes);
    EXPECT_EQ(std::memcmp(ours.raw(), dst.get_data_handle(), bytes), 0);
  }
}

// prepack: weights already in the wanted layout are used where they are; weights packed another
// way, or over other dims, or transposed, are reordered into it.
TEST(OneDnnPacking, PrepackUsesMatchingLayoutsInPlace) {
  using dnnl::memory;
  const Tensor w = noise({37, 70}, 22);
  const memory::desc user = onednn::plain({37, 70});
  const memory::desc wanted({37, 70}, memory::data_type::f32, memory::format_tag::BA16a64b4a);
  auto reference = [&] {
    memory src(user, onednn::cpu_engine(), const_cast<void*>(w.raw())), dst(wanted, onednn::cpu_engine());
    dnnl::reorder(src, dst).execute(onednn::cpu_stream(), src, dst);
    onednn::cpu_stream().wait();
    return dst;
  }();
  auto same_bytes = [&](const memory& m) {
    return std::memcmp(m.get_data_handle(), reference.get_data_handle(), wanted.get_size()) == 0;
  };
  // Plain, and packed the way the primitive wants: in place.
  auto plain = onednn::prepack(w, user, wanted);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(same_bytes(*plain));
  const Tensor packed = onednn::packed_weights(w, *plain, false, "test");
  ASSERT_TRUE(packed.is_packed());
  EXPECT_EQ(packed.layout()->packed_for.rfind("onednn 2.", 0), 0u) << packed.layout()->packed_for;
  auto in_place = onednn::prepack(packed, user, wanted);
  ASSERT_TRUE(in_place.ok());
  EXPECT_EQ(in_place->get_data_handle(), packed.raw());
  // Packed another way (column-major): reordered.
  const Tensor other = pack(w, PackedLayout{{37, 70}, {37, 70}, {1, 37}, {}, {}, "test"});
  auto reordered = onednn::prepack(other, user, wanted);
  ASSERT_TRUE(reordered.ok());
  EXPECT_NE(reordered->get_data_handle(), other.raw());
  EXPECT_TRUE(same_bytes(*reordered));
  // Packed over [1, 37, 70] (a batch the primitive does not have): through the plain form.
  Tensor batched = pack(w, PackedLayout{{1, 37, 70}, {1, 37, 70}, {2590, 70, 1}, {}, {}, "test"});
  auto through_plain = onednn::prepack(batched, user, wanted);
  ASSERT_TRUE(through_plain.ok());
  EXPECT_TRUE(same_bytes(*through_plain));
  // A transposed operand: the tensor is [70, 37], the primitive's dims [37, 70].
  Tensor wt(DType::f32, {70, 37});
  for (int64_t i = 0; i < 37; ++i)
    for (int64_t j = 0; j < 70; ++j) wt.data<float>()[j * 37 + i] = w.data<float>()[i * 70 + j];
  auto t = onednn::prepack(wt, onednn::transposed({37, 70}), wanted);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(same_bytes(*t));
  const Tensor tp = onednn::packed_weights(wt, *t, true, "test");
  ASSERT_TRUE(tp.is_packed());
  EXPECT_EQ(tp.layout()->dims, (std::vector<int64_t>{70, 37}));
  EXPECT_EQ(std::memcmp(unpack(tp).raw(), wt.raw(), wt.nbytes()), 0);
  auto t_in_place = onednn::prepack(tp, onednn::transposed({37, 70}), wanted, true);
  ASSERT_TRUE(t_in_place.ok());
  EXPECT_EQ(t_in_place->get_data_handle(), tp.raw());
}

// A convolution's residual, added by oneDNN's sum post-op, is its destination's memory when
// nothing reads it after the convolution (Kernel::overwrites_input): the plan gives Y Z's place
// and the kernel skips the copy. Not when Z is read later, nor when Z is also the convolution's
// input, nor where oneDNN's JIT kernels lack the post-ops (AVX2); NCHW (through oneDNN's
// blocked destination) and channels-last alike.
TEST(OneDnn, ResidualsDestinationTakesItsPlaceWhenItDies) {
  for (const bool last : {false, true}) {
    for (const char* form : {"dies", "read after", "also X"}) {
      SCOPED_TRACE(std::string(form) + (last ? ", channels-last" : ", NCHW"));
      const std::vector<int64_t> dims = last ? std::vector<int64_t>{1, 9, 9, 16} : std::vector<int64_t>{1, 16, 9, 9};
      Graph g;
      const ValueId x = g.add_value("x", DType::f32, Shape::of(dims));
      g.inputs = {x};
      const ValueId w = g.add_constant("w", noise({16, 16, 3, 3}, 2, 0.3f)), b = g.add_constant("b", noise({16}, 3));
      const ValueId z = g.add_value("z", DType::undefined), xn = g.add_value("xn", DType::undefined);
      const ValueId y = g.add_value("y", DType::undefined), out = g.add_value("out", DType::undefined);
      g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {x}, .outputs = {z}});
      g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {x}, .outputs = {xn}});
      std::vector<Attribute> a = conv_attrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1);
      a.push_back(attr("activation", std::string("Relu")));
      if (last) a.push_back(attr("channels_last", int64_t{1}));
      const bool also_x = std::string(form) == "also X", read_after = std::string(form) == "read after";
      Node conv{.name = "conv", .op = "FusedConv", .inputs = {also_x ? z : xn, w, b, z}, .outputs = {y}};
      for (const Attribute& at : a) conv.set_attr(at.name, at.value);
      g.add_node(std::move(conv));
      if (read_after) g.add_node(Node{.name = "add", .op = "Add", .inputs = {y, z}, .outputs = {out}});
      else g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {y}, .outputs = {out}});
      g.outputs = {out};
      Model m;
      m.graph = g;
      auto inferred = infer_graph(m.graph);
      ASSERT_TRUE(inferred.ok()) << inferred.error().message();
      Target target;
      std::vector<std::vector<int64_t>> shapes = {dims};
      auto plan = build_plan(m.graph, shapes, PlanOptions{target, without_kiln_winograd()});
      ASSERT_TRUE(plan.ok()) << plan.error().message();
      ASSERT_EQ(plan->kernels[2].name, "onednn.conv");
      // (Where oneDNN lacks the post-ops, kiln's epilogue reads Z after oneDNN wrote Y: apart.)
      const bool shared = std::string(form) == "dies" && plan->kernels[2].kernel->label() != "kiln epilogue";
      EXPECT_EQ(plan->overwrites[2], shared ? 1 : 0);
      const std::vector<int64_t>& off = plan->memory.offset;
      EXPECT_EQ(off[static_cast<size_t>(y)] == off[static_cast<size_t>(z)], shared);
      // And the run is right either way, against the reference kernels.
      auto fast = Session::create(m);
      auto ref = Session::create(m, SessionOptions{.reference = true});
      ASSERT_TRUE(fast.ok() && ref.ok());
      const Tensor in = noise(dims, 1, 2.f);
      auto got = (*fast)->run(std::vector<Tensor>{in});
      auto want = (*ref)->run(std::vector<Tensor>{in});
      ASSERT_TRUE(got.ok() && want.ok()) << (got.ok() ? want.error().message() : got.error().message());
      EXPECT_LE(compare_tensors((*got)[0], (*want)[0]).rel_l2_error, 1e-5);
    }
  }
}

}  // namespace
}  // namespace kiln
