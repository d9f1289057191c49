// kiln's own int8 convolution kernels against the reference kernels, within one quantization
// step: the depthwise one, the direct one (over RGB on `vpdpbusd`, over 5 to 64 channels on AMX
// tiles), and QFusedConv on kiln's u8s8 GEMM, of its pixels (pointwise) or its gathered
// windows; each kernel's default rule.
#include <gtest/gtest.h>

#include "runtime/cpu/gemm/lowp.h"
#include "tests/unit/int8_test_util.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

// kiln's depthwise kernel (u8 in and out, channels-last): channels in whole blocks of 64 and
// past them (a block of fewer than 16 too), 3x3, 5x5 and 7x7 filters (one and two groups of
// filter rows; 7x7 on the loop for any width), strides 1 and 2, rows and columns mostly padding, two images; no activation, ReLU, Clip and
// SiLU; per-channel and per-tensor weights, with and without a bias. It declines s8
// activations, a residual and other activations, which oneDNN's kernel runs.
TEST(Int8Kernels, DepthwiseQFusedConvOnKiln) {
  SKIP_WITHOUT_VNNI();
  for (QConv s : std::vector<QConv>{{2, 64, 9, 11, 64, 3, 1, 64}, {1, 144, 10, 10, 144, 3, 2, 144}, {1, 40, 7, 6, 40, 5, 1, 40},
                                    {1, 67, 9, 9, 67, 5, 2, 67}, {1, 8, 3, 2, 8, 3, 1, 8}, {1, 130, 1, 5, 130, 3, 1, 130},
                                    {1, 24, 9, 10, 24, 7, 1, 24},
                                    // Pair mode (32 channels or fewer): odd and even widths
                                    // (the last pair half empty), two images, strides 1 and 2,
                                    // 3x3, 5x5 and 7x7, fewer than 32 channels (masked halves).
                                    {2, 32, 7, 9, 32, 3, 1, 32}, {1, 32, 6, 8, 32, 3, 2, 32}, {1, 32, 11, 13, 32, 5, 2, 32},
                                    {1, 20, 8, 7, 20, 5, 1, 20}, {1, 32, 5, 4, 32, 7, 1, 32}, {1, 1, 6, 5, 1, 3, 2, 1},
                                    // A full block, then a last one of 32 in pair mode (and
                                    // 67, 130 and 144 above: last blocks of 3, 2 and 16).
                                    {1, 96, 5, 7, 96, 3, 1, 96}, {2, 96, 8, 9, 96, 5, 2, 96}}) {
    for (const char* activation : {"", "Relu", "Clip", "Silu"}) {
      s.activation = activation;
      s.per_channel = s.c % 2 == 0;
      s.bias = std::string(activation) != "Relu";
      SCOPED_TRACE(std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + "x" + std::to_string(s.c) + " k" +
                   std::to_string(s.k) + " s" + std::to_string(s.stride) + " " + activation);
      Case c = qconv_case(s);
      c.kernel = "kiln.qdwconv_u8s8_avx512";  // the default rule leaves fewer than 64 channels to oneDNN
      expect_within_one_step(c, "kiln.qdwconv_u8s8_avx512");
    }
  }
  // The default rule (qdwconv_defers): 64 channels and more are kiln's, but for stride 2 over
  // an image 56 or more wide; 33 to 63 channels are oneDNN's; 32 or fewer kiln's (pair mode).
  for (const auto& [v, kernel] : std::vector<std::pair<QConv, std::string>>{
           {{1, 64, 9, 11, 64, 3, 1, 64}, "kiln.qdwconv_u8s8_avx512"},
           {{1, 96, 12, 55, 96, 3, 2, 96}, "kiln.qdwconv_u8s8_avx512"},
           {{1, 96, 12, 56, 96, 3, 2, 96}, "onednn.qconv"},
           {{1, 64, 12, 56, 64, 3, 1, 64}, "kiln.qdwconv_u8s8_avx512"},
           {{1, 48, 9, 11, 48, 3, 1, 48}, "onednn.qconv"},
           {{1, 33, 9, 11, 33, 3, 1, 33}, "onednn.qconv"},
           {{1, 32, 9, 11, 32, 3, 1, 32}, "kiln.qdwconv_u8s8_avx512"},
           {{1, 24, 6, 57, 24, 3, 2, 24}, "kiln.qdwconv_u8s8_avx512"}}) {
    SCOPED_TRACE(std::to_string(v.h) + "x" + std::to_string(v.w) + "x" + std::to_string(v.c) + " s" + std::to_string(v.stride));
    expect_within_one_step(qconv_case(v), kernel);
  }
  // Stride 2 over a wide image with SiLU: kiln's for a 3x3, oneDNN's for a 5x5.
  for (const auto& [v, kernel] : std::vector<std::pair<QConv, std::string>>{{{1, 96, 12, 56, 96, 3, 2, 96}, "kiln.qdwconv_u8s8_avx512"},
                                                                             {{1, 96, 12, 56, 96, 5, 2, 96}, "onednn.qconv"}}) {
    QConv silu = v;
    silu.activation = "Silu";
    SCOPED_TRACE("silu k" + std::to_string(v.k));
    expect_within_one_step(qconv_case(silu), kernel);
  }
  QConv s{1, 64, 8, 8, 64, 3, 1, 64};
  s.act = DType::i8;
  EXPECT_EQ(testing::run_both(qconv_case(s)).kernel, "onednn.qconv");
  s.act = DType::u8;
  s.residual = true;
  EXPECT_EQ(testing::run_both(qconv_case(s)).kernel, "onednn.qconv");
  s.residual = false;
  s.activation = "HardSwish";
  EXPECT_EQ(testing::run_both(qconv_case(s)).kernel, "onednn.qconv");
}

// kiln's direct kernel for an image's first layer (u8 in and out, channels-last, 4 input
// channels or fewer): 1 to 4 channels; 3x3, 5x5 and 7x7 filters; strides 1 to 3; one to four
// vectors of output channels, whole and not (8, 16, 40, 64); images whose every pixel's window
// leaves them, and two images (the last pixels read through the copied windows, not past the
// input); no activation, ReLU, Clip and SiLU. It declines more input channels and a residual.
// The default rule leaves windows of more than 24 four-byte groups to oneDNN on AMX only.
TEST(Int8Kernels, DirectQFusedConvOnKiln) {
  SKIP_WITHOUT_VNNI();
  for (QConv s : std::vector<QConv>{{1, 3, 15, 17, 32, 3, 2, 1}, {2, 3, 9, 8, 16, 3, 1, 1}, {1, 4, 11, 13, 40, 5, 2, 1},
                                    {1, 1, 6, 7, 8, 3, 1, 1}, {2, 3, 16, 12, 64, 7, 2, 1}, {1, 3, 2, 3, 24, 3, 1, 1},
                                    {1, 3, 14, 14, 48, 3, 3, 1}, {1, 2, 30, 29, 16, 3, 2, 1}}) {
    for (const char* activation : {"", "Relu", "Clip", "Silu"}) {
      s.activation = activation;
      s.per_channel = s.m % 16 == 0;
      s.bias = std::string(activation) != "Relu";
      SCOPED_TRACE(std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + "x" + std::to_string(s.c) + " -> " +
                   std::to_string(s.m) + " k" + std::to_string(s.k) + " s" + std::to_string(s.stride) + " " + activation);
      Case c = qconv_case(s);
      c.kernel = "kiln.qconv_direct_u8s8_avx512";
      expect_within_one_step(c, "kiln.qconv_direct_u8s8_avx512");
    }
  }
  for (QConv s : std::vector<QConv>{{1, 8, 9, 9, 16, 3, 2, 1}, {1, 3, 9, 9, 16, 3, 2, 1}}) {
    if (s.c == 3) s.residual = true;
    const testing::BothRuns r = testing::run_both(qconv_case(s));
    if (s.c == 8 && CpuFeatures::host().amx) EXPECT_EQ(r.kernel, "kiln.qconv_direct_u8s8_avx512");  // on AMX tiles
    else EXPECT_NE(r.kernel, "kiln.qconv_direct_u8s8_avx512") << s.c;
  }
  const CpuFeatures amx = *CpuFeatures::named("amx"), vnni = *CpuFeatures::named("avx512-vnni");
  for (const auto& [s, on_amx] : std::vector<std::pair<QConv, std::string>>{
           {{1, 3, 16, 12, 64, 7, 2, 1}, "onednn.qconv"},                  // 7 rows of 6 groups
           {{1, 4, 16, 12, 32, 5, 1, 1}, "onednn.qconv"},                  // 5 of 5
           {{1, 3, 16, 12, 64, 5, 2, 1}, "kiln.qconv_direct_u8s8_avx512"},  // 5 of 4
           {{1, 1, 16, 12, 32, 7, 1, 1}, "kiln.qconv_direct_u8s8_avx512"}}) {  // 7 of 2
    SCOPED_TRACE(std::to_string(s.c) + " channels k" + std::to_string(s.k));
    EXPECT_EQ(testing::run_both(qconv_case(s), &vnni).kernel, "kiln.qconv_direct_u8s8_avx512");
    EXPECT_EQ(testing::run_both(qconv_case(s), &amx).kernel, on_amx);
  }
}

// Over 5 to 64 input channels the direct kernel runs on AMX tiles, where the CPU has them: 16
// output pixels' window rows read in place from the padded image, a 64-byte chunk of each a
// tile row. Channels whose window rows fill 1 to 3 chunks, whole or not; 3x3 and 5x5 filters,
// strides 1 and 2; rows of pixels in one tile, two, and past them (13, 20, 37, 40 wide); one to
// four vectors of output channels, whole and not; two images; no activation, ReLU, Clip and
// SiLU, with a u8 residual (a ReLU after it or none) and without; one and two threads. It
// declines more than 64 input channels, a 1x1 filter and more than 64 output channels, and
// by default takes every one it runs over 32 channels or fewer, over 33 to 64 those of 100
// million operations or fewer.
TEST(Int8Kernels, DirectQFusedConvOnAmxTiles) {
  SKIP_WITHOUT_VNNI();
  if (!CpuFeatures::host().amx) GTEST_SKIP() << "the CPU lacks AMX";
  const std::string kiln = "kiln.qconv_direct_u8s8_avx512";
  for (QConv s : std::vector<QConv>{{1, 16, 13, 13, 16, 3, 1, 1}, {2, 32, 20, 20, 32, 3, 2, 1}, {1, 8, 9, 37, 40, 5, 1, 1},
                                    {1, 24, 7, 40, 64, 3, 1, 1}, {1, 5, 11, 17, 8, 3, 2, 1}, {1, 32, 6, 40, 48, 5, 2, 1},
                                    {1, 64, 9, 21, 64, 3, 1, 1}, {1, 48, 8, 8, 24, 3, 2, 1}}) {
    for (const char* activation : {"", "Relu", "Clip", "Silu"}) {
      for (int variant = 0; variant < 3; ++variant) {  // no residual; one; one with a ReLU after it
        s.activation = activation;
        s.per_channel = s.m % 16 == 0;
        s.bias = std::string(activation) != "Relu";
        s.residual = variant > 0;
        s.post = variant == 2 ? "Relu" : "";
        const int threads = 1 + variant % 2;
        SCOPED_TRACE(std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + "x" + std::to_string(s.c) + " -> " +
                     std::to_string(s.m) + " k" + std::to_string(s.k) + " s" + std::to_string(s.stride) + " " + activation + " residual " +
                     std::to_string(variant) + " threads " + std::to_string(threads));
        Case c = qconv_case(s);
        c.threads = threads;
        expect_within_one_step(c, kiln);
      }
    }
  }
  for (QConv s : std::vector<QConv>{{1, 65, 9, 9, 16, 3, 1, 1}, {1, 16, 9, 9, 16, 1, 1, 1}, {1, 16, 9, 9, 80, 3, 1, 1}}) {
    SCOPED_TRACE(std::to_string(s.c) + " -> " + std::to_string(s.m) + " k" + std::to_string(s.k));
    EXPECT_NE(testing::run_both(qconv_case(s)).kernel, kiln);
  }
  // 33 to 64 input channels: by default over 100 million operations or fewer (before
  // kiln.qconv_windows_u8s8_avx512, which would gather their windows), oneDNN's over more.
  QConv wide{1, 64, 12, 11, 64, 3, 1, 1};  // 19 MOP
  wide.activation = "Silu";
  expect_within_one_step(qconv_case(wide), kiln);
  wide.residual = true;
  expect_within_one_step(qconv_case(wide), kiln);
  QConv large{1, 40, 42, 40, 64, 3, 1, 1};  // 77 MOP
  expect_within_one_step(qconv_case(large), kiln);
  large.h = 56;  // 103 MOP
  expect_within_one_step(qconv_case(large), "onednn.qconv");
}

// A channels-last 1x1 stride-1 QFusedConv is a product of its pixels by the weight: kiln's
// u8s8 GEMM runs it (pinned, as a compiled model or max-autotune pins it) on every epilogue,
// the rows past whole AMX tiles and K past whole 64s included; the default rule gives it the
// convolutions it measured faster on (an input zero point not 0; with 0, at one thread, few
// pixels or many input channels without a residual), oneDNN the rest; 3x3 and strided ones are
// oneDNN's.
TEST(Int8Kernels, QFusedConvPointwiseOnKilnGemm) {
  const std::string kiln = "kiln.qconv_u8s8_avx512";
  SKIP_WITHOUT_VNNI();
  for (DType act : {DType::u8, DType::i8}) {
    QConv s;
    s.n = 2, s.c = 70, s.h = 5, s.w = 7, s.m = 50, s.k = 1, s.act = act;
    SCOPED_TRACE(dtype_name(act));
    Case c = qconv_case(s);
    c.kernel = kiln;
    expect_within_one_step(c, kiln);
    s.activation = "Relu", s.residual = true, s.post = "Relu";
    c = qconv_case(s);
    c.kernel = kiln;
    expect_within_one_step(c, kiln);
    s.activation = "LeakyRelu";  // on the registers, with the residual and the ReLU after it
    c = qconv_case(s);
    c.kernel = kiln;
    expect_within_one_step(c, kiln);
    s.per_channel = false, s.bias = false, s.residual = false, s.post.clear();
    for (const char* a : {"Clip", "HardSwish"}) {  // Clip a clamp of the codes; HardSwish through the row kernels
      SCOPED_TRACE(a);
      s.activation = a;
      c = qconv_case(s);
      c.kernel = kiln;
      expect_within_one_step(c, kiln);
      s.c = 12;  // K under 64: the VNNI kernel, where AMX would take 70
      c = qconv_case(s);
      c.kernel = kiln;
      expect_within_one_step(c, kiln);
      s.c = 70;
    }
  }
  // The default rule. x's zero point not 0 (qconv_case's 131): kiln's, at one thread or two,
  // with a residual or not.
  QConv wide;
  wide.c = 512, wide.h = wide.w = 9, wide.m = 40, wide.k = 1;
  expect_within_one_step(qconv_case(wide), kiln);
  QConv small = wide;
  small.c = 64, small.h = 9, small.w = 8, small.residual = true, small.post = "Relu";  // 72 pixels, with a residual
  for (int threads : {1, 2}) {
    Case c = qconv_case(small);
    c.threads = threads;
    expect_within_one_step(c, kiln);
  }
  // x's zero point 0 (after a ReLU), without AMX: kiln's at one thread over 64 pixels or fewer,
  // or 512 input channels or more without a residual; oneDNN's otherwise and at two threads.
  // Where kiln's kernel runs on AMX tiles (16 pixels or more, 64 input channels or more): kiln's.
  auto relu_input = [](const QConv& s, int threads = 1) {
    Case c = qconv_case(s);
    c.inputs[2] = scalar_int(DType::u8, 0);
    c.threads = threads;
    return c;
  };
  const CpuFeatures vnni = *CpuFeatures::named("avx512-vnni"), amx = *CpuFeatures::named("amx");
  expect_within_one_step(relu_input(wide), kiln, &vnni);
  expect_within_one_step(relu_input(wide, 2), "onednn.qconv", &vnni);
  expect_within_one_step(relu_input(wide, 2), kiln, &amx);
  expect_within_one_step(relu_input(small), "onednn.qconv", &vnni);
  expect_within_one_step(relu_input(small), kiln, &amx);
  expect_within_one_step(relu_input(small, 2), kiln, &amx);
  QConv narrow = small;
  narrow.c = 48;  // K under 64: the VNNI kernel, the rule without AMX
  expect_within_one_step(relu_input(narrow), "onednn.qconv", &amx);
  small.h = 8;  // 64 pixels
  expect_within_one_step(relu_input(small), kiln, &vnni);
  // Strided and 3x3 ones are not this kernel's (kiln.qconv_windows_u8s8_avx512's on AMX).
  wide.stride = 2;
  expect_within_one_step(qconv_case(wide), "onednn.qconv", &vnni);
  wide.stride = 1, wide.k = 3;
  expect_within_one_step(qconv_case(wide), "onednn.qconv", &vnni);
}

// Any other channels-last QFusedConv without groups runs as the product of its windows on
// kiln's u8s8 GEMM (pinned): 3x3, 5x5 and 1x1 filters, strides 1 and 2, a dilation, windows
// leaving the image (x's zero point is not 0 there), rows past whole AMX tiles (the gathered
// rows padded to 16) and K past whole 64s, two images, u8 and s8 activations (s8 output: the
// epilogue's pass), every epilogue with a residual, one and two threads. The default rule
// takes on AMX a strided 1x1 one, a small one (64 input channels or more, 100 million
// operations or fewer), and at one thread one whose weight streams from memory over few pixels.
TEST(Int8Kernels, QFusedConvWindowsOnKilnGemm) {
  const std::string kiln = "kiln.qconv_windows_u8s8_avx512";
  SKIP_WITHOUT_VNNI();
  for (DType act : {DType::u8, DType::i8}) {
    for (QConv s : std::vector<QConv>{{1, 64, 9, 11, 40, 3, 1, 1}, {2, 70, 9, 8, 50, 3, 2, 1}, {1, 96, 10, 10, 64, 1, 2, 1},
                                      {1, 16, 8, 9, 24, 5, 1, 1}, {1, 128, 5, 4, 33, 3, 1, 1}}) {
      s.act = act;
      s.per_channel = s.m % 2 == 0;
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(dtype_name(act)) + " " + std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) +
                     "x" + std::to_string(s.c) + " -> " + std::to_string(s.m) + " k" + std::to_string(s.k) + " s" +
                     std::to_string(s.stride) + " threads " + std::to_string(threads));
        s.activation.clear(), s.residual = false, s.post.clear();
        Case c = qconv_case(s);
        c.kernel = kiln, c.threads = threads;
        expect_within_one_step(c, kiln);
        s.activation = "Relu", s.residual = true, s.post = "Relu";
        c = qconv_case(s);
        c.kernel = kiln, c.threads = threads;
        expect_within_one_step(c, kiln);
        s.activation = "Silu", s.residual = false, s.post.clear();
        c = qconv_case(s);
        c.kernel = kiln, c.threads = threads;
        expect_within_one_step(c, kiln);
      }
    }
  }
  QConv dilated{1, 64, 12, 10, 48, 3, 1, 1};
  Case c = qconv_case(dilated);
  for (Attribute& a : c.attrs)
    if (a.name == "pads") a = attr("pads", std::vector<int64_t>{2, 1, 2, 1});
  c.attrs.push_back(attr("dilations", std::vector<int64_t>{2, 1}));
  c.kernel = kiln;
  expect_within_one_step(c, kiln);
  // The default rule: on AMX only, where the windows' product runs on its tiles.
  const CpuFeatures vnni = *CpuFeatures::named("avx512-vnni"), amx = *CpuFeatures::named("amx");
  const int64_t l2 = cpu::gemm::CacheSizes::host().l2;
  // kiln's direct kernel takes the small ones of 64 input channels or fewer where this CPU has
  // AMX too (DirectQFusedConvOnAmxTiles); oneDNN's otherwise.
  const std::string small = CpuFeatures::host().amx ? "kiln.qconv_direct_u8s8_avx512" : "onednn.qconv";
  struct Rule {
    QConv s;
    int threads;
    std::string on_amx;
  };
  for (const Rule& r : std::vector<Rule>{
           {{1, 96, 10, 10, 64, 1, 2, 1}, 2, kiln},                 // strided 1x1
           {{1, 64, 10, 10, 80, 3, 1, 1}, 1, kiln},                 // 9.2 MOP (80 channels out: not the direct kernel's)
           {{1, 64, 10, 10, 80, 3, 1, 1}, 2, kiln},
           {{1, 48, 10, 10, 80, 3, 1, 1}, 1, "onednn.qconv"},       // fewer than 64 input channels
           {{1, 48, 10, 10, 64, 3, 1, 1}, 1, small},
           {{1, 64, 29, 29, 128, 3, 1, 1}, 1, "onednn.qconv"},      // 124 MOP
           {{1, 64, 2, 3, 80, 3, 1, 1}, 1, "onednn.qconv"},         // 6 pixels: not on AMX tiles
           {{1, 64, 2, 3, 64, 3, 1, 1}, 1, small},
           // 2.25 MiB of weight over 49 pixels: kiln's at one thread where it outgrows L2.
           {{1, 512, 7, 7, 512, 3, 1, 1}, 1, 9 * 512 * 512 >= l2 ? kiln : "onednn.qconv"},
           {{1, 512, 7, 7, 512, 3, 1, 1}, 2, "onednn.qconv"}}) {
    SCOPED_TRACE(std::to_string(r.s.h) + "x" + std::to_string(r.s.w) + "x" + std::to_string(r.s.c) + " -> " + std::to_string(r.s.m) +
                 " k" + std::to_string(r.s.k) + " threads " + std::to_string(r.threads));
    Case rc = qconv_case(r.s);
    rc.inputs[2] = scalar_int(DType::u8, 0);  // after a ReLU
    rc.threads = r.threads;
    expect_within_one_step(rc, "onednn.qconv", &vnni);
    expect_within_one_step(rc, r.on_amx, &amx);
  }
}

// prepack_weights stores the weights of kiln's int8 convolutions in the GEMM's panels (a 3x3
// one's in its windows' order, where its input channels are a multiple of 4), and a plan of
// the stored model multiplies by those bytes where they lie, with the same outputs as the plain
// weight gave; 70 input channels leave the windows' weight plain (a group of 4 K steps would
// span two taps), packed while planning as before.
TEST(Int8Kernels, QFusedConvWeightsAreStoredInTheirPanels) {
  SKIP_WITHOUT_VNNI();
  struct Form {
    std::string kernel;
    QConv s;
    const char* layout;  // the stored weight's packed_for; null: stored plain
  };
  for (const Form& f : std::vector<Form>{{"kiln.qconv_u8s8_avx512", {1, 70, 5, 7, 50, 1, 1, 1}, "kiln gemm_u8s8 nr48"},
                                         {"kiln.qconv_windows_u8s8_avx512", {1, 64, 9, 11, 40, 3, 1, 1}, "kiln gemm_u8s8 nr48 windows"},
                                         {"kiln.qconv_windows_u8s8_avx512", {1, 70, 9, 8, 50, 3, 2, 1}, nullptr}}) {
    SCOPED_TRACE(f.kernel + " " + std::to_string(f.s.c) + " channels");
    Case c = qconv_case(f.s);
    c.kernel = f.kernel;
    const Tensor w = testing::expect_stored_weight_used_in_place(c, 3);
    ASSERT_EQ(w.is_packed(), f.layout != nullptr);
    if (f.layout) {
      EXPECT_EQ(w.layout()->packed_for, f.layout);
    }
  }
}

// In a graph the residual dies at the convolution, so its output takes the residual's memory
// (Kernel::overwrites_input): each value of Z is read before Y's is written there.
TEST(Int8Kernels, PointwiseQFusedConvWritesOverItsResidual) {
  SKIP_WITHOUT_VNNI();
  QConv s;
  s.c = 96, s.h = 6, s.w = 8, s.m = 64, s.k = 1, s.residual = true, s.activation = "Relu", s.post = "Relu";
  const Case c = qconv_case(s);
  Model m;
  Graph& g = m.graph;
  const ValueId x = g.add_value("x", DType::u8, Shape::of(c.inputs[0].shape()));
  const ValueId zf = g.add_value("zf", DType::f32, Shape::of(c.inputs[9].shape()));
  g.inputs = {x, zf};
  Node q;  // Z quantized by the graph: an intermediate in the arena
  q.name = "quantize_z";
  q.op = "QuantizeLinear";
  const ValueId z = g.add_value("z", DType::undefined);
  q.inputs = {zf, g.add_constant("zs", c.inputs[10]), g.add_constant("zz", c.inputs[11])};
  q.outputs = {z};
  g.add_node(std::move(q));
  Node n;
  n.name = "conv";
  n.op = "QFusedConv";
  n.inputs = {x};
  for (size_t i = 1; i < 9; ++i) n.inputs.push_back(g.add_constant("c" + std::to_string(i), c.inputs[i]));
  n.inputs.insert(n.inputs.end(), {z, g.add_constant("zs2", c.inputs[10]), g.add_constant("zz2", c.inputs[11])});
  for (const Attribute& a : c.attrs) n.set_attr(a.name, a.value);
  n.kernel = KernelChoice{"kiln.qconv_u8s8_avx512", {}};
  const ValueId y = g.add_value("y", DType::undefined);
  n.outputs = {y};
  g.add_node(std::move(n));
  Node dq;  // Y read by the graph too: an intermediate, which may take Z's place
  dq.name = "dequantize_y";
  dq.op = "DequantizeLinear";
  const ValueId out = g.add_value("out", DType::undefined);
  dq.inputs = {y, g.add_constant("ys", c.inputs[6]), g.add_constant("yz", c.inputs[7])};
  dq.outputs = {out};
  g.outputs = {out};
  g.add_node(std::move(dq));
  ASSERT_TRUE(infer_graph(g).ok());
  Tensor zin(DType::f32, c.inputs[9].shape());
  for (int64_t i = 0; i < zin.numel(); ++i)
    zin.data<float>()[i] = (static_cast<float>(c.inputs[9].data<uint8_t>()[i]) - 120.f) * c.inputs[10].data<float>()[0];
  auto fast = Session::create(m, SessionOptions{});
  auto ref = Session::create(m, SessionOptions{.reference = true});
  ASSERT_TRUE(fast.ok() && ref.ok());
  const std::vector<Tensor> feed = {c.inputs[0], zin};
  auto got = (*fast)->run(feed);
  auto want = (*ref)->run(feed);
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ((*fast)->kernels().size(), 3u);
  EXPECT_EQ((*fast)->kernels()[1].name, "kiln.qconv_u8s8_avx512");
  // Z and Y in one place: the arena holds one of them.
  const size_t y_bytes = static_cast<size_t>(shape_numel(c.inputs[9].shape()));
  EXPECT_LT((*fast)->memory_stats().arena_bytes, 2 * y_bytes);
  const float step = c.inputs[6].data<float>()[0];
  double worst = 0;
  for (int64_t i = 0; i < (*got)[0].numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs((*got)[0].data<float>()[i] - (*want)[0].data<float>()[i])));
  EXPECT_LE(worst, step * 1.001);
  const std::vector<double> v = (*want)[0].to_double_vector();
  EXPECT_GT(*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end()), 20 * step);
}

}  // namespace
}  // namespace kiln
