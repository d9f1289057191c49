// The oneDNN provider against the reference kernels: every op it takes, on odd and
// SIMD-multiple sizes, with the fused epilogues; and what it declines.
#include <gtest/gtest.h>

#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::check;
using testing::Case;
using testing::noise;

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

TEST(OneDnn, Conv1dAnd3dAndAutoPad) {
  EXPECT_EQ(check({"Conv", {noise({2, 5, 19}, 7), noise({7, 5, 3}, 8)}, {false, true}, {attr("auto_pad", std::string("SAME_UPPER"))}}),
            "onednn.conv");
  EXPECT_EQ(check({"Conv", {noise({1, 4, 5, 6, 7}, 9), noise({6, 4, 3, 3, 3}, 10, 0.3f)}, {false, true},
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1, 1, 1})}}),
            "onednn.conv");
}

TEST(OneDnn, MatMulForms) {
  // 2-D, a batch over one weight (folded into M), batched with broadcast, computed B. (Layers of
  // up to 32768 multiply-adds with a constant weight go to XNNPACK: xnnpack_test.cc.)
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
  EXPECT_EQ(check({"MaxPool", {x}, {}, with({attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                                              attr("pads", std::vector<int64_t>{1, 1, 1, 1})})}),
            "onednn.pool");
  EXPECT_EQ(check({"AveragePool", {x}, {}, with({attr("kernel_shape", std::vector<int64_t>{2, 3}), attr("ceil_mode", int64_t{1}),
                                                  attr("strides", std::vector<int64_t>{2, 2})})}),
            "onednn.pool");
  EXPECT_EQ(check({"GlobalAveragePool", {x}, {}, last}), "onednn.pool");
  EXPECT_EQ(check({"GlobalMaxPool", {x}, {}, last}), "onednn.pool");
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

}  // namespace
}  // namespace kiln
