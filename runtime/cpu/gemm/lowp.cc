// The lower-precision GEMMs' packing, dispatch and threads (lowp.h); the kernels are in
// lowp_avx512.cc, f16_avx512.cc and lowp_amx.cc.
#include "runtime/cpu/gemm/lowp.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/ref/nn_util.h"
#include "runtime/threads.h"

namespace kiln::cpu::gemm {

namespace {

constexpr int64_t NR = kLowpTile.nr, MR = kLowpTile.mr;

int64_t panels(int64_t n, int64_t nr = NR) { return (n + nr - 1) / nr; }
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// B's element (p, j) (K×N, or N×K when `trans`; `ld` between stored rows), converted, into
// panel j / nr, group p / g, at (j % nr) · g + p % g: the lower-precision GEMMs' panels (the
// caller zeroed the padding). Reads B's stored rows, one panel's columns at a time, and writes
// a group of K rows as one word: planning bf16 BERT-base's first shape took 800 ms packing by
// columns from weights widened to f32, 181 ms so (int8 233 → 103). Each panel holds `steps`
// steps of K where that is more than K.
template <int64_t g, typename In, typename Out, typename Convert>
void pack_panels(const In* b, int64_t ld, bool trans, int64_t k, int64_t n, int64_t nr, Out* out, Convert convert, int64_t steps = 0) {
  using Bits = std::make_unsigned_t<Out>;
  const int64_t groups = (std::max(k, steps) + g - 1) / g;
  for (int64_t j0 = 0; j0 < n; j0 += nr) {
    Out* panel = out + (j0 / nr) * groups * nr * g;
    const int64_t w = std::min(nr, n - j0);
    if (trans) {
      for (int64_t jj = 0; jj < w; ++jj) {
        const In* row = b + (j0 + jj) * ld;
        for (int64_t p = 0; p < k; ++p) panel[(p / g) * nr * g + jj * g + p % g] = convert(row[p]);
      }
      continue;
    }
    int64_t p = 0;
    if constexpr (g * sizeof(Out) == 4) {  // g whole rows at a time, interleaved as 32-bit words
      for (; p + g <= k; p += g) {
        auto* to = reinterpret_cast<uint32_t*>(panel + (p / g) * nr * g);
        for (int64_t jj = 0; jj < w; ++jj) {
          uint32_t word = 0;
          for (int64_t r = 0; r < g; ++r)
            word |= static_cast<uint32_t>(std::bit_cast<Bits>(convert(b[(p + r) * ld + j0 + jj]))) << (8 * sizeof(Out) * r);
          to[jj] = word;
        }
      }
    }
    for (; p < k; ++p) {
      const In* row = b + p * ld + j0;
      Out* to = panel + (p / g) * nr * g + p % g;
      for (int64_t jj = 0; jj < w; ++jj) to[jj * g] = convert(row[jj]);
    }
  }
}

// Rows of A (of `row_bytes`) whose block fills about half of L2, whole tiles of MR.
int64_t rows_per_block(int64_t row_bytes) {
  return std::max<int64_t>(MR, CacheSizes::host().l2 / 2 / std::max<int64_t>(row_bytes, 1) / MR * MR);
}

// The column tiles of B (`tile_bytes` each) the AMX kernels take as a group: as many as fill a
// quarter of L2 (an even number), which pass every 32 rows of A (in L1) from there while C's
// rows are written along; the rest of L2 holds C's rows and the next group's tiles as they
// arrive. On the 2-core AMX Xeon, u8s8 1024x1024x1024 took 1.35 ms so against 2.15 with A's
// rows in one block of L2 and B's columns 32 at a time over it; a quarter of L2 against half
// (single thread): u8s8 BERT FFN up (128x3072x768) 373 against 415 us, FFN down (128x768x3072)
// 312 against 334, 1024x1024x1024 1.14 against 1.34 ms; bf16 FFN up 876 against 975 us, FFN
// down 839 against 973. An eighth was slower on 1024x1024x1024 (1.49 ms u8s8).
int64_t amx_tiles_per_group(int64_t tile_bytes) {
  return std::max<int64_t>(2, CacheSizes::host().l2 / 4 / std::max<int64_t>(tile_bytes, 1) / 2 * 2);
}

// Runs f(p0, p1) over `count` panels, shared among min(threads, pool, count) threads.
template <class F>
void over_panels(int64_t count, int threads, F&& f) {
  const int t = static_cast<int>(std::min<int64_t>({threads, pool_threads(), count}));
  if (t <= 1) {
    f(0, count);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    WorkerSpan span;
    const int64_t i = omp_get_thread_num(), base = count / t, extra = count % t;
    const int64_t p0 = i * base + std::min<int64_t>(i, extra);
    f(p0, p0 + base + (i < extra ? 1 : 0));
  }
}

// Runs f(r0, r1, c0, c1) on each thread's share of a product's work: rows [r0, r1) of `rows`
// (cut at multiples of `unit`) × columns [c0, c1) of `cols` (B's panels, or pairs of the AMX
// kernels' 16-column tiles). The threads split the columns alone while each gets `least` or
// more; with fewer (a narrow product, or many threads) they split the rows too, in as few groups
// as give each `least` columns (or as many as there are units of rows).
template <class F>
void over_grid(int64_t rows, int64_t unit, int64_t cols, int64_t least, int threads, F&& f) {
  const int64_t units = (rows + unit - 1) / unit;
  const int t = static_cast<int>(std::min<int64_t>({threads, pool_threads(), cols * std::max<int64_t>(1, units)}));
  if (t <= 1) {
    f(0, rows, 0, cols);
    return;
  }
  int tr = 1;  // groups of rows: a divisor of t
  while (tr < t && (t % tr != 0 || cols < least * (t / tr)) && units > tr) ++tr;
  while (t % tr != 0) --tr;
  const int tc = t / tr;
#pragma omp parallel num_threads(t)
  {
    WorkerSpan span;
    const int64_t i = omp_get_thread_num(), ir = i / tc, ic = i % tc;
    const int64_t r0 = std::min(rows, units * ir / tr * unit), r1 = std::min(rows, units * (ir + 1) / tr * unit);
    const int64_t c0 = cols * ic / tc, c1 = cols * (ic + 1) / tc;
    if (r0 < r1 && c0 < c1) f(r0, r1, c0, c1);
  }
}

}  // namespace

std::optional<std::string> lowp_lacks(const CpuFeatures& cpu, Lowp kind) {
  if (!cpu.avx512f || !cpu.avx512bw || !cpu.avx512vl) return "the CPU lacks avx512";
  if (kind == Lowp::u8s8 && !cpu.avx512_vnni) return "the CPU lacks avx512-vnni";
  if (kind == Lowp::bf16 && !cpu.avx512_bf16) return "the CPU lacks avx512-bf16";
  if (kind == Lowp::f16 && !cpu.avx512_fp16) return "the CPU lacks avx512-fp16";
  return std::nullopt;
}

uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stays a (quiet) NaN
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

int64_t packed_b_s8_bytes(int64_t k, int64_t n) { return panels(n) * round_up(k, 4) * NR; }

void pack_b_s8(const int8_t* b, int64_t ld, bool trans, int64_t k, int64_t n, int8_t* out, int32_t* col_sums) {
  std::memset(out, 0, static_cast<size_t>(packed_b_s8_bytes(k, n)));
  pack_panels<4>(b, ld, trans, k, n, NR, out, [](int8_t v) { return v; });
  std::fill(col_sums, col_sums + n, 0);
  if (trans)
    for (int64_t j = 0; j < n; ++j) col_sums[j] = std::accumulate(b + j * ld, b + j * ld + k, int32_t{0});
  else
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) col_sums[j] += b[p * ld + j];
}

namespace {

// Element (p, j) of a K×N B (stored N×K when `trans`) in panel j / NR, group p / g, at
// (j % NR) · g + p % g: N blocked by NR outside K blocked by g (pack_b_s8's g = 4, pack_b_bf16's 2);
// each panel `steps` steps long where that is more than K.
PackedLayout panel_layout(int64_t k, int64_t n, bool trans, int64_t g, std::string packed_for, int64_t nr = NR, int64_t steps = 0) {
  PackedLayout l;
  const int64_t kd = trans ? 1 : 0, nd = trans ? 0 : 1;  // the dims of K and N in the stored shape
  const int64_t padded_k = round_up(std::max(k, steps), g);
  l.dims = trans ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  l.padded_dims.assign(2, 0);
  l.padded_dims[static_cast<size_t>(kd)] = padded_k;
  l.padded_dims[static_cast<size_t>(nd)] = panels(n, nr) * nr;
  l.strides.assign(2, 0);
  l.strides[static_cast<size_t>(kd)] = nr * g;
  l.strides[static_cast<size_t>(nd)] = padded_k * nr;
  l.inner_blocks = {nr, g};
  l.inner_dims = {static_cast<int32_t>(nd), static_cast<int32_t>(kd)};
  l.packed_for = std::move(packed_for);
  return l;
}

}  // namespace

PackedLayout packed_b_s8_layout(int64_t k, int64_t n, bool trans) {
  return panel_layout(k, n, trans, 4, "kiln gemm_u8s8 nr" + std::to_string(NR));
}

std::optional<PackedLayout> packed_b_s8_windows_layout(int64_t n, int64_t c, int64_t taps) {
  return windows_panels_layout(n, c, taps, NR, 4, "kiln gemm_u8s8 nr" + std::to_string(NR));
}

void packed_b_s8_column_sums(const int8_t* packed, int64_t k, int64_t n, int32_t* col_sums) {
  lowp_avx512::s8_column_sums(packed, panels(n), (k + 3) / 4, n, col_sums);
}

int64_t packed_b_bf16_elements(int64_t k, int64_t n, int64_t steps) { return panels(n) * round_up(std::max(k, steps), 2) * NR; }

void pack_b_bf16(const float* b, int64_t ld, bool trans, int64_t k, int64_t n, uint16_t* out) {
  std::memset(out, 0, static_cast<size_t>(packed_b_bf16_elements(k, n)) * 2);
  pack_panels<2>(b, ld, trans, k, n, NR, out, to_bf16);
}

void pack_b_bf16(const uint16_t* b, int64_t ld, bool trans, int64_t k, int64_t n, uint16_t* out, int64_t steps) {
  std::memset(out, 0, static_cast<size_t>(packed_b_bf16_elements(k, n, steps)) * 2);
  pack_panels<2>(b, ld, trans, k, n, NR, out, [](uint16_t v) { return v; }, steps);
}

PackedLayout packed_b_bf16_layout(int64_t k, int64_t n, bool trans, int64_t steps) {
  return panel_layout(k, n, trans, 2, "kiln gemm_bf16 nr" + std::to_string(NR) + (steps > k ? " steps" + std::to_string(steps) : ""), NR,
                      steps);
}

Tensor widened_to_f32(const Tensor& w) { return nn::to_f32(w.is_packed() ? unpack(w) : w); }

size_t bf16_workspace_bytes(int64_t m, int64_t k) {
  // A in MR-row panels of bf16 pairs, or (AMX) in rows of whole 32s, whole tiles of 16 rows.
  return static_cast<size_t>(std::max(round_up(m, MR) * round_up(k, 2), round_up(m, 16) * round_up(k, 32))) * 2;
}

bool u8s8_on_amx(const CpuFeatures& cpu, int64_t m, int64_t k) { return cpu.amx && m >= 16 && k >= 64; }

namespace {

// The epilogue of C's rows from r on: its residual's rows too.
QuantEpilogue from_row(const QuantEpilogue& ep, int64_t r) {
  QuantEpilogue out = ep;
  if (ep.z_f32) out.z_f32 = ep.z_f32 + r * ep.ldz;
  if (ep.z_q) out.z_q = static_cast<const uint8_t*>(ep.z_q) + r * ep.ldz;
  return out;
}

}  // namespace

void gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b_packed,
               const QuantEpilogue& ep, void* c, int64_t ldc, int threads, int64_t mc, bool amx, bool a_padded) {
  if (m <= 0 || n <= 0) return;
  const int64_t bytes = ep.out_u8 ? 1 : 4;  // C's
  QuantEpilogue rest = ep;  // the VNNI kernel's rows' (all, or those past the tiles')
  // Only where this process was granted the tile state (CpuFeatures::host asks for it).
  if (amx && CpuFeatures::host().amx) {
    // The threads share pairs of B's 16-column tiles (a block's two) and the rows; the rows past
    // the last whole 16 go to the VNNI kernel below. A B of an eighth of L2 or less, which each
    // thread can read whole, they share by rows: each then writes C (and reads Z) in one run of
    // whole rows, not the halves of every row. On the 2-core AMX Xeon, two threads, one-layer
    // models of ResNet-50's residual 1x1 convolutions (`kiln profile`, us, columns then rows):
    // 3136x256x64 164-166 then 98-100, 784x512x128 81-83 then 56-58; 196x1024x256 (B 256 KiB)
    // 49-51 either way.
    const int64_t rows = a_padded ? round_up(m, 16) : m / 16 * 16, tiles = (n + 15) / 16;
    const int64_t group = amx_tiles_per_group(round_up(k, 4) * 16);
    const int64_t pairs = (tiles + 1) / 2, least = k * n <= CacheSizes::host().l2 / 8 ? pairs + 1 : 4;
    over_grid(rows, 16, pairs, least, threads, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
      lowp_amx::u8s8_tiles(r1 - r0, group, 2 * p0, std::min(tiles, 2 * p1), k, a + r0 * lda, lda, b_packed, from_row(ep, r0),
                           static_cast<std::byte*>(c) + r0 * ldc * bytes, ldc, n, std::min(m, r1) - r0);
    });
    if (rows >= m) return;
    a += rows * lda;
    c = static_cast<std::byte*>(c) + rows * ldc * bytes;
    m -= rows;
    rest = from_row(ep, rows);
  }
  // A's rows are read where they lie (packing them into MR-row panels, on one thread before the
  // others start, cost 5-10 % of the product). The threads split B's panels while each gets two
  // or more, as the f32 GEMM's do, and the rows too below that (B's panels alone, one thread
  // took one of MobileNetV2's 3136x144x24 and the other two; the two threads of 12544x96x16
  // wrote the halves of each 96-byte row of C): at two threads on a Zen 5, 5 alternated runs,
  // 3136x144x24 26-42 us against 35-51, 12544x96x16 58-102 against 58-93 (medians 58 and 62).
  if (mc <= 0) mc = u8s8_block_rows(k, n, bytes);
  over_grid(m, MR, panels(n), 2, threads, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    lowp_avx512::u8s8_panels(r1 - r0, mc, p0, p1, k, a + r0 * lda, lda, b_packed, from_row(rest, r0),
                             static_cast<std::byte*>(c) + r0 * ldc * bytes, ldc, n);
  });
}

int64_t u8s8_block_rows(int64_t k, int64_t n, int64_t c_bytes, int64_t l2) {
  const int64_t a_row = std::max<int64_t>(round_up(k, 4), 1), c_row = n * c_bytes;
  const int64_t by_a = l2 / 2 / a_row / MR * MR, with_c = round_up(std::max<int64_t>(128, l2 / 4 / (a_row + c_row)), MR);
  return std::max<int64_t>(MR, std::min(by_a, with_c));
}

bool bf16_on_amx(const CpuFeatures& cpu, int64_t k) { return cpu.amx && k >= 32; }

int64_t amx_stream_bytes() { return 4 * CacheSizes::host().l2; }

namespace {

// The rows of A gemm_bf16_tiles copies at a time (a multiple of 16) for rows of `ld` steps: an
// eighth of L2, so that the copy is read back from L2 by the tiles; A's rows where they lie,
// and C's, pass through the memory once (X read in place by oneDNN's convolution).
int64_t bf16_copy_rows(int64_t ld) { return std::max<int64_t>(32, CacheSizes::host().l2 / 8 / (ld * 2) / 16 * 16); }

}  // namespace

size_t bf16_tiles_workspace_bytes(int64_t m, int64_t k, int threads) {
  const int64_t ld = bf16_tile_steps(k);
  return static_cast<size_t>(std::max(threads, 1) * std::min(bf16_copy_rows(ld), round_up(m, 16)) * ld) * 2;
}

void gemm_bf16_tiles(int64_t m, int64_t n, int64_t k, const void* a, bool a_bf16, int64_t lda, const uint16_t* b_packed,
                     const Epilogue& ep, void* c, bool c_bf16, int64_t ldc, int threads, std::byte* workspace, const uint16_t* z16) {
  if (m <= 0 || n <= 0) return;
  const int64_t steps = bf16_tile_steps(k), tiles = (n + 15) / 16, bytes = c_bf16 ? 2 : 4;
  const int64_t group = amx_tiles_per_group(steps * 32), chunk = std::min(bf16_copy_rows(steps), round_up(m, 16));
  // bf16 rows of whole tiles' steps are read where they lie, up to the last whole 16 of them;
  // the rest (f32 rows, rows of other lengths, the last rows) a chunk at a time from a copy of
  // each thread's (rounded to bf16 or copied, zeros past K and past the last row).
  const int64_t in_place = a_bf16 && k == steps ? m / 16 * 16 : 0;
  const int level = omp_get_level();  // a thread's copy: its number in over_grid's team, if it makes one
  over_grid(round_up(m, 16), 16, (tiles + 1) / 2, 4, threads, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    auto* copy = reinterpret_cast<uint16_t*>(workspace) + (omp_get_level() > level ? omp_get_thread_num() : 0) * chunk * steps;
    for (int64_t c0 = r0; c0 < r1;) {
      const int64_t c1 = c0 < in_place ? std::min(r1, in_place) : std::min(r1, c0 + chunk), real = std::min(m, c1) - c0;
      const uint16_t* rows = copy;
      int64_t ld = steps;
      if (c0 < in_place) {
        rows = static_cast<const uint16_t*>(a) + c0 * lda, ld = lda;
      } else if (a_bf16) {
        lowp_amx::copy_bf16_rows(static_cast<const uint16_t*>(a) + c0 * lda, lda, real, k, copy, steps, c1 - c0);
      } else {
        amx::to_bf16_rows(static_cast<const float*>(a) + c0 * lda, lda, real, k, copy, steps, steps, c1 - c0);
      }
      Epilogue at = ep;
      if (ep.z) at.z = ep.z + c0 * ep.ldz;
      lowp_amx::bf16_tiles(real, group, 2 * p0, std::min(tiles, 2 * p1), steps, rows, ld, b_packed, at, z16 ? z16 + c0 * ep.ldz : nullptr,
                           static_cast<std::byte*>(c) + c0 * ldc * bytes, c_bf16, ldc, {}, c0, n);
      c0 = c1;
    }
  });
}

void gemm_bf16(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b_packed, const Epilogue& ep,
               float* c, int64_t ldc, int threads, std::byte* workspace, int64_t mc, bool amx, std::span<const ColumnPart> parts) {
  if (m <= 0 || n <= 0) return;
  auto* packed = reinterpret_cast<uint16_t*>(workspace);
  if (amx && CpuFeatures::host().amx) {
    // A's rows rounded to bf16 (the threads sharing its tiles of 16 rows), then the threads
    // share pairs of B's 16-column tiles and the rows.
    const int64_t ld = round_up(k, 32), tiles = (n + 15) / 16;
    over_panels((m + 15) / 16, threads, [&](int64_t r0, int64_t r1) {
      const int64_t first = r0 * 16, real = std::max<int64_t>(0, std::min(m, r1 * 16) - first);
      amx::to_bf16_rows(real > 0 ? a + first * lda : a, lda, real, k, packed + first * ld, ld, ld, (r1 - r0) * 16);
    });
    const int64_t group = amx_tiles_per_group(round_up(k, 2) * 32);
    over_grid(round_up(m, 16), 16, (tiles + 1) / 2, 4, threads, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
      Epilogue at = ep;
      if (ep.z) at.z = ep.z + r0 * ep.ldz;
      lowp_amx::bf16_tiles(std::min(m, r1) - r0, group, 2 * p0, std::min(tiles, 2 * p1), k, packed + r0 * ld, ld, b_packed, at, nullptr,
                           c + r0 * ldc, false, ldc, parts, r0, n);
    });
    return;
  }
  const int64_t panel = round_up(k, 2) * MR;
  for (int64_t i0 = 0; i0 < m; i0 += MR) lowp_avx512::bf16_pack_a(a, lda, i0, std::min(MR, m - i0), k, packed + (i0 / MR) * panel);
  if (mc <= 0) mc = rows_per_block(round_up(k, 2) * 2);
  over_panels(panels(n), threads,
              [&](int64_t p0, int64_t p1) { lowp_avx512::bf16_panels(m, mc, p0, p1, k, packed, b_packed, ep, c, ldc, parts, n); });
}

std::optional<std::string> f16_conv_stays_f32(int64_t in, int64_t out, int64_t pixels, bool pointwise) {
  if (in < 16) return "oneDNN is as fast on fewer than 16 input channels";
  if (out <= 32) return "32 or fewer output channels fill half the f16 tile or less";
  if (pointwise && in <= 32 && pixels >= 784)
    return "f32 is faster on 1x1 convolutions of 32 or fewer input channels over 784 pixels or more";
  return std::nullopt;
}

bool f16_pointwise_fuses(int64_t in, int64_t out, int64_t pixels) {
  return f16_conv_stays_f32(in, out, pixels, true).has_value() || (in <= 64 && pixels >= 784);
}

int64_t packed_b_f16_elements(int64_t k, int64_t n) { return panels(n, kF16Tile.nr) * round_up(k, 2) * kF16Tile.nr; }

void pack_b_f16(const uint16_t* b, int64_t ld, bool trans, int64_t k, int64_t n, uint16_t* out) {
  const int64_t nr = kF16Tile.nr;
  if (k <= 0 || n <= 0) return;  // nothing to pack (`out` may be null)
  std::memset(out, 0, static_cast<size_t>(packed_b_f16_elements(k, n)) * 2);
  pack_panels<2>(b, ld, trans, k, n, nr, out, [](uint16_t v) { return v; });
}

void pack_b_f16_from_panels(const float* panels, int64_t k, int64_t n, uint16_t* out) {
  if (k > 0 && n > 0) lowp_avx512::pair_f16(panels, k, n, out);
}

PackedLayout packed_b_f16_layout(int64_t k, int64_t n, bool trans) {
  return panel_layout(k, n, trans, 2, "kiln gemm_f16 nr" + std::to_string(kF16Tile.nr), kF16Tile.nr);
}

std::optional<PackedLayout> packed_b_f16_windows_layout(int64_t n, int64_t c, int64_t taps) {
  return windows_panels_layout(n, c, taps, kF16Tile.nr, 2, "kiln gemm_f16 nr" + std::to_string(kF16Tile.nr));
}

int64_t f16_block_rows(int64_t n, int64_t kc, int64_t l2) {
  const int64_t mr = kF16Tile.mr, copy_row = round_up(kc, 2) * 2, c_row = n * 4;
  const int64_t by_copy = l2 / 2 / copy_row / mr * mr, with_c = round_up(std::max<int64_t>(128, l2 / 4 / (copy_row + c_row)), mr);
  return std::max(mr, std::min(by_copy, with_c));
}

F16Blocking f16_blocking(int64_t m, int64_t n, int64_t k, int threads, F16Blocking asked, int64_t l2) {
  const int64_t mr = kF16Tile.mr, block = 2 * kF16Block;
  F16Blocking b;
  // K in chunks of at most kc steps, as even as whole blocks make them.
  const int64_t most = asked.kc > 0 ? round_up(asked.kc, block) : kF16Kc;
  const int64_t chunks = std::max<int64_t>(1, (k + most - 1) / most);
  b.kc = std::max<int64_t>(1, std::min(k, round_up((k + chunks - 1) / chunks, block)));
  b.mc = asked.mc > 0 ? round_up(std::min<int64_t>(asked.mc, int64_t{1} << 40), mr) : f16_block_rows(n, b.kc, l2);
  // Split B's panels among the threads when B is the larger to read twice: splitting A's rows,
  // each thread reads all of B (K·N f16); splitting B's panels, each reads the rows of A the
  // others copied (M·K f16). On ResNet-50's 7x7 layers (M = 49) panels were 1.3-1.4x faster
  // at two threads; on its 56x56 ones rows were 1.5x faster; the whole model ran 2.4 % faster
  // splitting panels where N > 2M than where N > M.
  const int64_t t = std::max(1, threads), count = panels(n, kF16Tile.nr), tiles = (m + mr - 1) / mr;
  b.split = asked.split != F16Split::automatic ? asked.split
            : (n > 2 * m && count >= t) || tiles < t ? F16Split::panels
                                                     : F16Split::rows;
  return b;
}

size_t f16_workspace_bytes(int64_t m, int64_t k) {
  return static_cast<size_t>(m * round_up(k, 2)) * 2;  // A's rows in f16, K rounded up to pairs
}

namespace {

// gemm_f16's loops, A's rows copied by pack(m0, rows, out).
template <class Pack>
void f16_product(int64_t m, int64_t n, int64_t k, const Pack& pack, const uint16_t* b_packed, const Epilogue& ep, float* c,
                 int64_t ldc, int threads, std::byte* workspace, const F16Blocking& asked, std::span<const ColumnPart> parts = {}) {
  if (m <= 0 || n <= 0) return;
  const int64_t mr = kF16Tile.mr;
  auto* packed = reinterpret_cast<uint32_t*>(workspace);
  const int64_t count = panels(n, kF16Tile.nr), tiles = (m + mr - 1) / mr;
  const int t = static_cast<int>(std::min<int64_t>(threads, pool_threads()));
  // A kernel resolves its blocking once, as it prepares; a bare call here.
  const bool resolved = asked.mc > 0 && asked.kc > 0 && asked.split != F16Split::automatic;
  const F16Blocking b = resolved ? asked : f16_blocking(m, n, k, t, asked);
  const int64_t kc = b.kc, mc = b.mc, words = (k + 1) / 2;  // words per row of A's copy
  if (t > 1 && b.split == F16Split::panels) {
    // Each thread takes some of B's panels over all of A, which the threads copy first.
    over_panels(tiles, threads, [&](int64_t t0, int64_t t1) { pack(t0 * mr, std::min(m, t1 * mr) - t0 * mr, packed + t0 * mr * words); });
    over_panels(count, threads,
                [&](int64_t p0, int64_t p1) { f16_avx512::panels(m, mc, kc, p0, p1, k, packed, b_packed, ep, c, ldc, parts, 0, n); });
    return;
  }
  // Each thread takes a range of A's rows and copies them `mc` at a time into its part of the
  // workspace, running every panel over a block while it is in L2 (a convolution's windows
  // copied whole would be KH · KW times the image, written to memory and read back).
  over_panels(tiles, threads, [&](int64_t t0, int64_t t1) {
    const int64_t r0 = t0 * mr, r1 = std::min(m, t1 * mr);
    uint32_t* block = packed + r0 * words;
    for (int64_t i0 = r0; i0 < r1; i0 += mc) {
      const int64_t rows = std::min(mc, r1 - i0);
      pack(i0, rows, block);
      Epilogue at = ep;
      if (ep.z) at.z = ep.z + i0 * ep.ldz;
      f16_avx512::panels(rows, rows, kc, 0, count, k, block, b_packed, at, c, ldc, parts, i0, n);
    }
  });
}

}  // namespace

void gemm_f16(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b_packed, const Epilogue& ep, float* c,
              int64_t ldc, int threads, std::byte* workspace, const F16Blocking& blocking, std::span<const ColumnPart> parts) {
  f16_product(
      m, n, k, [&](int64_t m0, int64_t rows, uint32_t* out) { f16_avx512::pack_a(a, lda, m0, rows, k, out); }, b_packed, ep, c,
      ldc, threads, workspace, blocking, parts);
}

void gemm_f16_windows(int64_t m, int64_t n, const ImageWindows& g, const float* x, const uint16_t* b_packed, const Epilogue& ep,
                      float* c, int64_t ldc, int threads, std::byte* workspace, const F16Blocking& blocking) {
  f16_product(
      m, n, g.k(), [&](int64_t m0, int64_t rows, uint32_t* out) { f16_avx512::pack_windows(g, x, m0, rows, out); }, b_packed, ep,
      c, ldc, threads, workspace, blocking);
}

}  // namespace kiln::cpu::gemm
