// The XNNPACK provider against the reference kernels: the tiny linear layers it takes, with
// bias, clamps and the epilogues kiln finishes; and what it leaves to kiln's GEMM and oneDNN.
#include <gtest/gtest.h>

#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::check;
using testing::noise;

constexpr const char* kKernel = "xnnpack.fully_connected";

TEST(Xnnpack, SmallLinearLayers) {
  // The MLP sample's layers, odd sizes, A with batch dims folded into M.
  EXPECT_EQ(check({"MatMul", {noise({1, 16}, 1), noise({16, 64}, 2)}, {false, true}}), kKernel);
  EXPECT_EQ(check({"MatMul", {noise({3, 2, 7}, 3), noise({7, 13}, 4)}, {false, true}}), kKernel);
  EXPECT_EQ(check({"Gemm", {noise({5, 9}, 5), noise({9, 11}, 6), noise({11}, 7)}, {false, true, true}}), kKernel);
  EXPECT_EQ(check({"Gemm", {noise({5, 9}, 8), noise({11, 9}, 9), noise({1, 11}, 10)}, {false, true, true}, {attr("transB", int64_t{1})}}),
            kKernel);
  // FusedMatMul: Relu and Clip as XNNPACK's clamp; GELU, a residual and a post-activation on
  // kiln's row kernels after it.
  Tensor a = noise({4, 24}, 11, 4.f), w = noise({24, 10}, 12), b = noise({10}, 13);
  EXPECT_EQ(check({"FusedMatMul", {a, w, b}, {false, true, true}, {attr("activation", std::string("Relu"))}}), kKernel);
  EXPECT_EQ(check({"FusedMatMul", {a, w, b}, {false, true, true},
                   {attr("activation", std::string("Clip")), attr("activation_params", std::vector<double>{-0.5, 0.5})}}),
            kKernel);
  EXPECT_EQ(check({"FusedMatMul", {a, w, b, noise({4, 10}, 14)}, {false, true, true, false},
                   {attr("activation", std::string("Gelu")), attr("post_activation", std::string("Relu"))}}),
            kKernel);
}

TEST(Xnnpack, LeavesTheRestToOthers) {
  // Past 32768 multiply-adds kiln's GEMM is faster; a computed weight, a batched B, transA, alpha.
  EXPECT_EQ(check({"MatMul", {noise({64, 64}, 15), noise({64, 64}, 16)}, {false, true}}).rfind("kiln.gemm_f32_", 0), 0u);
  EXPECT_NE(check({"MatMul", {noise({4, 8}, 17), noise({8, 6}, 18)}, {false, false}}), kKernel);
  EXPECT_NE(check({"MatMul", {noise({2, 4, 8}, 19), noise({2, 8, 6}, 20)}, {false, true}}), kKernel);
  EXPECT_NE(check({"Gemm", {noise({9, 5}, 21), noise({9, 11}, 22)}, {false, true}, {attr("transA", int64_t{1})}}), kKernel);
  EXPECT_NE(check({"Gemm", {noise({5, 9}, 23), noise({9, 11}, 24)}, {false, true}, {attr("alpha", 2.0)}}), kKernel);
}

}  // namespace
}  // namespace kiln
