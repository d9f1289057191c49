// kiln.winograd_f32_<isa>: 3x3 stride-1 convolutions (channels-last FusedConv, f32) by
// Winograd's minimal filtering (Lavin and Gray), F(4x4, 3x3) or F(2x2, 3x3): each m x m output
// tile is Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A of its (m + 2)² input window d, so a pair of channels costs
// 36 products per 16 outputs (or 16 per 4) instead of 9 per output. The filters are transformed
// (U = G g Gᵀ: one C×K matrix per point ξ) and packed for kiln's f32 GEMM at plan time; a run
// takes the image's tiles in blocks of whole tile rows whose transformed input V and products M
// fit L2 together: the input transform writes V [points][tiles][C], one GEMM per point
// M_ξ = V_ξ·U_ξ (each fetching the next one's first panel of U as it ends), and the output
// transform writes Y's tiles with the bias (and ReLU) added, the rest of the epilogue then
// applied to the block's output rows while they are in cache. On several threads either the
// tiles of each transform and the products are shared among them (split=points), or each
// thread takes its share of the tiles through all three steps in blocks of its own
// (split=tiles; default_tiles_split says which).
//
// oneDNN 2.6 has Winograd too (onednn.conv's algorithm=winograd), behind reorders between
// kiln's channels-last tensors and its blocked ones.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/ref/nn_util.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

std::optional<std::string> winograd_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (auto why = x_form_decline(q)) return why;
  if (auto why = f32_and_concrete(q, DType::f16)) return why;  // an f16 weight (`--precision fp16`) widened
  if (!nn::channels_last(q.node)) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not a 2-D convolution";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  const std::vector<int64_t> w = q.inputs[1].shape.concrete();
  if (w[2] != 3 || w[3] != 3) return "not a 3x3 filter";
  if (q.node.attr_int("group", 1) != 1) return "grouped";
  if (nn::int8_operands(q.node))
    return "int8 codes dequantized: Winograd's transforms would round the exact products that the quantization after it sees";
  for (int64_t v : q.node.attr_ints("strides", {1, 1}))
    if (v != 1) return "strides other than 1";
  for (int64_t v : q.node.attr_ints("dilations", {1, 1}))
    if (v != 1) return "dilated";
  if (const int64_t* tile = q.node.kernel.param<int64_t>("tile"); tile && *tile != 2 && *tile != 4)
    return "a recorded tile other than 2 or 4";
  if (const std::string* split = q.node.kernel.param<std::string>("split"); split && *split != "points" && *split != "tiles")
    return "a recorded split other than points or tiles";
  return std::nullopt;
}

// Output tiles of m x m an image of oh x ow takes.
int64_t tiles_of(int64_t oh, int64_t ow, int64_t m) { return ((oh + m - 1) / m) * ((ow + m - 1) / m); }

// The default tile (`kiln_bench_conv`: kiln's Winograd with each tile against oneDNN's direct
// and Winograd convolutions on ResNet-50's and YOLO's 3x3 layers; docs/architecture.md has the
// table). F(4x4, 3x3) does 36 products per tile of 16 outputs, F(2x2, 3x3) 16 per 4, but its
// transformed filters are 36/16 times as many: where F(4x4)'s tiles are few, streaming those
// filters in is the time, and F(2x2) halves it.
constexpr int64_t kFourTiles = 25, kTwoTiles = 16;

// The fewest channels in and out kiln's Winograd takes by default: 32 with AVX-512, where
// oneDNN's direct convolution ties it below (YOLO's 16-channel C2f layers at 80x80: 0.26 against
// 0.33 ms); 16 on AVX2, where oneDNN 2.6's direct convolution of channels-last tensors is the
// slower one (the same layer on a Zen 3 core: 0.44 ms against F(4x4)'s 0.28 at one thread, 0.22
// against 0.16 at two).
int64_t min_channels(const CpuFeatures& cpu) { return cpu.avx512f ? 32 : 16; }

int64_t default_tile(int64_t oh, int64_t ow) { return tiles_of(oh, ow, 4) >= kFourTiles ? 4 : 2; }

// The default rule: kiln's takes those of at least min_channels in and out over at least
// kTwoTiles tiles of its default size, where its products are long enough to run at the
// GEMM's rate and the transformed filters are read by enough tiles to pay for streaming them.
// Under kFourTiles tiles (7x7 and 8x8 images), the GEMM over the windows takes
// - an f32 weight that outgrows L2, with AVX-512: that GEMM streams the weight in once, in
//   short K slices for so few rows, where F(2x2)'s transformed filters are 16/9 as many
//   (ResNet-50's 7x7 512-channel layers: 0.77-0.98 of Winograd's time at one thread, 0.91-1.08
//   at two, 6 alternated profiles of each compiled model); where gemm_defers leaves such a
//   layer to oneDNN (more than a quarter as many pixels as output channels), oneDNN runs it;
// - an f16 weight (`--precision fp16`) on one thread: the f16 GEMM does its multiplies twice
//   as fast as f32's, and F(2x2)'s transformed f16 filters still stream in (the same layers:
//   0.69-0.75 ms over the windows against 0.87-0.92; on two threads Winograd was the faster,
//   0.30-0.36 against 0.37-0.41 ms).
std::optional<std::string> winograd_defers(const KernelQuery& q) {
  const std::vector<int64_t> x = q.inputs[0].shape.concrete(), y = q.outputs[0].shape.concrete();
  const std::vector<int64_t> w = q.inputs[1].shape.concrete();
  const int64_t fewest = min_channels(q.target.cpu);
  if (x[3] < fewest || w[0] < fewest)
    return "oneDNN's direct convolution is as fast on fewer than " + std::to_string(fewest) + " channels";
  const int64_t tiles = tiles_of(y[1], y[2], default_tile(y[1], y[2]));
  if (tiles < kTwoTiles)
    return "fewer than " + std::to_string(kTwoTiles) + " output tiles read the transformed filters";
  if (tiles < kFourTiles) {
    const bool f16 = q.inputs[1].dtype == DType::f16;
    if (f16 && q.target.threads <= 1)
      return "on one thread the f16 GEMM over the windows is faster where fewer than " + std::to_string(kFourTiles) +
             " output tiles read the transformed filters";
    if (!f16 && q.target.cpu.avx512f && w[0] * w[1] * 9 * 4 >= gemm::CacheSizes::host().l2)
      return "the GEMM over the windows, streaming the weight once, is faster where it outgrows L2 and fewer than " +
             std::to_string(kFourTiles) + " output tiles read the transformed filters";
  }
  return std::nullopt;
}

// How several threads share a convolution by default: each its share of the points' products
// after sharing the input transform, and of the output transform after them (two barriers a
// block, and half of the V and of the M each thread reads written on the other core), or each
// thread its own tiles through every step (no barrier and no line from the other core, but
// every thread reads all of U). The tiles where U is under half of L2, each core then holding
// its own copy: at two threads (6 alternated profiles of each compiled model) YOLO's 40x40
// 32-channel layers (U 147 KB) took 0.67-0.78 of their time so, its 20x20 64-channel ones
// (590 KB) 0.82-0.95, ResNet-50's 56x56 layers (590 KB) 0.85, the model YOLO 0.964; with
// U of half of L2 (YOLO's 10x10 128-channel F(2x2), 1 MB) it was a draw (0.96-1.05), and past
// it a loss (ResNet-50's 28x28 layers, 2.4 MB: 1.02-1.08; its 14x14 ones, 4 MB: 1.09-1.19).
// Measured on two threads (12 tiles or more each); with more threads, each keeps at least
// kTilesPerThread of its own, or the points are shared.
constexpr int64_t kTilesPerThread = 8;
bool default_tiles_split(int64_t u_bytes, int64_t tiles, int threads, const gemm::CacheSizes& caches) {
  return u_bytes < caches.l2 / 2 && tiles >= kTilesPerThread * threads;
}

// max-autotune's axes: both tiles, and on several threads both ways of sharing the work.
std::vector<TuningAxis> winograd_space(const KernelQuery& q) {
  std::vector<TuningAxis> axes = {TuningAxis{"tile", {{{"tile", int64_t{4}}}, {{"tile", int64_t{2}}}}}};
  if (q.target.threads > 1)
    axes.push_back(TuningAxis{"split", {{{"split", std::string("points")}}, {{"split", std::string("tiles")}}}});
  return axes;
}

class WinogradKernel final : public Kernel {
 public:
  explicit WinogradKernel(Isa isa) : isa_(isa), rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ys = q.outputs[0].shape.concrete();
    const std::vector<int64_t> ws = q.inputs[1].shape.concrete();
    n_ = xs[0], h_ = xs[1], w_ = xs[2], c_ = xs[3], oh_ = ys[1], ow_ = ys[2], k_ = ys[3];
    KILN_ASSIGN_OR_RETURN(nn::Window win, nn::resolve_window(q.node, {h_, w_}, {3, 3}, false));
    pt_ = win.pads[0], pl_ = win.pads[1];
    const int64_t* recorded = q.node.kernel.param<int64_t>("tile");
    m_ = recorded ? *recorded : default_tile(oh_, ow_);
    points_ = (m_ + 2) * (m_ + 2);
    tiles_h_ = (oh_ + m_ - 1) / m_, tiles_w_ = (ow_ + m_ - 1) / m_;
    has_bias_ = q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined;
    KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
    KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
    has_z_ = q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined;
    // ReLU alone is applied in the output transform; anything else after it, on the rows.
    relu_ = act_.kind == Activation::relu && !has_z_ && post_.kind == Activation::none;
    tail_ = !relu_ && (act_.kind != Activation::none || has_z_ || post_.kind != Activation::none);

    // An f16 weight (`--precision fp16`) with 2x2 tiles, on a CPU with AVX512-FP16: U in f16 and
    // the products on kiln's f16 GEMM (V rounded to f16 as it is copied, sums in f16 over
    // blocks of K). F(4x4)'s output transform multiplies the products' rounding errors by up to
    // 8 · 8 (7e-3 relative L2 against the reference on noise, where F(2x2) stays within 1e-3):
    // its products stay f32, on the weight widened.
    f16_ = q.inputs[1].value->dtype() == DType::f16 && m_ == 2 && !gemm::lowp_lacks(q.target.cpu, gemm::Lowp::f16);
    threads_ = std::max(1, q.target.threads);
    const gemm::CacheSizes& caches = gemm::CacheSizes::host();
    const int64_t u_bytes = points_ * c_ * k_ * (f16_ ? 2 : 4);
    const std::string* split = q.node.kernel.param<std::string>("split");
    tiles_split_ = threads_ > 1 && (split ? *split == "tiles" : default_tiles_split(u_bytes, tiles_h_ * tiles_w_, threads_, caches));

    // Blocks of whole tile rows whose V and M fit L2 together (with the tiles split, each
    // thread's own V and M, beside the U it reads whole).
    const int64_t row_bytes = tiles_w_ * points_ * (c_ + k_) * static_cast<int64_t>(sizeof(float));
    const int64_t share_rows = tiles_split_ ? (tiles_h_ + threads_ - 1) / threads_ : tiles_h_;
    const int64_t room = tiles_split_ ? std::max(caches.l2 - u_bytes, caches.l2 / 2) : caches.l2;
    const int64_t rows_fit = std::clamp<int64_t>(room / row_bytes, 1, share_rows);
    const int64_t blocks = (share_rows + rows_fit - 1) / rows_fit;
    block_tiles_ = (share_rows + blocks - 1) / blocks * tiles_w_;

    const gemm::Tile tile = gemm::default_tile(isa_, block_tiles_, k_, c_, caches);
    params_ = gemm::fit(gemm::default_params(isa_, tile, caches, block_tiles_, k_, c_, 1), block_tiles_, k_, c_);
    params_.tm = params_.tn = 1;
    params_.pack_a = false;
    // A cache line past each point's packed U_ξ: winograd_filters writes a row of each point's
    // at once, which at a multiple of 4 KiB apart all fell into one set of L1 (the transform of
    // 64 by 64 filters 0.079 → 0.045 ms, of 128 by 128 0.415 → 0.232, with U in the caches).
    constexpr int64_t kApart = 16;
    panel_floats_ = gemm::packed_b_floats(c_, k_, tile.nr) + kApart;

    // U_ξ = (G g Gᵀ)[ξ] as a C×K matrix, packed for the GEMM's tile, a panel of output channels
    // at a time: an f16 weight widened a panel's filters at a time, and with the products in f16
    // (f16_) each panel's U in f32 panels of the f16 GEMM's width first (every point's, in L2),
    // then rounded to f16 pairs in its place in each point's packed U. The whole f16 weight
    // widened at once and all of U in f32, as plain C×K matrices, took ResNet-50's fp16 session
    // 87 ms against 38 at one thread, compiled for two (store misses, and page faults on the
    // copies).
    const Tensor weight = q.inputs[1].value->is_packed() ? unpack(*q.inputs[1].value) : *q.inputs[1].value;
    const bool widen = weight.dtype() == DType::f16;
    const int64_t nr = f16_ ? gemm::kF16Tile.nr : tile.nr, u_apart = c_ * nr + kApart, pair_rows = (c_ + 1) / 2 * 2;
    const int64_t filter_floats = widen ? nr * c_ * 9 : 0, u_floats = f16_ ? points_ * u_apart : 0;
    if (f16_) panel_floats_ = gemm::packed_b_f16_elements(c_, k_);
    // Every element written below (U's panels, and past each point's in f32 the cache line
    // between them).
    packed_ = Tensor::for_overwrite(f16_ ? DType::u16 : DType::f32, {points_ * panel_floats_});
    if (!f16_)
      for (int64_t xi = 0; xi < points_; ++xi)
        std::fill_n(packed_.data<float>() + (xi + 1) * panel_floats_ - kApart, kApart, 0.f);
    // The panels shared among the session's threads, each with its own scratch.
    const int64_t panels = (k_ + nr - 1) / nr;
    const int threads = static_cast<int>(std::min<int64_t>(std::min(threads_, pool_threads()), panels));
    std::vector<float> scratch(static_cast<size_t>((filter_floats + u_floats) * threads));
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      float* filters = scratch.data() + (filter_floats + u_floats) * omp_get_thread_num();
      float* u = filters + filter_floats;
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t n0 = p * nr, cols = std::min(nr, k_ - n0);
        if (widen) nn::widen_f16(static_cast<const uint16_t*>(weight.raw()) + n0 * c_ * 9, cols * c_ * 9, filters);
        const float* g = widen ? filters : weight.data<float>() + n0 * c_ * 9;
        if (!f16_) {
          rows_.winograd_filters(static_cast<int>(m_), g, cols, c_, nr, packed_.data<float>() + n0 * c_, panel_floats_);
          continue;
        }
        rows_.winograd_filters(static_cast<int>(m_), g, cols, c_, nr, u, u_apart);
        for (int64_t xi = 0; xi < points_; ++xi)
          gemm::pack_b_f16_from_panels(u + xi * u_apart, c_, cols, packed_.data<uint16_t>() + xi * panel_floats_ + n0 * pair_rows);
      }
    }
    zeros_.assign(static_cast<size_t>(c_), 0.f);

    gemm_bytes_ = round64(f16_ ? gemm::f16_workspace_bytes(block_tiles_, c_) : gemm::workspace_bytes(params_, problem(0)));
    vm_bytes_ = round64(static_cast<size_t>(points_ * block_tiles_ * (c_ + k_)) * sizeof(float));
    needs.workspace_bytes = tiles_split_ ? (vm_bytes_ + gemm_bytes_) * static_cast<size_t>(threads_)
                                         : vm_bytes_ + gemm_bytes_ * static_cast<size_t>(threads_);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const float* x = ctx.input(0).data<float>();
    const float* bias = has_bias_ ? ctx.input(2).data<float>() : nullptr;
    const float* z = has_z_ ? ctx.input(3).data<float>() : nullptr;
    float* y = ctx.output(0).data<float>();
    std::byte* ws = ctx.workspace().data();
    const int64_t ldv = block_tiles_ * c_, ldm = block_tiles_ * k_, tiles = tiles_h_ * tiles_w_;
    const int threads = std::min(threads_, pool_threads());
    if (tiles_split_ && threads > 1) {
#pragma omp parallel num_threads(threads)
      {
        WorkerSpan span;
        own_tiles(x, bias, z, y, ws + (vm_bytes_ + gemm_bytes_) * static_cast<size_t>(omp_get_thread_num()),
                  even_share(tiles, omp_get_num_threads(), omp_get_thread_num()));
      }
      return {};
    }
    float* v = reinterpret_cast<float*>(ws);
    float* m = v + points_ * block_tiles_ * c_;
    std::byte* gemm_ws = ws + vm_bytes_;
    ShareQueues products(threads, 1);
    auto body = [&](int t, int nt) {
      for (int64_t b = 0; b < n_; ++b) {
        const float* xb = x + b * h_ * w_ * c_;
        float* yb = y + b * oh_ * ow_ * k_;
        for (int64_t t0 = 0; t0 < tiles; t0 += block_tiles_) {
          const int64_t t1 = std::min(tiles, t0 + block_tiles_), count = t1 - t0;
          const auto [i0, i1] = even_share(count, nt, t);
          if (i0 < i1)
            rows_.winograd_input(static_cast<int>(m_), xb, h_, w_, c_, tiles_w_, pt_, pl_, t0 + i0, t0 + i1, v + i0 * c_, ldv,
                                 zeros_.data());
          // The products, a point at a time from the thread's own share first (ShareQueues):
          // filled before the barrier that every thread passes before taking from them, after
          // the barrier that ended the last block's products.
          if (t == 0) products.fill(points_);
          barrier(nt);
          products.drain(t, [&](int64_t x0, int64_t x1, bool more) {
            for (int64_t xi = x0; xi < x1; ++xi)
              product(xi, count, v, m, gemm_ws + gemm_bytes_ * static_cast<size_t>(t), xi + 1 < x1 || more);
          });
          barrier(nt);
          // The output transform by whole tile rows, so that each thread's output rows are
          // one span for the epilogue.
          const int64_t rows = (count + tiles_w_ - 1) / tiles_w_;
          const auto [r0, r1] = even_share(rows, nt, t);
          if (r0 < r1) {
            const int64_t a = r0 * tiles_w_, e = std::min(count, r1 * tiles_w_);
            rows_.winograd_output(static_cast<int>(m_), m + a * k_, ldm, k_, tiles_w_, t0 + a, t0 + e, bias, relu_, yb, oh_,
                                  ow_);
            if (tail_) tail(t0 + a, t0 + e, yb, z ? z + b * oh_ * ow_ * k_ : nullptr);
          }
          // No barrier here: the next block's products, which overwrite M, wait for the one
          // after its input transform.
        }
      }
    };
    if (threads <= 1) {
      body(0, 1);
    } else {
#pragma omp parallel num_threads(threads)
      {
        WorkerSpan span;
        body(omp_get_thread_num(), omp_get_num_threads());
      }
    }
    return {};
  }

  std::vector<std::pair<std::string, KernelParam>> params() const override {
    std::vector<std::pair<std::string, KernelParam>> p = {{"tile", m_}};
    if (threads_ > 1) p.emplace_back("split", std::string(tiles_split_ ? "tiles" : "points"));
    return p;
  }
  std::string label() const override {
    return "winograd_f" + std::to_string(m_) + "x" + std::to_string(m_) + "_3x3 " + (f16_ ? "gemm_f16_avx512" : params_.name()) +
           (threads_ > 1 ? tiles_split_ ? " tiles_split" : " points_split" : "");
  }

 private:
  static size_t round64(size_t b) { return (b + 63) / 64 * 64; }

  // M_ξ = V_ξ·U_ξ for a block of `count` tiles (V and M as a block lays them out) on the calling
  // thread; `fetch_next`: U_ξ+1's first panel fetched as it ends.
  void product(int64_t xi, int64_t count, const float* v, float* m, std::byte* gemm_ws, bool fetch_next) const {
    const int64_t ldv = block_tiles_ * c_, ldm = block_tiles_ * k_;
    if (f16_) {
      gemm::gemm_f16(count, k_, c_, v + xi * ldv, c_, packed_.data<uint16_t>() + xi * panel_floats_, {}, m + xi * ldm, k_, 1, gemm_ws);
      return;
    }
    gemm::GemmProblem p = problem(count);
    p.a = v + xi * ldv;
    p.b = packed_.data<float>() + xi * panel_floats_;
    p.c = m + xi * ldm;
    p.b_next = fetch_next ? p.b + panel_floats_ : nullptr;
    gemm::run(params_, p, gemm_ws);
  }

  // The rest of the epilogue (what the output transform's bias and ReLU leave) on the outputs of
  // tiles [a, e) of one image (Y and Z from its first pixel), a tile row's stretch at a time.
  void tail(int64_t a, int64_t e, float* yb, const float* zb) const {
    while (a < e) {
      const int64_t row = a / tiles_w_, end = std::min(e, (row + 1) * tiles_w_);
      const int64_t y0 = row * m_, y1 = std::min(oh_, y0 + m_), x0 = a % tiles_w_ * m_, x1 = std::min(ow_, (end - row * tiles_w_) * m_);
      const int64_t at = (y0 * ow_ + x0) * k_;
      rows_.tile_epilogue(yb + at, ow_ * k_, zb ? zb + at : nullptr, ow_ * k_, y1 - y0, (x1 - x0) * k_, act_, post_);
      a = end;
    }
  }

  // With the tiles split: tiles [s0, s1) of every image through all three steps on the calling
  // thread, in blocks of at most block_tiles_, in its own V, M and GEMM workspace at `ws`.
  void own_tiles(const float* x, const float* bias, const float* z, float* y, std::byte* ws, std::pair<int64_t, int64_t> share) const {
    const auto [s0, s1] = share;
    float* v = reinterpret_cast<float*>(ws);
    float* m = v + points_ * block_tiles_ * c_;
    std::byte* gemm_ws = ws + vm_bytes_;
    const int64_t ldv = block_tiles_ * c_, ldm = block_tiles_ * k_;
    for (int64_t b = 0; b < n_; ++b) {
      const float* xb = x + b * h_ * w_ * c_;
      float* yb = y + b * oh_ * ow_ * k_;
      const float* zb = z ? z + b * oh_ * ow_ * k_ : nullptr;
      for (int64_t t0 = s0; t0 < s1; t0 += block_tiles_) {
        const int64_t t1 = std::min(s1, t0 + block_tiles_), count = t1 - t0;
        rows_.winograd_input(static_cast<int>(m_), xb, h_, w_, c_, tiles_w_, pt_, pl_, t0, t1, v, ldv, zeros_.data());
        for (int64_t xi = 0; xi < points_; ++xi) product(xi, count, v, m, gemm_ws, xi + 1 < points_);
        rows_.winograd_output(static_cast<int>(m_), m, ldm, k_, tiles_w_, t0, t1, bias, relu_, yb, oh_, ow_);
        if (tail_) tail(t0, t1, yb, zb);  // the block may start and end partway along a tile row
      }
    }
  }
  static void barrier(int nt) {
    if (nt > 1) {
#pragma omp barrier
    }
  }
  gemm::GemmProblem problem(int64_t count) const {
    gemm::GemmProblem p;
    p.m = count, p.n = k_, p.k = c_;
    p.lda = c_;
    p.b_packed = true;
    p.ldc = k_;
    return p;
  }

  Isa isa_;
  const RowKernels& rows_;
  int64_t n_ = 0, h_ = 0, w_ = 0, c_ = 0, oh_ = 0, ow_ = 0, k_ = 0, pt_ = 0, pl_ = 0;
  int64_t m_ = 4, points_ = 36;  // the output tile's side, and (m + 2)² products per tile
  int64_t tiles_h_ = 0, tiles_w_ = 0, block_tiles_ = 0;  // block_tiles_: whole tile rows
  int64_t panel_floats_ = 0;  // elements of one packed U_ξ
  int threads_ = 1;
  size_t gemm_bytes_ = 0, vm_bytes_ = 0;  // a GEMM's workspace; V's and M's (64-byte multiples)
  bool tiles_split_ = false;  // each thread its share of the tiles through every step (default_tiles_split)
  bool has_bias_ = false, has_z_ = false, relu_ = false, tail_ = false, f16_ = false;
  ActivationSpec act_, post_;
  gemm::GemmParams params_;
  Tensor packed_;              // the U_ξ, each packed for the GEMM's tile (f32, or f16 bits)
  std::vector<float> zeros_;   // C zeros: the pixels outside the image
};

}  // namespace

void register_winograd(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    r.add("FusedConv", "cpu",  // channels-last: a FusedConv (compile's channels_last makes them)
            KernelImpl{.name = std::string("kiln.winograd_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return winograd_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<WinogradKernel>(isa); },
                       .needs_isa = isa_features(isa),
                       .defers = winograd_defers,
                       .tuning_space = winograd_space});
}

}  // namespace kiln::cpu
