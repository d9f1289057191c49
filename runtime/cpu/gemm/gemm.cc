// The GEMM templates' parameters, packing and thread grid (gemm.h); the micro-kernels and the
// blocking loops are gemm.inc, one build per ISA.
#include "runtime/cpu/gemm/gemm.h"

#include <cpuinfo.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "runtime/cpu/gemm/gemm_isa.h"
#include "runtime/threads.h"

namespace kiln::cpu::gemm {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t round_down(int64_t x, int64_t m) { return std::max(m, x / m * m); }

BlockFn block_of(Isa isa) { return isa == Isa::avx512 ? avx512::kBlock : avx2::kBlock; }
int stream_panels(Isa isa, const Tile& t, int64_t rows) {
  return isa == Isa::avx512 ? avx512::stream_panels(t, rows) : avx2::stream_panels(t, rows);
}

// The part [begin, end) of `units` units (of `unit` elements, the last possibly short within
// `total`) that share `part` of `parts` gets.
std::pair<int64_t, int64_t> share(int64_t total, int64_t unit, int parts, int part) {
  const int64_t units = (total + unit - 1) / unit;
  const int64_t base = units / parts, extra = units % parts;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  const int64_t end = begin + base + (part < extra ? 1 : 0);
  return {std::min(total, begin * unit), std::min(total, end * unit)};
}

// Floats of one thread's A and B blocks.
int64_t a_block_floats(const GemmParams& p) { return round_up(p.mc, p.tile.mr) * p.kc; }
int64_t b_block_floats(const GemmParams& p, const GemmProblem& g) { return g.b_packed ? 0 : round_up(p.nc, p.tile.nr) * p.kc; }
size_t thread_bytes(const GemmParams& p, const GemmProblem& g) {
  return static_cast<size_t>(round_up((a_block_floats(p) + b_block_floats(p, g)) * 4, 64));
}

}  // namespace

std::span<const Tile> tiles(Isa isa) { return isa == Isa::avx512 ? avx512::kTiles : avx2::kTiles; }

std::string GemmParams::name() const {
  return std::string("gemm_f32_") + isa_name(isa) + "_" + std::to_string(tile.mr) + "x" + std::to_string(tile.nr) + "_mc" +
         std::to_string(mc) + "_nc" + std::to_string(nc) + "_kc" + std::to_string(kc) + "_t" + std::to_string(tm) + "x" +
         std::to_string(tn) + (pack_a ? "" : "_ua");
}

std::optional<std::string> GemmParams::invalid() const {
  const std::span<const Tile> ts = tiles(isa);
  if (std::find(ts.begin(), ts.end(), tile) == ts.end())
    return "no " + std::to_string(tile.mr) + "x" + std::to_string(tile.nr) + " micro-kernel for " + isa_name(isa);
  if (mc <= 0 || mc % tile.mr != 0) return "mc " + std::to_string(mc) + " is not a positive multiple of " + std::to_string(tile.mr);
  if (nc <= 0 || nc % tile.nr != 0) return "nc " + std::to_string(nc) + " is not a positive multiple of " + std::to_string(tile.nr);
  if (kc <= 0) return "kc " + std::to_string(kc) + " is not positive";
  if (tm < 1 || tn < 1 || int64_t{tm} * tn > 1024) return "the thread grid " + std::to_string(tm) + "x" + std::to_string(tn) + " is invalid";
  return std::nullopt;
}

const CacheSizes& CacheSizes::host() {
  static const CacheSizes sizes = [] {
    CacheSizes s;
    if (!cpuinfo_initialize()) return s;
    if (const cpuinfo_cache* c = cpuinfo_get_l1d_cache(0); c && c->size) s.l1d = c->size;
    if (const cpuinfo_cache* c = cpuinfo_get_l2_cache(0); c && c->size) s.l2 = c->size / std::max(1u, c->processor_count);
    if (const cpuinfo_cache* c = cpuinfo_get_l3_cache(0); c && c->size) s.l3 = c->size / std::max(1u, c->processor_count);
    return s;
  }();
  return sizes;
}

GemmParams fit(GemmParams p, int64_t m, int64_t n, int64_t k) {
  p.mc = std::min(p.mc, round_up(std::max<int64_t>(m, 1), p.tile.mr));
  p.nc = std::min(p.nc, round_up(std::max<int64_t>(n, 1), p.tile.nr));
  p.kc = std::min(p.kc, std::max<int64_t>(k, 1));
  return p;
}

Tile default_tile(Isa isa, int64_t n) {
  const std::span<const Tile> ts = tiles(isa);
  const auto padding = [n](const Tile& t) { return (n + t.nr - 1) / t.nr * t.nr - n; };
  return *std::min_element(ts.begin(), ts.end(), [&](const Tile& a, const Tile& b) { return padding(a) < padding(b); });
}

Tile default_tile(Isa isa, int64_t m, int64_t n, int64_t k, const CacheSizes& caches) {
  m = std::max<int64_t>(m, 1);
  n = std::max<int64_t>(n, 1);
  const Tile& first = tiles(isa).front();
  const Tile by_n = default_tile(isa, n);
  // The padding the preferred tile may add: 1 % on AVX-512 (8x48 against 6x64); 4 % on AVX2,
  // whose 4x24 tile ran within 4 % of 6x16 where it padded N by 3 % (ResNet-50's 256 and 512
  // output channels; ResNet-50 took 0.97-0.99 of its time with it) and 10-14 % slower where by
  // 12 % (64 and 128).
  if (round_up(n, first.nr) - n > n / (isa == Isa::avx2 ? 25 : 100)) return by_n;
  const bool streams = std::max<int64_t>(k, 1) * n * static_cast<int64_t>(sizeof(float)) > caches.l3;
  // And rows that one preferred tile holds: each tile reads all of B for them, which the
  // preferred tile reads fastest (AVX-512's 8x48 against 6x64, the one this moves: 4 rows by
  // 4096x4096 in 0.84 of the time at one and two threads; one row by 4096x4096, 11008x4096,
  // 4096x11008 or 32000x512 in 0.98-1.00, kiln_bench_gemm --tiles). A language model's head then
  // takes one tile at 1, 8 and 32 rows, so that a compile without `--input-shape` stores it
  // packed (prepack_weights).
  const bool one_tile = m <= first.mr;
  return streams || one_tile || round_up(m, by_n.mr) > round_up(m, first.mr) ? first : by_n;
}

GemmParams default_params(Isa isa, const Tile& tile, const CacheSizes& caches, int64_t m, int64_t n, int64_t k,
                          int threads) {
  GemmParams p;
  p.isa = isa;
  p.tile = tile;
  p.pack_a = false;
  m = std::max<int64_t>(m, 1);
  n = std::max<int64_t>(n, 1);
  k = std::max<int64_t>(k, 1);
  // Kc: the whole of K while A's MR rows and B's NR-column micro-panel over it fill at most
  // three quarters of L2 (each tile then reads and writes C once), and while the preferred
  // tile's rows of A over it fill at most two thirds of L1d; a longer K in equal chunks under
  // that. The L1 bound (1,024 with 48 KiB and AVX-512's 8 rows) made the products of K = 3,072
  // and 4,608 5-25 % faster than one chunk (BERT's 128x768x3072, GPT-2's 32x768x3072,
  // ResNet-50's 49x512x4608; kiln_bench_gemm's ratio to oneDNN on one and two threads), where
  // A's rows no longer stayed in L1. With AVX2's 4 rows and 32 KiB (1,360), K = 768 in one
  // chunk ran 0-8 % faster than in two of 384 (BERT's and ViT-S/16's shapes, a Zen 3 core).
  const int64_t l1_rows = tiles(isa).front().mr;
  const int64_t l1_kc = round_down(caches.l1d * 2 / 3 / (4 * l1_rows), 16), chunks = (k + l1_kc - 1) / l1_kc;
  p.kc = std::min({k, round_up((k + chunks - 1) / chunks, 16), round_down(caches.l2 * 3 / 4 / (4 * (tile.mr + tile.nr)), 16)});
  // But with AVX-512's wide tiles (48 columns or more, which read B fastest), where a few tiles
  // of rows (more than one, kFewRows or fewer) multiply a weight of a quarter of L2 or more
  // into a C of a quarter of L2 or less, K in equal chunks whose Kc×NR slice of B fits two
  // thirds of L1d (128 for 6x64, 160 for 8x48): each tile after the first reads the slice from
  // L1 instead of L2, where its next panel is arriving.
  // ResNet-50's last stage (49 rows by 512-4,608 × 512-2,048) took 0.83-0.95 of its time so,
  // EfficientNet-B0's 7x7 layers 0.87-0.99, GPT-2's 32-row products 0.91-1.01 (the weight from
  // memory, one and two threads; 64 rows tied). 96 rows lost (1.01-1.06) and 128 were mixed
  // (0.95-1.10); products of one tile lost (4 and 8 rows: 1.08-1.18), their tiles reading B
  // once, as did a language model's head (32 rows by 512 × 32,000: 1.05), whose C then went
  // through memory once a slice. A K of less than two slices stays whole (EfficientNet-B0's 7x7
  // expansions, K = 192 in two slices of 96: 1.01-1.03 at two threads). The narrower tiles,
  // which take B half as fast, gained nothing certain: 14x32 (MobileNetV2's 7x7 projections
  // from 960 channels, 1.01-1.02) and AVX2's (0.92-1.06, one thread).
  constexpr int64_t kFewRows = 64;
  const int64_t slice = std::max<int64_t>(16, round_down(caches.l1d * 2 / 3 / (4 * tile.nr), 16));
  if (isa == Isa::avx512 && tile.nr >= 48 && m > tile.mr && m <= kFewRows && k >= 2 * slice && k * n * 4 >= caches.l2 / 4 &&
      m * n * 4 <= caches.l2 / 4) {
    const int64_t slices = (k + slice - 1) / slice;
    p.kc = std::min(p.kc, round_up((k + slices - 1) / slices, 16));
  }
  // Threads: along N while each thread keeps at least two NR panels, then along M; but never
  // into more M parts than M has MR-row tiles: a product of a row or two (a GEMV, a classifier
  // at batch 1) spreads over N instead of leaving threads without rows (on 16 threads, one row
  // by a 2048x1000 weight ran on 8 of them).
  threads = std::max(1, threads);
  const int64_t panels = (n + tile.nr - 1) / tile.nr;
  p.tn = static_cast<int>(std::clamp<int64_t>(panels / 2, 1, threads));
  while (threads % p.tn != 0) --p.tn;
  p.tm = threads / p.tn;
  if (const int64_t m_tiles = (m + tile.mr - 1) / tile.mr; p.tm > m_tiles) {
    p.tm = static_cast<int>(m_tiles);
    p.tn = static_cast<int>(std::min<int64_t>(panels, threads / p.tm));
  }
  // But along M alone where B fits half of L2 (each thread then reads all of it from its own
  // cache) and each thread has 192 rows or more: each thread writes whole rows of C, the rows
  // the next node's threads read where they share pixels (a depthwise convolution's), so what
  // each core wrote is in its own L2. At two threads, split along N instead, EfficientNet-B0's
  // 28x28 expansions (784 rows) took 1.07-1.13x their time and YOLO's 40x40 head layer (1,600
  // rows) 1.32x; but with fewer rows M's split loses: EfficientNet-B0's 14x14 expansions (196
  // rows) took 0.73-1.00 of their time split along N, ViT-S/16's attention projections (197)
  // 0.75, YOLO's 10x10 layers (100) 0.73-0.80, and its 20x20 one (400) tied (the compiled
  // models, 6-10 alternated profiles each way). Over 7x7 pixels (49 rows) N's split was faster
  // too (M's took 1.05-1.14x).
  constexpr int64_t kMinRowsForMSplit = 192;
  if (k * n * 4 <= caches.l2 / 2 && m >= kMinRowsForMSplit * threads) {
    p.tn = 1;
    p.tm = threads;
  }
  const int64_t m_share = (m + p.tm - 1) / p.tm, n_share = (n + p.tn - 1) / p.tn;
  // Mc: A's Mc×Kc block in about half of L2 (when packed); Nc: B's Kc×Nc block in a thread's
  // share of L3.
  p.mc = std::min(round_up(m_share, tile.mr), round_down(caches.l2 / 2 / (4 * p.kc), tile.mr));
  p.nc = std::min(round_up(n_share, tile.nr), round_down(caches.l3 / 2 / (4 * p.kc), tile.nr));
  // But 128 rows where K is 64 or less and B has more than one panel, in half of L2: a short
  // product's time is writing C (and reading a residual), which then goes in blocks of whole
  // rows, the order the hardware prefetches, instead of one panel's columns down all of M and
  // back for the next. EfficientNet-B0's 16 -> 96 expansion at 112x112 took 0.94 of its time so,
  // its 24 -> 144 ones 0.95, ResNet-50's 64 -> 256 residual layers 0.93-0.95 (10 alternated
  // profiles of each model, one thread; EfficientNet-B0's on two: 0.95-0.97); over a longer K
  // it loses (YOLO's 128 and 192 channels: 1.02-1.26).
  if (k <= 64 && n > tile.nr && p.kc * p.nc * 4 <= caches.l2 / 2) p.mc = std::min(p.mc, round_up(128, tile.mr));
  return fit(p, m, n, k);
}

PackedLayout packed_b_layout(int64_t k, int64_t n, int nr, bool trans) {
  PackedLayout l;
  const int64_t np = round_up(n, nr);
  const int64_t kd = trans ? 1 : 0, nd = trans ? 0 : 1;  // the dims of K and N in the stored shape
  l.dims = trans ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  l.padded_dims = trans ? std::vector<int64_t>{np, k} : std::vector<int64_t>{k, np};
  l.strides.assign(2, 0);
  l.strides[static_cast<size_t>(kd)] = nr;
  l.strides[static_cast<size_t>(nd)] = k * nr;
  l.inner_blocks = {nr};
  l.inner_dims = {static_cast<int32_t>(nd)};
  l.packed_for = "kiln gemm_f32 nr" + std::to_string(nr);
  return l;
}

std::optional<PackedLayout> windows_panels_layout(int64_t n, int64_t c, int64_t taps, int64_t nr, int64_t group,
                                                  const std::string& packed_for) {
  if (c % group) return std::nullopt;  // a group of K steps would span two taps
  PackedLayout l;
  l.dims = {n, c, taps};
  l.padded_dims = {round_up(n, nr), c, taps};
  l.strides = {taps * c * nr, group * nr, c * nr};  // group q of B's row of (tap, channel), tap · C + channel
  l.inner_blocks = group > 1 ? std::vector<int64_t>{nr, group} : std::vector<int64_t>{nr};
  l.inner_dims = group > 1 ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{0};
  l.packed_for = packed_for + " windows";
  return l;
}

PackedLayout packed_b_windows_layout(int64_t n, int64_t c, int64_t taps, int nr) {
  return *windows_panels_layout(n, c, taps, nr, 1, "kiln gemm_f32 nr" + std::to_string(nr));
}

int64_t packed_b_floats(int64_t k, int64_t n, int nr) { return round_up(n, nr) * k; }

void pack_b_panels(const float* b, int64_t ld, bool trans, int64_t k0, int64_t kc, int64_t n0, int64_t nc, int nr,
                   float* out, int64_t panel_stride) {
  for (int64_t j0 = 0; j0 < nc; j0 += nr) {
    float* panel = out + (j0 / nr) * panel_stride;
    const int64_t w = std::min<int64_t>(nr, nc - j0);
    if (!trans) {
      for (int64_t p = 0; p < kc; ++p) {
        float* dst = panel + p * nr;
        std::memcpy(dst, b + (k0 + p) * ld + n0 + j0, static_cast<size_t>(w) * sizeof(float));
        std::fill(dst + w, dst + nr, 0.f);
      }
    } else {
      // Bᵀ's rows 16 steps of K (a cache line) at a time, the line after next fetched ahead,
      // so that the 16 panel rows written in between stay in L1. A whole row at once wrote one
      // float to each of K panel rows 256 bytes apart for NR = 64, which share a quarter of
      // L1's sets: ResNet-50's 1x1 weights packed at 2.0-2.4 GB/s so, 7.7-9.9 now with B in
      // the caches. From the page cache: the first run of a ResNet-50 compiled without its
      // batch, at batch 1 and one thread (planning included), 144 → 125 ms (the fetch 131 → 125).
      constexpr int64_t kSteps = 16;
      for (int64_t p0 = 0; p0 < kc; p0 += kSteps) {
        const int64_t steps = std::min(kSteps, kc - p0);
        float* rows = panel + p0 * nr;
        for (int64_t j = 0; j < w; ++j) {
          const float* src = b + (n0 + j0 + j) * ld + k0 + p0;
          __builtin_prefetch(src + 2 * kSteps);
          for (int64_t p = 0; p < steps; ++p) rows[p * nr + j] = src[p];
        }
        if (w < nr)
          for (int64_t p = 0; p < steps; ++p) std::fill(rows + p * nr + w, rows + (p + 1) * nr, 0.f);
      }
    }
  }
}

void pack_a_panels(const float* a, int64_t ld, bool trans, int64_t m0, int64_t mc, int64_t k0, int64_t kc, int mr,
                   float* out) {
  for (int64_t i0 = 0; i0 < mc; i0 += mr) {
    float* panel = out + (i0 / mr) * kc * mr;
    const int64_t h = std::min<int64_t>(mr, mc - i0);
    if (!trans) {
      for (int64_t i = 0; i < h; ++i) {
        const float* src = a + (m0 + i0 + i) * ld + k0;
        for (int64_t p = 0; p < kc; ++p) panel[p * mr + i] = src[p];
      }
    } else {
      for (int64_t p = 0; p < kc; ++p)
        std::memcpy(panel + p * mr, a + (k0 + p) * ld + m0 + i0, static_cast<size_t>(h) * sizeof(float));
    }
    if (h < mr)
      for (int64_t p = 0; p < kc; ++p) std::fill(panel + p * mr + h, panel + (p + 1) * mr, 0.f);
  }
}

void pack_b(const float* b, int64_t ld, bool trans, int64_t k, int64_t n, int nr, float* out) {
  pack_b_panels(b, ld, trans, 0, k, 0, n, nr, out, k * nr);
}

size_t workspace_bytes(const GemmParams& p, const GemmProblem& problem) {
  return thread_bytes(p, problem) * static_cast<size_t>(p.threads());
}

void run(const GemmParams& p, const GemmProblem& g, std::byte* workspace) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.k == 0) {  // no products: C is the bias (or zeros), then the epilogue
    const RowKernels& rows = row_kernels(p.isa);
    const ColumnPart whole{.c = g.c, .ldc = g.ldc};
    const std::span<const ColumnPart> parts = g.parts.empty() ? std::span<const ColumnPart>(&whole, 1) : g.parts;
    if (g.gate_block) {  // value · act(gate) of the biases (or zeros)
      const int64_t blk = g.gate_block;
      for (int64_t i = 0; i < g.m; ++i) {
        float* y = g.c + i * g.ldc;
        float* gate = g.gates + i * g.ldgates;
        for (int64_t j = 0; j < g.n / 2; ++j) {
          const int64_t at = gated_value_column(j, blk);
          y[j] = g.epilogue.bias ? g.epilogue.bias[at] : 0.f;
          gate[j] = g.epilogue.bias ? g.epilogue.bias[at + blk] : 0.f;
        }
        rows.gated_tile(y, g.ldc, gate, g.ldgates, 1, g.n / 2, g.epilogue.act);
      }
      return;
    }
    for (size_t p = 0; p < parts.size(); ++p) {
      const int64_t begin = parts[p].begin, end = p + 1 < parts.size() ? parts[p + 1].begin : g.n, n = end - begin;
      for (int64_t i = 0; i < g.m; ++i) {
        float* c = parts[p].c + i * parts[p].ldc;
        if (g.epilogue.bias) std::memcpy(c, g.epilogue.bias + begin, static_cast<size_t>(n) * sizeof(float));
        else std::fill(c, c + n, 0.f);
        if (!parts[p].plain)
          rows.epilogue(c, g.epilogue.z ? g.epilogue.z + i * g.epilogue.ldz + begin : nullptr, n, g.epilogue.act, g.epilogue.post);
      }
    }
    return;
  }
  const BlockFn block = block_of(p.isa);
  const size_t per_thread = thread_bytes(p, g);
  auto part = [&](int tm, int tn, int t) {
    const auto [m0, m1] = share(g.m, p.tile.mr, tm, t / tn);
    const auto [n0, n1] = share(g.n, g.gate_block ? 2 * g.gate_block : p.tile.nr, tn, t % tn);  // a gate after its values
    if (m0 >= m1 || n0 >= n1) return;
    float* abuf = reinterpret_cast<float*>(workspace + per_thread * static_cast<size_t>(t));
    block(p, g, m0, m1, n0, n1, abuf, abuf + a_block_floats(p));
  };
  // The pool may be smaller than the grid (a plan that runs on one thread): keep the split
  // along N as far as it goes.
  const int threads = std::min(p.threads(), pool_threads());
  if (threads <= 1) {
    part(1, 1, 0);
    return;
  }
  const int tn = std::min(p.tn, threads), tm = threads == p.threads() ? p.tm : threads / tn;
  if (tm == 1 || tn == 1) {
    // A split along one dimension: each thread's even share in chunks that either thread may
    // take (ShareQueues), so that a thread running slower than the other does not hold the
    // product up. On the 2-core host, the threads of a two-thread product finished 6-12 % of
    // its time apart on average with the even split alone (ResNet-50, ViT-S/16, BERT-base).
    const int parts = tm * tn;
    const bool along_n = tm == 1;
    const int64_t unit = along_n ? (g.gate_block ? 2 * g.gate_block : p.tile.nr) : p.tile.mr;
    const int64_t total = along_n ? g.n : g.m, units = (total + unit - 1) / unit;
    const int64_t panel_stride = g.b_panel_stride ? g.b_panel_stride : g.k * p.tile.nr;
    // A product of a few rows streams several panels at once: chunks of at least that many.
    const int64_t group = along_n && g.b_packed && !g.gate_block && g.m <= kStreamRows ? stream_panels(p.isa, p.tile, g.m) : 1;
    ShareQueues queues(parts, std::max(ShareQueues::chunk_for(units, parts), group));
    queues.fill(units);
#pragma omp parallel num_threads(parts)
    {
      WorkerSpan span;
      const int t = omp_get_thread_num();
      float* abuf = reinterpret_cast<float*>(workspace + per_thread * static_cast<size_t>(t));
      queues.drain(t, [&](int64_t c0, int64_t c1, bool more) {
        const int64_t from = c0 * unit, to = std::min(total, c1 * unit);
        if (!along_n) {
          block(p, g, from, to, 0, g.n, abuf, abuf + a_block_floats(p));
          return;
        }
        // The tiles of the chunk's last panel fetch the next chunk's first panel, as they
        // fetch each next one of their own; a share's last chunk fetches what follows it.
        GemmProblem here = g;
        if (more && g.b_packed) here.b_next = g.b + (to / p.tile.nr) * panel_stride;
        block(p, here, 0, g.m, from, to, abuf, abuf + a_block_floats(p));
      });
    }
    return;
  }
#pragma omp parallel num_threads(tm * tn)
  {
    WorkerSpan span;
    part(tm, tn, omp_get_thread_num());
  }
}

void run_batch(const GemmParams& p, const GemmProblem& problem, std::span<const int64_t> a_offsets,
               std::span<const int64_t> b_offsets, int64_t c_stride, int batch_threads, std::byte* workspace) {
  const int64_t count = static_cast<int64_t>(a_offsets.size());
  auto one = [&](int64_t i, std::byte* ws) {
    GemmProblem g = problem;
    g.a += a_offsets[static_cast<size_t>(i)];
    g.b += b_offsets[static_cast<size_t>(i)];
    g.c += c_stride * i;
    if (g.epilogue.z) g.epilogue.z += c_stride * i;
    run(p, g, ws);
  };
  const int threads = std::min<int64_t>({batch_threads, pool_threads(), count});
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) one(i, workspace);
    return;
  }
  const size_t per_thread = workspace_bytes(p, problem);
#pragma omp parallel num_threads(threads)
  {
    WorkerSpan span;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < count; ++i) one(i, workspace + per_thread * static_cast<size_t>(omp_get_thread_num()));
  }
}

}  // namespace kiln::cpu::gemm
