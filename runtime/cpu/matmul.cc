// kiln.gemm_f32_<isa>: MatMul, FusedMatMul and Gemm on kiln's own GEMM templates
// (runtime/cpu/gemm/), and channels-last convolutions as the product of their windows (a
// pointwise one's pixels read where they lie, any other's windows gathered into rows first)
// where the rule measured it faster than oneDNN (gemm_defers). A product whose B has no batch (a linear layer's weight) is one tall GEMM
// over all of A's rows; otherwise each batch index (numpy broadcasting, offsets worked out in
// prepare) is one GEMM. A constant 2-D B is packed once in prepare for the tile's NR (or used
// where a compiled model mapped it, when it was stored packed that way); Gemm's transposed
// operands are read through the packing, never copied whole. The epilogue (bias, activation,
// residual Z or Gemm's full C, second activation) runs on each tile as it is finished.
//
// The template's parameters are the node's recorded ones (KernelChoice::params) when the model
// pinned this kernel with them, and otherwise gemm::default_params for the shapes and threads;
// a recorded thread grid made for another thread count is derived again for the target's.
#include <algorithm>
#include <cstring>
#include <numeric>

#include <omp.h>

#include "formats/huge_pages.h"
#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/linear.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

bool is_conv(const Node& n) { return n.op == "Conv" || n.op == "FusedConv"; }

// The default rule's share of the f16 convolutions: oneDNN (f32, the weight widened) keeps,
// over more than one pixel,
// - those of fewer than 16 input channels (ResNet-50's stem, 3: its windows are short runs to
//   gather; run alone, 1.65-1.72 against oneDNN's 1.49-1.87 ms at one thread and 0.82-1.19
//   against 0.74-0.98 at two);
// - those of 32 or fewer output channels, which leave half or more of the 64-column tile empty
//   (YOLO's and EfficientNet-B0's: 1.3-2.1x oneDNN's time at one thread, 1.4-2.9x at two);
// - the 3x3 stride-1 ones of 64 or fewer output channels that kiln's Winograd (tried first)
//   leaves, where oneDNN's Winograd does a
//   quarter of the multiplies (ResNet-50's 56x56 ones in the model: a tie at one thread, 1.09-1.14x
//   oneDNN's time at two; YOLO's 20x20 ones a tie);
// - the 1x1 ones of 32 or fewer input channels over 784 pixels or more (28x28), whose few
//   multiplies per output leave the f16 kernel slower than f32 (6 alternated profiles of the
//   fp16 models on the AMX-less Xeon, one / two threads: MobileNetV2's 24 to 144 at 28x28 1.40x
//   their f32 time at two, 32 to 192 0.87-0.97 / 0.98-1.19, EfficientNet-B0's 24 to 144 1.20x
//   at two).
// One pixel (an SE block's squeeze and excite) is a call's fixed cost, less in kiln's kernel.
// The rule kept 64 or fewer input channels f32 until the f16 kernel summed four blocks in f16
// before widening them and blocked A's rows by L2 with C's; now the f16 kernel runs those of
// 33-64 in 0.74-0.98 of their f32 time (the same profiles: ResNet-50's 56x56 downsample 0.79 /
// 0.74, its 64 to 64 0.89 / 0.83, 64 to 256 0.96-0.99; YOLO's 64-channel ones 0.81-0.91,
// EfficientNet-B0's 40 to 240 at 28x28 0.90-0.95). Where such a stage is part of an inverted
// residual block, the fused block is faster still (gemm::f16_pointwise_fuses).
std::optional<std::string> f16_defers(const KernelQuery& q) {
  if (!is_conv(q.node)) return std::nullopt;
  const std::vector<int64_t> x = q.inputs[0].shape.concrete(), w = q.inputs[1].shape.concrete();
  if (x[1] * x[2] == 1) return std::nullopt;
  if (auto why = gemm::f16_conv_stays_f32(x[3], w[0], x[1] * x[2], w[2] == 1 && w[3] == 1)) return why;
  if (w[0] <= 64 && w[2] == 3 && w[3] == 3 && q.node.attr_ints("strides", {1, 1}) == std::vector<int64_t>{1, 1} &&
      q.node.attr_int("group", 1) == 1)
    return "oneDNN's Winograd is as fast on 3x3 stride-1 convolutions of 64 or fewer output channels";
  return std::nullopt;
}

// A channels-last 2-D convolution that a GEMM can run over its windows (the f16 one's
// gemm_f16_windows, the f32 one's gathered rows): any filter size, stride, dilation and
// padding, no groups.
std::optional<std::string> windows_declines(const KernelQuery& q) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4 || q.inputs[1].shape.rank() != 4) return "not 2-D";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  if (q.node.attr_int("group", 1) != 1) return "grouped";
  return std::nullopt;
}

// The input channels from which kiln's GEMM takes gathered windows on a CPU without AVX-512
// (gemm_defers).
constexpr int64_t kAvx2WindowChannels = 128;

// The default rule on convolutions kiln's GEMM can run: oneDNN's convolution is the faster one
// unless
// - the weight outgrows L2 and outweighs the input (fewer pixels than output channels):
//   ResNet-50's last stage, whose weights stream in on every call while kiln's GEMM fetches
//   each next panel ahead (pointwise: 0.83-0.93 of oneDNN's time on one and two threads).
//   This is the only case for a convolution other than pointwise (its windows gathered into
//   rows of A first; 3x3 stride-1 ones go to Winograd first), and there only over a quarter as
//   many pixels as output channels or fewer: ResNet-50's 3x3 stride-2 512-channel layer (49
//   pixels) takes 0.83 / 0.86 of oneDNN's time at one / two threads, the 256-channel one before
//   it (196 pixels) 1.05 / 1.11 (8 alternated `kiln profile` rounds of the model each way);
// - on a CPU without AVX-512, the windows have 128 input channels or more: oneDNN 2.6's AVX2
//   direct convolution of channels-last tensors ran ResNet-50's 3x3 stride-2 layers of 128 and
//   256 channels at 19-42 GFLOP/s, 2.9x and 1.7x kiln's time, and YOLO's of 128 channels 1.3x
//   (max-autotune's in-graph timings on a Zen 3 core, one thread); over 16-64 channels (YOLO's
//   other stride-2 layers) it stayed the faster;
// - a call's fixed cost is the time (one pixel: an SE block's squeeze and excite, 2-5x faster
//   here);
// - the output has 48 channels or fewer (one 8x48 tile's width) from 64 or more over 3,136
//   pixels (56x56) or more: the mobile networks' first projections (96 or 144 to 24 channels:
//   0.78-0.85 of oneDNN's time in the models at one and two threads; 144 to 32 or 40 at 28x28
//   ties, and 32 to 16 at 112x112 loses, 1.24);
// - 64 pixels or fewer into at least 8 times as many output channels as pixels: MobileNetV2's last 7x7
//   expansions (160 to 960 and 320 to 1280, ReLU6) took 0.92-0.94 of oneDNN's time at one
//   thread and 0.94-0.98 at two (6 alternated profiles of the AMX Xeon; the model 0.986 at
//   one); its 960 to 320 projection (fewer) lost at two, 1.12;
// - a residual is summed into 256 output channels or more, or on one thread 160 or more (a
//   bottleneck's expansion), which kiln's GEMM adds its product to where Z lies
//   (GemmKernel::sums_into_z_): on one thread ResNet-50's 13 such layers on oneDNN took
//   0.94-1.01 of their time (0.97 together), MobileNetV2's and EfficientNet-B0's 7x7 ones
//   0.90-0.95; on two, ResNet-50's 0.88-0.96 (the AMX Xeon), MobileNetV2's 160-channel ones
//   1.08-1.11; into 32-112 channels (MobileNetV2's and EfficientNet-B0's 14x14 and 28x28
//   layers) 1.01-1.24, which stay on oneDNN;
// - or the epilogue is a transcendental activation, which kiln's row kernels compute faster
//   than oneDNN's post-ops (SiLU layers: 0.85-1.0 of oneDNN's time; ReLU, Clip or none: 1.0-1.7).
// docs/architecture.md has the tables.
std::optional<std::string> gemm_defers(const KernelQuery& q) {
  // X in parts, an image read as it comes (whose patches kiln.direct_conv left to it), or a
  // weight computed at run time: no later kernel takes them.
  if (!is_conv(q.node) || q.node.has_attr("x_parts") || nn::x_channels_first(q.node) || !q.inputs[1].value) return std::nullopt;
  const std::vector<int64_t> y = q.outputs[0].shape.concrete(), w = q.inputs[1].shape.concrete();  // y's pixels: a strided one's
  const int64_t pixels = y[0] * y[1] * y[2];
  const bool streams = w[0] * w[1] * w[2] * w[3] * 4 >= gemm::CacheSizes::host().l2;
  if (pointwise_declines(q, 1, true)) {  // gathered windows
    if (streams && 4 * pixels <= w[0]) return std::nullopt;
    if (!q.target.cpu.avx512f) {
      if (w[1] >= kAvx2WindowChannels) return std::nullopt;
      return "oneDNN's convolution is faster on windows of fewer than " + std::to_string(kAvx2WindowChannels) +
             " input channels whose weight fits L2 or that are more than a quarter of the output channels";
    }
    return "oneDNN's convolution is faster on windows whose weight fits L2 or that are more than a quarter of the output channels";
  }
  if (streams && pixels < w[0]) return std::nullopt;
  if (y[1] * y[2] == 1) return std::nullopt;
  if (w[0] <= 48 && w[1] >= 64 && pixels >= 3136) return std::nullopt;
  if (pixels <= 64 && w[0] >= 8 * pixels) return std::nullopt;
  if (q.has_input(3) && w[0] >= (q.target.threads <= 1 ? 160 : 256)) return std::nullopt;
  if (piecewise_linear_activation(q.node))
    return "oneDNN is faster on pointwise convolutions over many pixels with a piecewise-linear epilogue";
  return std::nullopt;
}

// The columns no register tile may straddle: where a FusedMatMul's split outputs begin, after
// the first (at column 0), or a gated product's block of values or gates (gate_block); none
// for a plain product.
std::vector<int64_t> split_points(const Node& node) {
  if (const int64_t g = node.attr_int("gate_block", 0); g > 0) return {g};
  std::vector<int64_t> points;
  int64_t at = 0;
  const std::vector<int64_t> splits = node.attr_ints("splits");
  for (size_t i = 0; i + 1 < splits.size(); ++i) points.push_back(at += splits[i]);
  return points;
}

// No tile straddles two outputs: every split point is a multiple of the tile's NR.
bool tile_splits(const gemm::Tile& t, const std::vector<int64_t>& points) {
  return std::all_of(points.begin(), points.end(), [&](int64_t p) { return p % t.nr == 0; });
}

// Why a product with split outputs cannot run on a GEMM whose register tiles are `tiles` (some
// tile's width must divide every split point), or nullopt; nullopt without splits.
std::optional<std::string> split_declines(const KernelQuery& q, std::span<const gemm::Tile> tiles) {
  const std::vector<int64_t> points = split_points(q.node);
  if (points.empty()) return std::nullopt;
  if (q.inputs[1].shape.rank() != 2) return "split outputs or gates of a batched product";
  for (const InferOutput& y : q.outputs)
    if (y.dtype == DType::undefined) return "an omitted split output";
  if (std::none_of(tiles.begin(), tiles.end(), [&](const gemm::Tile& t) { return tile_splits(t, points); }))
    return "split points that no tile's width divides";
  return std::nullopt;
}

// A FusedMatMul's split outputs as parts of C: where each begins, its width as `ldc`, and
// whether `activated` leaves it plain; none without splits. Their data are filled in at run.
std::vector<gemm::ColumnPart> column_parts(const Node& node) {
  std::vector<gemm::ColumnPart> parts;
  int64_t begin = 0;
  const std::vector<int64_t> splits = node.attr_ints("splits"), on = node.attr_ints("activated");
  for (size_t i = 0; i < splits.size(); ++i) {
    parts.push_back({.begin = begin, .ldc = splits[i], .plain = i < on.size() && on[i] == 0});
    begin += splits[i];
  }
  return parts;
}

// `parts` pointing at this run's outputs.
std::span<const gemm::ColumnPart> parts_at(std::vector<gemm::ColumnPart>& parts, KernelContext& ctx) {
  for (size_t i = 0; i < parts.size(); ++i) parts[i].c = ctx.output(i).data<float>();
  return parts;
}

// A convolution kiln's f32 GEMM runs as the product of its windows: a channels-last pointwise
// one reads its pixels where they lie; any other (strides, padding, larger kernels, dilations)
// has its windows gathered into rows of A in the workspace first, at most kMaxWindowBytes of
// them.
constexpr int64_t kMaxWindowBytes = int64_t{16} << 20;

std::optional<std::string> f32_windows_declines(const KernelQuery& q) {
  // A pointwise convolution's weight computed at run time (compile's fuse_channel_scale: the
  // weight scaled by a squeeze-excitation's gates), packed once a run (GemmKernel::run).
  if (!q.inputs[1].value && !nn::x_channels_first(q.node) && !pointwise_shape_declines(q, 1)) return std::nullopt;
  if (auto why = windows_declines(q)) return why;
  if (!pointwise_declines(q, 1) && !nn::x_channels_first(q.node)) return std::nullopt;
  const std::vector<int64_t> y = q.outputs[0].shape.concrete(), w = q.inputs[1].shape.concrete();
  if (y[0] * y[1] * y[2] * w[1] * w[2] * w[3] * 4 > kMaxWindowBytes) return "its windows would take more than 16 MiB";
  return std::nullopt;
}

std::optional<std::string> gemm_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  // A constant f16 weight (`--precision fp16`) is widened to f32 as it is packed: a 2-D one, or
  // a convolution's, which the f16 GEMM's rule leaves to f32 (f16_defers) and this kernel's
  // then takes as it takes an f32 one; bf16 ones run on kiln.gemm_bf16_avx512, which rounds A
  // to bf16 as their reference does.
  if (auto why = f32_and_concrete(q, DType::f16)) return why;
  if (q.inputs[1].dtype == DType::f16 && !is_conv(q.node) && q.inputs[1].shape.rank() != 2) return "an f16 B that is not 2-D";
  if (q.node.attr_int("x_parts", 0) > static_cast<int64_t>(gemm::kMaxAParts)) return "X in more than 16 parts";
  // An image read as it comes (x_channels_first): its patches, where the windows tile it.
  if (nn::x_channels_first(q.node) && !windows_tile_image(q)) return x_form_decline(q);
  if (is_conv(q.node)) return q.node.has_attr("x_parts") ? pointwise_declines(q, 1) : f32_windows_declines(q);
  if (q.inputs[0].shape.rank() < 2 || q.inputs[1].shape.rank() < 2) return "1-D operands";
  if (q.node.op == "Gemm") return gemm_form_declines(q);
  return split_declines(q, gemm::tiles(isa));
}

// The product a node is: A, B and Y as matrices (a convolution's output pixels' windows as rows
// of KH·KW·C, its [K, C, KH, KW] weight as Bᵀ), the transposes, and M×N×K over `batches` GEMMs. A B
// without a batch (a linear layer's weight) folds A's batch into M: one GEMM.
struct Product {
  std::vector<int64_t> a, b, y;
  bool trans_a = false, trans_b = false, b_flat = false;
  int64_t m = 0, n = 0, k = 0, batches = 1;
};

Product product_of(const KernelQuery& q) {
  Product p;
  const bool conv = is_conv(q.node), gemm_op = q.node.op == "Gemm";
  p.a = q.inputs[0].shape.concrete();
  p.b = q.inputs[1].shape.concrete();
  p.y = q.outputs[0].shape.concrete();
  if (const std::vector<int64_t> splits = q.node.attr_ints("splits"); !splits.empty() && !p.y.empty())
    p.y.back() = std::accumulate(splits.begin(), splits.end(), int64_t{0});  // the whole of Y, before its split
  if (q.node.attr_int("gate_block", 0) > 0 && !p.y.empty()) p.y.back() *= 2;  // values and gates
  if (conv) {  // [N, H, W, C] · [K, C, KH, KW]ᵀ: the output pixels' windows (KH·KW·C) by the weight transposed
    const int64_t taps = p.b.size() == 4 ? p.b[2] * p.b[3] : 1;
    p.a = {p.y[0] * p.y[1] * p.y[2], p.b[1] * taps};  // C whole, also when X comes in parts (x_parts)
    p.b = {p.b[0], p.b[1] * taps};
    p.y = {p.y[0] * p.y[1] * p.y[2], p.y[3]};
  }
  p.trans_a = gemm_op && q.node.attr_int("transA", 0) != 0;
  p.trans_b = conv || (gemm_op && q.node.attr_int("transB", 0) != 0);
  p.k = p.trans_a ? p.a[p.a.size() - 2] : p.a.back();
  p.n = p.y.back();
  p.b_flat = shape_numel(std::span(p.b).first(p.b.size() - 2)) == 1;
  if (p.b_flat && !p.trans_a) {
    p.m = shape_numel(std::span(p.a).first(p.a.size() - 1));
  } else {
    p.m = p.y[p.y.size() - 2];
    p.batches = shape_numel(std::span(p.y).first(p.y.size() - 2));
  }
  return p;
}

// max-autotune's axes, searched in this order from the default parameters: the register tile
// (each of the ISA's), Kc, packing A, Mc, Nc, and the thread grid (every split of the threads
// over M and N, and whole products per thread when there are enough). Blocks are candidates
// up to the product's size; prepare rounds them to whole tiles.
std::vector<TuningAxis> gemm_space(const KernelQuery& q, Isa isa) {
  const Product p = product_of(q);
  std::vector<TuningAxis> axes;
  TuningAxis tile{"tile", {}};
  const std::vector<int64_t> points = split_points(q.node);
  for (const gemm::Tile& t : gemm::tiles(isa))
    if (tile_splits(t, points)) tile.values.push_back({{"mr", int64_t{t.mr}}, {"nr", int64_t{t.nr}}});
  axes.push_back(std::move(tile));
  axes.push_back(size_axis("kc", {64, 128, 256, 512}, p.k));
  if (!q.node.has_attr("x_parts"))  // X in parts is read where it lies, never packed
    axes.push_back(TuningAxis{"pack_a", {{{"pack_a", int64_t{0}}}, {{"pack_a", int64_t{1}}}}});
  axes.push_back(size_axis("mc", {48, 96, 192, 384, 768}, p.m));
  axes.push_back(size_axis("nc", {256, 512, 1024, 2048, 4096}, p.n));
  const int threads = std::max(1, q.target.threads);
  if (threads > 1) {
    TuningAxis grid{"threads", {}};
    for (int tm = 1; tm <= threads; ++tm)
      if (threads % tm == 0)
        grid.values.push_back({{"tm", int64_t{tm}}, {"tn", int64_t{threads / tm}}, {"tb", int64_t{1}}});
    if (p.batches >= threads) grid.values.push_back({{"tm", int64_t{1}}, {"tn", int64_t{1}}, {"tb", int64_t{threads}}});
    axes.push_back(std::move(grid));
  }
  return axes;
}

// A recorded integer parameter of the node, if it has it.
std::optional<int64_t> recorded_int(const Node& node, std::string_view key) {
  const int64_t* i = node.kernel.param<int64_t>(key);
  return i ? std::optional<int64_t>(*i) : std::nullopt;
}

// The parameters of a node that pinned this kernel with some: those it recorded, the rest the
// defaults for its tile (the recorded one, else the default) on this product. Blocks are
// rounded to whole tiles: max-autotune's candidates name sizes, not tile multiples.
std::optional<gemm::GemmParams> recorded_params(const Node& node, Isa isa, int64_t m, int64_t n, int64_t k, int threads) {
  if (node.kernel.params.empty()) return std::nullopt;
  const std::optional<int64_t> mr = recorded_int(node, "mr"), nr = recorded_int(node, "nr");
  const gemm::CacheSizes& caches = gemm::CacheSizes::host();
  const gemm::Tile fallback = gemm::default_tile(isa, m, n, k, caches);
  const gemm::Tile tile = mr && nr ? gemm::Tile{static_cast<int>(std::clamp<int64_t>(*mr, 0, 1024)), static_cast<int>(std::clamp<int64_t>(*nr, 0, 1024))}
                                   : fallback;
  const std::span<const gemm::Tile> tiles = gemm::tiles(isa);
  const bool known = std::find(tiles.begin(), tiles.end(), tile) != tiles.end();
  gemm::GemmParams p = gemm::default_params(isa, known ? tile : fallback, caches, m, n, k, threads);
  p.tile = tile;  // invalid() names a tile the ISA lacks
  auto whole_tiles = [](int64_t block, int64_t size) {
    if (size <= 0 || block <= 0) return block;  // invalid() says why
    block = std::min<int64_t>(block, int64_t{1} << 40);
    return (block + size - 1) / size * size;
  };
  if (auto v = recorded_int(node, "mc")) p.mc = whole_tiles(*v, tile.mr);
  if (auto v = recorded_int(node, "nc")) p.nc = whole_tiles(*v, tile.nr);
  if (auto v = recorded_int(node, "kc")) p.kc = *v;
  if (auto v = recorded_int(node, "tm")) p.tm = static_cast<int>(std::clamp<int64_t>(*v, 0, 1 << 20));
  if (auto v = recorded_int(node, "tn")) p.tn = static_cast<int>(std::clamp<int64_t>(*v, 0, 1 << 20));
  if (auto v = recorded_int(node, "pack_a")) p.pack_a = *v != 0;
  return p;
}

class GemmKernel final : public Kernel {
 public:
  explicit GemmKernel(Isa isa) : isa_(isa) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const bool fused = q.node.op == "FusedMatMul" || q.node.op == "FusedConv";
    const Product p = product_of(q);
    const std::vector<int64_t>&a = p.a, &b = p.b, &y = p.y;
    trans_a_ = p.trans_a;
    trans_b_ = p.trans_b;
    k_ = p.k;
    n_ = p.n;
    m_ = p.m;
    batch_a_.clear();
    batch_b_.clear();
    if (p.b_flat && !trans_a_) {
      batch_a_ = {0};
      batch_b_ = {0};
    } else {
      // Offsets of each output batch index's A and B matrices, broadcasting as numpy does.
      std::vector<int64_t> ad(a.begin(), a.end() - 2), bd(b.begin(), b.end() - 2), yd(y.begin(), y.end() - 2);
      ad.insert(ad.begin(), yd.size() - ad.size(), 1);
      bd.insert(bd.begin(), yd.size() - bd.size(), 1);
      for (int64_t index = 0; index < p.batches; ++index) {
        int64_t rest = index, ao = 0, bo = 0, as = 1, bs = 1;
        for (size_t d = yd.size(); d-- > 0;) {
          const int64_t i = rest % yd[d];
          rest /= yd[d];
          ao += (ad[d] == 1 ? 0 : i) * as;
          bo += (bd[d] == 1 ? 0 : i) * bs;
          as *= ad[d];
          bs *= bd[d];
        }
        batch_a_.push_back(ao * a[a.size() - 2] * a.back());
        batch_b_.push_back(bo * b[b.size() - 2] * b.back());
      }
    }
    lda_ = a.back();
    ldb_ = b.back();
    // The bias: FusedMatMul's [N], or Gemm's C when it is one row; else C (or Z) is a residual.
    bias_input_ = z_input_ = -1;
    if (q.has_input(2)) {
      const std::vector<int64_t> c = q.inputs[2].shape.concrete();
      if (fused || c.size() == 1 || c[0] == 1) bias_input_ = 2;
      else z_input_ = 2;
    }
    if (fused && q.has_input(3)) z_input_ = 3;
    if (fused) {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
    }
    // The template's parameters: recorded, or the defaults for these shapes; the threads go to
    // whole products when there are at least as many as threads (attention's heads), each
    // product then on one thread, and otherwise to each product's grid.
    const int threads = std::max(1, q.target.threads);
    const bool pinned = q.node.kernel.name == impl_name(isa_);
    std::optional<gemm::GemmParams> rec = pinned ? recorded_params(q.node, isa_, m_, n_, k_, threads) : std::nullopt;
    bool grid_recorded = false;
    batch_threads_ = 1;
    if (rec) {
      if (auto why = rec->invalid()) return user_error(q.node.where(), "the recorded GEMM parameters are invalid: " + *why);
      params_ = gemm::fit(*rec, m_, n_, k_);
      for (const char* key : {"tm", "tn", "tb"}) grid_recorded |= recorded_int(q.node, key).has_value();
      batch_threads_ = static_cast<int>(std::clamp<int64_t>(recorded_int(q.node, "tb").value_or(1), 1, 1024));
      if (!tile_splits(params_.tile, split_points(q.node)))
        return user_error(q.node.where(), "the recorded GEMM tile " + params_.name() + " straddles the split outputs or gate blocks");
    } else {
      // With split outputs (or gates), the preferred tile whose width divides every split point.
      const gemm::CacheSizes& caches = gemm::CacheSizes::host();
      gemm::Tile tile = gemm::default_tile(isa_, m_, n_, k_, caches);
      const std::vector<int64_t> points = split_points(q.node);
      for (const gemm::Tile& t : gemm::tiles(isa_))
        if (!tile_splits(tile, points) && tile_splits(t, points)) tile = t;
      params_ = gemm::default_params(isa_, tile, caches, m_, n_, k_, threads);
    }
    parts_ = column_parts(q.node);
    // X in parts (a Concat's inputs, fuse_concat): input 0, then those after Z, each its columns.
    a_parts_.clear();
    a_inputs_.clear();
    if (q.node.has_attr("x_parts")) {
      int64_t begin = 0;
      for (size_t i = 0; i < q.inputs.size(); ++i) {
        if (i != 0 && i < 4) continue;
        const int64_t c = q.inputs[i].shape.concrete().back();
        a_parts_.push_back({.begin = begin, .lda = c});
        a_inputs_.push_back(i);
        begin += c;
      }
      if (begin != k_) return internal_error(q.node.where(), "the parts of X do not add up to the weight's channels");
    }
    // No thread grid recorded, or one made for another thread count: the rule's.
    if (!grid_recorded || params_.threads() * batch_threads_ != threads) {
      const int64_t batches = static_cast<int64_t>(batch_a_.size());
      const gemm::GemmParams grid = gemm::default_params(isa_, params_.tile, gemm::CacheSizes::host(), m_, n_, k_, threads);
      const bool whole = batches > 1 && threads > 1 && batches >= threads;
      batch_threads_ = whole ? threads : 1;
      params_.tm = whole ? 1 : grid.tm;
      params_.tn = whole ? 1 : grid.tn;
    }
    // A convolution other than a stride-1 pointwise one reads its windows gathered into rows of
    // A (a strided pointwise one: its pixels).
    windows_ = false;
    win_ = {};
    x_planes_ = nn::x_channels_first(q.node);
    if (is_conv(q.node) && !q.node.has_attr("x_parts")) {
      KILN_ASSIGN_OR_RETURN(win_, image_windows(q));
      images_ = q.inputs[0].shape.concrete()[0];
      windows_ = x_planes_ || pointwise_shape_declines(q, 1).has_value();
    }
    const int64_t taps = win_.kh * win_.kw;
    // A constant B of one matrix: packed once for the tile's NR (a convolution's weight first
    // laid out [K, KH, KW, C], the windows' order, when its kernel is larger than 1x1; an image
    // read channels-first has its windows in the weight's own order, [C, KH, KW]).
    b_packed_ = false;
    packed_ = Tensor();
    if (const Tensor* w = q.inputs[1].value; w && batch_b_.size() == 1 && batch_b_[0] == 0) {
      const bool reorder = taps > 1 && !x_planes_;
      const PackedLayout want = reorder ? gemm::packed_b_windows_layout(n_, win_.c, taps, params_.tile.nr)
                                        : gemm::packed_b_layout(k_, n_, params_.tile.nr, trans_b_);
      // Stored packed this way (used where it is mapped), or packed so by an earlier plan.
      packed_ = packed_before(q, *w, want, DType::f32);
      if (!packed_.defined()) {
        Tensor plain = w->dtype() == DType::f32 ? (w->is_packed() ? unpack(*w) : *w) : gemm::widened_to_f32(*w);  // f16
        if (reorder) plain = in_windows_order(plain.data<float>(), DType::f32, n_, win_);
        Tensor packed = huge_page_tensor(DType::f32, {gemm::packed_b_floats(k_, n_, params_.tile.nr)});
        gemm::pack_b(plain.data<float>(), trans_b_ ? k_ : n_, trans_b_, k_, n_, params_.tile.nr, packed.data<float>());
        packed_ = packed.as_packed(DType::f32, w->shape(), want);
        keep_packed(q, *w, packed_);
      }
      b_packed_ = true;
      // An f16 weight is stored as it is (half the bytes). A reordered one is stored in its
      // panels too (packed_b_windows_layout), so that planning does not reorder and pack it
      // again: ResNet-50's three 3x3 convolutions on this kernel (28 MB of weight) took 52 of
      // the 113 ms of creating its session at one thread.
      store_packed_ = w->dtype() == DType::f32;
    } else if (w && w->is_packed()) {
      plain_b_ = unpack(*w);  // a batched weight stored packed: read plain
    }
    // A pointwise convolution's weight computed at run time (fuse_channel_scale's): packed once
    // a run into the workspace, not by every block of rows that each thread's share queue
    // hands it (a 28x28 projection of 144 channels to 40 took 89 µs so at two threads, 42 on
    // oneDNN with its weight constant).
    pack_each_run_ = !q.inputs[1].value && is_conv(q.node) && !windows_ && batch_b_.size() == 1 && batch_b_[0] == 0;
    const size_t run_packed_bytes = pack_each_run_ ? gemm::packed_b_floats(k_, n_, params_.tile.nr) * sizeof(float) : 0;
    gemm::GemmProblem shape{.m = m_, .n = n_, .k = k_, .b_packed = b_packed_ || pack_each_run_};
    gemm_bytes_ = gemm::workspace_bytes(params_, shape) * static_cast<size_t>(batch_threads_);
    gate_block_ = q.node.attr_int("gate_block", 0);
    const size_t gate_bytes = gate_block_ ? static_cast<size_t>(m_ * n_ / 2) * sizeof(float) : 0;  // the gates being summed
    gates_at_ = (gemm_bytes_ + 63) / 64 * 64;
    gather_at_ = (gates_at_ + gate_bytes + 63) / 64 * 64;
    run_packed_at_ = (gather_at_ + (windows_ ? static_cast<size_t>(m_ * k_) * sizeof(float) : 0) + 63) / 64 * 64;
    needs.workspace_bytes = run_packed_at_ + run_packed_bytes;
    threads_ = threads;
    // A residual added before the only activation, post(A·B + bias + Z) (ResNet's and the
    // transformers' projections): Y may be put over Z (overwrites_input), and the product is
    // then summed into Z where it lies, its tiles loading Z as a later K slice loads C, instead
    // of reading Z in the epilogue of tiles stored apart. ResNet-50's 56x56 layers took 0.60-0.63
    // of their time so, its 28x28 ones 0.75-0.77, 14x14 0.76-0.86 and 7x7 0.87-0.88, ViT-S/16's
    // 22 projections 0.80-0.98 (10 and 8 alternated profiles, one thread; the products alone,
    // BERT's, ViT's, GPT-2's and ResNet's shapes with Z in cache or not: 0.62-0.98).
    const int64_t z_numel = z_input_ >= 0 ? shape_numel(q.inputs[static_cast<size_t>(z_input_)].shape.concrete()) : 0;
    sums_into_z_ = z_input_ >= 0 && k_ > 0 && act_.kind == Activation::none && parts_.empty() && !gate_block_ &&
                   batch_a_.size() == 1 && z_numel == m_ * n_;
    return {};
  }

  int overwrites_input() const override { return sums_into_z_ ? z_input_ : -1; }

  Tensor packed_input(size_t input) const override { return input == 1 && b_packed_ && store_packed_ ? packed_ : Tensor(); }

  std::vector<std::pair<std::string, KernelParam>> params() const override {
    return {{"mr", int64_t{params_.tile.mr}}, {"nr", int64_t{params_.tile.nr}}, {"mc", params_.mc}, {"nc", params_.nc},
            {"kc", params_.kc},           {"tm", int64_t{params_.tm}},     {"tn", int64_t{params_.tn}},
            {"pack_a", int64_t{params_.pack_a}}, {"tb", int64_t{batch_threads_}}};
  }
  std::string label() const override { return params_.name(); }

  Status run(KernelContext& ctx) override {
    const float* b = b_packed_ ? packed_.data<float>() : plain_b_.defined() ? plain_b_.data<float>() : ctx.input(1).data<float>();
    gemm::GemmProblem g{.m = m_, .n = n_, .k = k_, .lda = lda_, .trans_a = trans_a_, .ldb = ldb_,
                        .trans_b = trans_b_, .b_packed = b_packed_, .ldc = n_};
    g.epilogue.bias = bias_input_ >= 0 ? ctx.input(static_cast<size_t>(bias_input_)).data<float>() : nullptr;
    g.epilogue.z = z_input_ >= 0 ? ctx.input(static_cast<size_t>(z_input_)).data<float>() : nullptr;
    g.epilogue.ldz = n_;
    g.epilogue.act = act_;
    g.epilogue.post = post_;
    g.a = ctx.input(0).data<float>();
    if (windows_) {  // each output pixel's window as a row: KH·KW runs of C channels, zeros outside the image
      float* rows = reinterpret_cast<float*>(ctx.workspace().data() + gather_at_);
      const gemm::ImageWindows& s = win_;
      const float* x = g.a;
      auto gather = [&](int64_t r0, int64_t r1) {  // rows r0..r1 of the output's images × OH
        if (x_planes_) {
          gather_planes(x, rows, r0, r1);
          return;
        }
        const size_t bytes = static_cast<size_t>(s.c) * sizeof(float);
        gather_windows(s, x, rows, r0, r1, [&](float* to, const float* from) { std::memcpy(to, from, bytes); },
                       [&](float* to) { std::memset(to, 0, bytes); });
      };
      const int64_t lines = images_ * s.oh;
      const int threads = std::min(threads_, pool_threads());
      if (threads > 1 && m_ * k_ >= (int64_t{1} << 16)) {
#pragma omp parallel num_threads(threads)
        {
          WorkerSpan span;
          const auto [r0, r1] = even_share(lines, omp_get_num_threads(), omp_get_thread_num());
          gather(r0, r1);
        }
      } else {
        gather(0, lines);
      }
      g.a = rows;
    }
    if (!a_parts_.empty()) {
      for (size_t i = 0; i < a_parts_.size(); ++i) a_parts_[i].a = ctx.input(a_inputs_[i]).data<float>();
      g.a = nullptr;
      g.a_parts = a_parts_;
    }
    g.b = b;
    if (pack_each_run_) {
      float* packed = reinterpret_cast<float*>(ctx.workspace().data() + run_packed_at_);
      gemm::pack_b(b, k_, true, k_, n_, params_.tile.nr, packed);  // the weight [N, K] is Bᵀ
      g.b = packed;
      g.b_packed = true;
    }
    g.c = ctx.output(0).data<float>();
    g.parts = parts_at(parts_, ctx);
    if (sums_into_z_ && g.c == g.epilogue.z) {  // the plan put Y over Z: Y += the product, then the activation
      g.accumulate = true;
      g.epilogue.z = nullptr;
      g.epilogue.act = post_;
      g.epilogue.post = {};
    }
    if (gate_block_) {
      g.ldc = n_ / 2;
      g.gate_block = gate_block_;
      g.gates = reinterpret_cast<float*>(ctx.workspace().data() + gates_at_);
      g.ldgates = n_ / 2;
    }
    if (batch_a_.size() == 1) gemm::run(params_, g, ctx.workspace().data());
    else gemm::run_batch(params_, g, batch_a_, batch_b_, m_ * n_, batch_threads_, ctx.workspace().data());
    return {};
  }

  static std::string impl_name(Isa isa) { return std::string("kiln.gemm_f32_") + isa_name(isa); }

 private:
  // The windows of output rows r0..r1 (of the images × OH) from an image [N, C, H, W] read as it
  // comes, whose windows tile it (gemm_declines): each window's row in the weight's order, C
  // planes of KH runs of KW pixels, each run where it lies in the image.
  void gather_planes(const float* x, float* rows, int64_t r0, int64_t r1) const {
    const gemm::ImageWindows& s = win_;
    const int64_t plane = s.h * s.w;
    for (int64_t r = r0; r < r1; ++r) {
      const float* image = x + (r / s.oh) * s.c * plane + (r % s.oh) * s.sh * s.w;
      float* row = rows + r * s.ow * k_;
      for (int64_t ox = 0; ox < s.ow; ++ox)
        for (int64_t ch = 0; ch < s.c; ++ch)
          for (int64_t ky = 0; ky < s.kh; ++ky, row += s.kw)
            std::memcpy(row, image + ch * plane + ky * s.w + ox * s.sw, static_cast<size_t>(s.kw) * sizeof(float));
    }
  }

  Isa isa_;
  gemm::GemmParams params_;
  int64_t m_ = 0, n_ = 0, k_ = 0, lda_ = 0, ldb_ = 0;
  bool trans_a_ = false, trans_b_ = false, b_packed_ = false, store_packed_ = false;
  bool pack_each_run_ = false;  // B computed at run time, packed at run_packed_at_ in the workspace
  size_t run_packed_at_ = 0;
  bool sums_into_z_ = false;  // Y may lie over the residual Z, which the product is then added to
  std::vector<int64_t> batch_a_, batch_b_;  // per GEMM: the offsets of its A and B
  int bias_input_ = -1, z_input_ = -1;
  int batch_threads_ = 1;
  size_t gemm_bytes_ = 0, gates_at_ = 0, gather_at_ = 0;  // the workspace: the GEMM's, the gates, the gathered pixels
  int64_t gate_block_ = 0;  // a gated product's (SwiGLU's) block of values or gates
  bool windows_ = false;    // a convolution whose windows (a strided pointwise one's pixels) are gathered first
  bool x_planes_ = false;   // its image read as it comes, [N, C, H, W] (x_channels_first)
  gemm::ImageWindows win_;  // its windows
  int64_t images_ = 0;
  int threads_ = 1;
  ActivationSpec act_, post_;
  Tensor packed_, plain_b_;
  std::vector<gemm::ColumnPart> parts_;  // split outputs: where each begins (its data at run)
  std::vector<gemm::APart> a_parts_;      // X in parts: where each begins and its row length (its data at run)
  std::vector<size_t> a_inputs_;          // the inputs those are
};

// kiln.gemm_bf16_avx512: FusedMatMul by a constant 2-D bf16 B, and the pointwise FusedConv with
// bf16 weights (`kiln compile --precision bf16`), on AVX512-BF16 (gemm::gemm_bf16): B packed
// once in prepare into panels of K pairs (which a compiled model stores), A rounded to bf16 as
// its row panels are packed, the products summed in f32 and the f32 epilogue on each tile.
// Where the target has AMX, on its tiles from the same packed B (`bf16_amx_tiles`; a CPU
// without them runs the model so compiled on VDPBF16PS, which issues at half the rate of f32
// FMAs on AMX Xeons). Against oneDNN's bf16 matmul on AMX, BERT-base in bf16 took 0.88-1.05 of
// its time at one thread (three runs) and 0.97-1.04 at two (two runs), ViT-S/16 0.95, ResNet-50's
// pointwise convolutions 0.99: even, and kiln's own kernel, with kiln's epilogues. A pointwise
// FusedConv on bf16 activations (lower_precision's chains on an AMX target) has X widened into
// the workspace first, and Y computed there in f32 with the epilogue and then rounded. A
// merged projection's split outputs (merge_projections: BERT's Q, K and V) take each 16-column
// vector of C's rows where its output lies: one product of 2,304 columns instead of three of
// 768 at two threads on the AMX Xeon, where each thread's share of a narrow one is small
// (kiln_bench_gemm 128x2304x768 285 us against 3 x 132; BERT-base's bf16 Q, K and V 0.73 of
// their time, the model 0.94 of its time; one thread: the same time).

// Whether a FusedConv reads or writes bf16 activations (`output_type` bf16, or a bf16 X).
bool bf16_activations(const KernelQuery& q) {
  return q.node.op == "FusedConv" && (q.inputs[0].dtype == DType::bf16 || q.outputs[0].dtype == DType::bf16);
}

// kiln.gemm_bf16's default share of the pointwise convolutions on bf16 activations. Those of
// one pixel (a squeeze-and-excitation's two, on the pooled channels), where a call of oneDNN's
// costs more than the product: 0.27-0.95 of its time in EfficientNet-B0's bf16 compile (medians
// of 4-6 alternated profiles a node, one and two threads). Over 16 pixels or more on AMX tiles
// (gemm_bf16_tiles: X and Y as they are, K up to a whole tile), the projections: no activation
// (a residual may follow), K at least twice N, 32 output channels or more, but not 64 pixels or
// fewer by a weight over 512 KiB. Against oneDNN's AMX convolution (medians of 4 alternated
// `kiln profile` rounds of each compile loaded from stdin, one thread): EfficientNet-B0's
// projections 0.46-0.80 of its time, MobileNetV2's 0.73-0.98 (its two 14x14 ones into 96
// channels with a residual 1.04-1.05); but MobileNetV2's Clip expansions 1.14-1.33x, and
// ResNet-50's ReLU reductions 0.98-1.20x (0.91 from 1,024 channels into 512), its expansions
// with their residual 0.95-1.01. Without AMX (X widened, Y computed in f32 and
// rounded), oneDNN's convolution over more than one pixel: it was the faster, 1.2-1.7x kiln's
// time on EfficientNet-B0's expansions, SiLU and all, and 1.2 on its 7x7 ones at two threads.
// f32 activations: the f32 GEMM's rule.
std::optional<std::string> bf16_gemm_defers(const KernelQuery& q) {
  if (!bf16_activations(q)) return gemm_defers(q);
  const std::vector<int64_t> y = q.outputs[0].shape.concrete();
  const int64_t m = y[0] * y[1] * y[2], n = y[3], k = q.inputs[0].shape.concrete()[3];
  if (m == 1) return std::nullopt;
  if (!q.target.cpu.amx) return "oneDNN's convolution is faster on bf16 activations over more than one pixel without AMX tiles";
  if (m < 16) return "oneDNN's convolution is faster on bf16 activations over 2 to 15 pixels, fewer than a tile's rows";
  const Result<ActivationSpec> act = read_activation(q.node, "activation"), post = read_activation(q.node, "post_activation");
  if (!act.ok() || !post.ok() || act->kind != Activation::none || post->kind != Activation::none)
    return "oneDNN's AMX convolution is faster on bf16 activations but on a projection (no activation)";
  if (k < 2 * n) return "oneDNN's AMX convolution is faster on bf16 activations but on a projection (K at least twice N)";
  if (n < 32) return "oneDNN's AMX convolution is faster on fewer than 32 output channels";
  if (m <= 64 && k * n * 2 > 512 * 1024) return "oneDNN's AMX convolution is faster on 64 pixels or fewer by a weight over 512 KiB";
  return std::nullopt;
}

// The lower-precision GEMMs (kiln.gemm_bf16_avx512, kiln.gemm_f16_avx512) take a FusedMatMul or
// pointwise FusedConv whose constant weight is `weight` (what `--precision` stores) on a CPU
// that has `kind`'s instructions.
std::optional<std::string> lowp_declines(const KernelQuery& q, gemm::Lowp kind, DType weight) {
  if (auto why = gemm::lowp_lacks(q.target.cpu, kind)) return why;
  if (auto why = x_form_decline(q)) return why;
  if (q.inputs[1].dtype != weight) return "the weight is not " + std::string(dtype_name(weight));
  // Split outputs (a merged projection's): the f16 GEMM writes its 64-column panels where they
  // lie, the bf16 one each 16-column vector of C's rows.
  if (q.outputs.size() > 1 && is_conv(q.node)) return "split outputs";
  if (q.node.has_attr("gate_block")) return "a gated product";
  constexpr gemm::Tile kBf16Vector{.mr = 1, .nr = 16};
  if (auto why = split_declines(q, std::span<const gemm::Tile>(kind == gemm::Lowp::f16 ? &gemm::kF16Tile : &kBf16Vector, 1)))
    return why;
  if (kind == gemm::Lowp::bf16 && bf16_activations(q)) {  // X, or Y, bf16 (lower_precision's chains, an AMX target)
    if (!is_conv(q.node)) return "bf16 activations: only a pointwise convolution";
    if (q.has_input(2) && q.inputs[2].dtype != DType::f32) return "the bias is not f32";
    for (const Shape* s : {&q.inputs[0].shape, &q.inputs[1].shape, &q.outputs[0].shape})
      if (!s->is_concrete() || shape_numel(s->concrete()) == 0) return "a shape is not known ahead or is empty";
    return pointwise_declines(q, 1);
  }
  if (auto why = f32_and_concrete(q, weight)) return why;
  if (is_conv(q.node)) return kind == gemm::Lowp::f16 ? windows_declines(q) : pointwise_declines(q, 1);
  if (q.inputs[1].shape.rank() != 2) return "B is not 2-D";
  if (q.inputs[0].shape.rank() < 1) return "A is a scalar";
  return std::nullopt;
}

// Their epilogue: the bias and residual inputs, when present, and the activations.
class LowpEpilogue {
 public:
  Status read(const KernelQuery& q, int64_t n) {
    has_bias_ = q.has_input(2);
    has_z_ = q.has_input(3);
    z_bf16_ = has_z_ && q.inputs[3].dtype == DType::bf16;
    KILN_ASSIGN_OR_RETURN(ep_.act, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(ep_.post, read_activation(q.node, "post_activation"));
    ep_.ldz = n;
    return {};
  }
  /// The epilogue of a run; a bf16 Z (z_bf16()) is the caller's to pass.
  gemm::Epilogue at(KernelContext& ctx) const {
    gemm::Epilogue ep = ep_;
    if (has_bias_) ep.bias = ctx.input(2).data<float>();
    if (has_z_ && !z_bf16_) ep.z = ctx.input(3).data<float>();
    return ep;
  }
  bool z_bf16() const { return z_bf16_; }

 private:
  bool has_bias_ = false, has_z_ = false, z_bf16_ = false;
  gemm::Epilogue ep_;
};

class Bf16GemmKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const Product p = product_of(q);
    m_ = p.m, n_ = p.n, k_ = p.k;
    x_bf16_ = q.inputs[0].dtype == DType::bf16, y_bf16_ = q.outputs[0].dtype == DType::bf16;
    // bf16 activations over a tile's rows or more on AMX tiles (where this process has them): B's
    // panels over K up to a whole tile's steps, X and Y read and written as they are.
    tiles_ = (x_bf16_ || y_bf16_) && m_ >= 16 && q.target.cpu.amx && CpuFeatures::host().amx;
    const int64_t steps = tiles_ ? gemm::bf16_tile_steps(k_) : 0;
    // B packed once, or used where a compiled model mapped it when it was stored packed so,
    // or as an earlier plan of the session packed it.
    const Tensor& w = *q.inputs[1].value;
    const PackedLayout want = gemm::packed_b_bf16_layout(k_, n_, p.trans_b, steps);
    packed_ = packed_before(q, w, want, DType::bf16);
    if (!packed_.defined()) {
      const Tensor plain = w.is_packed() ? unpack(w) : w;  // bf16 (lowp_declines)
      Tensor packed = huge_page_tensor(DType::u16, {gemm::packed_b_bf16_elements(k_, n_, steps)});
      gemm::pack_b_bf16(static_cast<const uint16_t*>(plain.raw()), p.trans_b ? k_ : n_, p.trans_b, k_, n_, packed.data<uint16_t>(), steps);
      packed_ = packed.as_packed(DType::bf16, w.shape(), want);
      keep_packed(q, w, packed_);
    }
    KILN_RETURN_IF_ERROR(ep_.read(q, n_));
    parts_ = column_parts(q.node);
    threads_ = std::max(1, q.target.threads);
    amx_ = gemm::bf16_on_amx(q.target.cpu, k_);
    if (tiles_) {
      needs.workspace_bytes = gemm::bf16_tiles_workspace_bytes(m_, k_, threads_);
      return {};
    }
    // bf16 activations on VDPBF16PS: X (and a bf16 Z) widened into the workspace first, Y
    // computed there in f32 and rounded.
    a_at_ = (gemm::bf16_workspace_bytes(m_, k_) + 63) / 64 * 64;
    c_at_ = a_at_ + (x_bf16_ ? static_cast<size_t>(m_ * k_) * sizeof(float) : 0);
    z_at_ = c_at_ + (y_bf16_ ? static_cast<size_t>(m_ * n_) * sizeof(float) : 0);
    needs.workspace_bytes = z_at_ + (ep_.z_bf16() ? static_cast<size_t>(m_ * n_) * sizeof(float) : 0);
    return {};
  }

  Status run(KernelContext& ctx) override {
    std::byte* ws = ctx.workspace().data();
    gemm::Epilogue ep = ep_.at(ctx);
    const auto* z16 = ep_.z_bf16() ? static_cast<const uint16_t*>(ctx.input(3).raw()) : nullptr;
    if (tiles_) {
      gemm::gemm_bf16_tiles(m_, n_, k_, ctx.input(0).raw(), x_bf16_, k_, static_cast<const uint16_t*>(packed_.raw()), ep,
                            ctx.output(0).raw(), y_bf16_, n_, threads_, ws, z16);
      return {};
    }
    auto* widened = reinterpret_cast<float*>(ws + a_at_);
    if (x_bf16_) rows_.widen_bf16(static_cast<const uint16_t*>(ctx.input(0).raw()), widened, m_ * k_);
    if (z16) {
      auto* z = reinterpret_cast<float*>(ws + z_at_);
      rows_.widen_bf16(z16, z, m_ * n_);
      ep.z = z;
    }
    const float* a = x_bf16_ ? widened : ctx.input(0).data<float>();
    float* c = y_bf16_ ? reinterpret_cast<float*>(ws + c_at_) : ctx.output(0).data<float>();
    gemm::gemm_bf16(m_, n_, k_, a, k_, static_cast<const uint16_t*>(packed_.raw()), ep, c, n_, threads_, ws, 0, amx_,
                    parts_at(parts_, ctx));
    if (y_bf16_) rows_.narrow_bf16(c, static_cast<uint16_t*>(ctx.output(0).raw()), m_ * n_);
    return {};
  }

  Tensor packed_input(size_t input) const override { return input == 1 ? packed_ : Tensor(); }
  std::string label() const override { return tiles_ ? "bf16_amx_tiles_bf16_rows" : amx_ ? "bf16_amx_tiles" : "bf16_8x48"; }

 private:
  const RowKernels& rows_ = row_kernels(Isa::avx512);
  int64_t m_ = 0, n_ = 0, k_ = 0;
  int threads_ = 1;
  bool amx_ = false;  // on AMX tiles (gemm::bf16_on_amx)
  bool x_bf16_ = false, y_bf16_ = false;  // bf16 activations
  bool tiles_ = false;  // bf16 activations on AMX tiles, read and written as they are (gemm::gemm_bf16_tiles)
  size_t a_at_ = 0, c_at_ = 0, z_at_ = 0;  // the workspace: A's bf16 copy, then X widened, C in f32, Z widened
  Tensor packed_;  // B in pack_b_bf16's panels (bf16, packed_b_bf16_layout)
  LowpEpilogue ep_;
  std::vector<gemm::ColumnPart> parts_;  // split outputs
};

const char* f16_split_name(gemm::F16Split s) {
  return s == gemm::F16Split::rows ? "rows" : s == gemm::F16Split::panels ? "panels" : "automatic";
}

// The f16 GEMM's blocking a node recorded (a compiled model, max-autotune's candidates): what
// it leaves out stays to the defaults; a value no blocking has is the model's error.
Result<gemm::F16Blocking> recorded_f16_blocking(const Node& node) {
  gemm::F16Blocking b;
  for (const auto& [key, out] : {std::pair{"mc", &b.mc}, std::pair{"kc", &b.kc}})
    if (std::optional<int64_t> v = recorded_int(node, key)) {
      if (*v <= 0) return user_error(node.where(), "the recorded f16 GEMM parameter " + std::string(key) + " = " + std::to_string(*v) + " is not positive");
      *out = *v;
    }
  if (const std::string* split = node.kernel.param<std::string>("split")) {
    if (*split == "rows") b.split = gemm::F16Split::rows;
    else if (*split == "panels") b.split = gemm::F16Split::panels;
    else return user_error(node.where(), "the recorded f16 GEMM split '" + *split + "' is neither rows nor panels");
  }
  return b;
}

// max-autotune's axes for the f16 GEMM: Kc (its passes over B's panels), Mc (A's rows in L2 at
// a time), and how the threads share the product.
std::vector<TuningAxis> f16_space(const KernelQuery& q) {
  const Product p = product_of(q);
  std::vector<TuningAxis> axes;
  axes.push_back(size_axis("kc", {256, 512, 1024, 1536, 2304}, std::max<int64_t>(p.k, 1)));
  axes.push_back(size_axis("mc", {48, 96, 192, 384, 768, 1536}, std::max<int64_t>(p.m, 1)));
  if (q.target.threads > 1)
    axes.push_back(TuningAxis{"split", {{{"split", std::string("rows")}}, {{"split", std::string("panels")}}}});
  return axes;
}

// kiln.gemm_f16_avx512: an f16 weight (`--precision fp16`) on a CPU with AVX512-FP16, A rounded
// to f16 as it is copied, the products summed in f16 over blocks of K and in f32 across them.
// A convolution other than pointwise is the product of its windows (gathered as A is copied)
// and its weight laid out [K, KH, KW, C].
class F16GemmKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    bool trans_b = true;
    if (is_conv(q.node)) {
      const std::vector<int64_t> ys = q.outputs[0].shape.concrete();
      KILN_ASSIGN_OR_RETURN(g_, image_windows(q));
      m_ = ys[0] * ys[1] * ys[2], n_ = ys[3], k_ = g_.k();
      windows_ = !(g_.kh == 1 && g_.kw == 1 && g_.sh == 1 && g_.sw == 1 && g_.pt == 0 && g_.pl == 0 && g_.oh == g_.h && g_.ow == g_.w);
    } else {
      const Product p = product_of(q);
      m_ = p.m, n_ = p.n, k_ = p.k, trans_b = p.trans_b;
    }
    // B packed once (a convolution's weight in the windows' order), or used where a compiled
    // model mapped it when it was stored packed so: BERT-base's session in fp16 took 330 ms
    // packing its weights, where its f32 and bf16 ones map theirs.
    const Tensor& w = *q.inputs[1].value;
    const std::optional<PackedLayout> want = windows_ ? gemm::packed_b_f16_windows_layout(n_, g_.c, g_.kh * g_.kw)
                                                      : gemm::packed_b_f16_layout(k_, n_, trans_b);
    packed_ = want ? packed_before(q, w, *want, DType::f16) : Tensor();
    if (!packed_.defined()) {
      const Tensor plain = w.is_packed() ? unpack(w) : w;
      const Tensor ordered = windows_ ? in_windows_order(static_cast<const uint16_t*>(plain.raw()), DType::u16, n_, g_) : plain;
      Tensor packed = huge_page_tensor(DType::u16, {gemm::packed_b_f16_elements(k_, n_)});
      gemm::pack_b_f16(static_cast<const uint16_t*>(ordered.raw()), trans_b ? k_ : n_, trans_b, k_, n_, packed.data<uint16_t>());
      packed_ = want ? packed.as_packed(DType::f16, w.shape(), *want) : packed;
      if (want) keep_packed(q, w, packed_);
    }
    KILN_RETURN_IF_ERROR(ep_.read(q, n_));
    parts_ = column_parts(q.node);
    threads_ = std::max(1, q.target.threads);
    KILN_ASSIGN_OR_RETURN(gemm::F16Blocking asked, recorded_f16_blocking(q.node));
    blocking_ = gemm::f16_blocking(m_, n_, k_, threads_, asked);
    needs.workspace_bytes = gemm::f16_workspace_bytes(m_, k_);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* x = ctx.input(0).data<float>();
    float* y = ctx.output(0).data<float>();
    const auto* b = static_cast<const uint16_t*>(packed_.raw());
    if (windows_)
      gemm::gemm_f16_windows(m_, n_, g_, x, b, ep_.at(ctx), y, n_, threads_, ctx.workspace().data(), blocking_);
    else
      gemm::gemm_f16(m_, n_, k_, x, k_, b, ep_.at(ctx), y, n_, threads_, ctx.workspace().data(), blocking_, parts_at(parts_, ctx));
    return {};
  }

  Tensor packed_input(size_t input) const override { return input == 1 && packed_.is_packed() ? packed_ : Tensor(); }

  std::vector<std::pair<std::string, KernelParam>> params() const override {
    return {{"mc", blocking_.mc}, {"kc", blocking_.kc}, {"split", std::string(f16_split_name(blocking_.split))}};
  }
  std::string label() const override {
    return "f16_6x64_mc" + std::to_string(blocking_.mc) + "_kc" + std::to_string(blocking_.kc) +
           (threads_ > 1 ? "_t" + std::to_string(threads_) + "_" + f16_split_name(blocking_.split) : "");
  }

 private:
  int64_t m_ = 0, n_ = 0, k_ = 0;
  int threads_ = 1;
  gemm::F16Blocking blocking_;  // resolved in prepare
  bool windows_ = false;  // a convolution other than pointwise: A is its windows
  gemm::ImageWindows g_;
  Tensor packed_;  // B in pack_b_f16's panels (f16 with packed_b_f16_layout or its windows', else u16 bits)
  LowpEpilogue ep_;
  std::vector<gemm::ColumnPart> parts_;  // split outputs
};

}  // namespace

void register_gemm(KernelRegistry& r) {
  CpuFeatures f16 = isa_features(Isa::avx512);
  f16.avx512_fp16 = true;
  for (const char* op : {"FusedMatMul", "FusedConv"})
    r.add(op, "cpu",
          KernelImpl{.name = "kiln.gemm_f16_avx512",
                     .declines = [](const KernelQuery& q) { return lowp_declines(q, gemm::Lowp::f16, DType::f16); },
                     .create = [](const KernelQuery&) { return std::make_unique<F16GemmKernel>(); },
                     .needs_isa = f16,
                     .reads_packed = true,
                     .defers = f16_defers,
                     .tuning_space = f16_space});
  CpuFeatures bf16 = isa_features(Isa::avx512);
  bf16.avx512_bf16 = true;
  for (const char* op : {"FusedMatMul", "FusedConv"})
    r.add(op, "cpu",
          KernelImpl{.name = "kiln.gemm_bf16_avx512",
                     .declines = [](const KernelQuery& q) { return lowp_declines(q, gemm::Lowp::bf16, DType::bf16); },
                     .create = [](const KernelQuery&) { return std::make_unique<Bf16GemmKernel>(); },
                     .needs_isa = bf16,
                     .reads_packed = true,
                     .defers = bf16_gemm_defers});
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"MatMul", "FusedMatMul", "Gemm", "Conv", "FusedConv"})
      r.add(op, "cpu",
            KernelImpl{.name = GemmKernel::impl_name(isa),
                       .declines = [isa](const KernelQuery& q) { return gemm_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<GemmKernel>(isa); },
                       .needs_isa = isa_features(isa),
                       .reads_packed = true,
                       .defers = gemm_defers,
                       .tuning_space = [isa](const KernelQuery& q) { return gemm_space(q, isa); }});
}

}  // namespace kiln::cpu
