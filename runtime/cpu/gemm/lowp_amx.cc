// The u8·s8 and bf16 GEMMs on AMX tiles (lowp_isa.h), built with AMX-TILE, AMX-INT8, AMX-BF16,
// AVX512-VNNI and AVX512-BF16 (CMake sets the flags for this file); lowp.cc calls them only on
// CPUs that have them and whose operating system granted the tile state (CpuFeatures::amx).
//
// B is pack_b_s8's or pack_b_bf16's: in each panel of NR = 48 columns, K's groups (4 u8 steps
// or a pair of bf16 ones: 4 bytes a column) one after another, NR × 4 bytes each. Sixteen
// columns of sixteen groups are then one tile of B as `tdpbusd` / `tdpbf16ps` read it (16 rows
// of 64 bytes, a group for each of 16 columns), at a stride of NR × 4 bytes, so the vector
// kernels' packed weights serve both. A's rows (u8 read in place; bf16 from a rounded copy, or
// in place where they are bf16 rows of whole chunks: gemm_bf16_tiles) give a tile of 16 rows ×
// 64 bytes per 64 u8 or 32 bf16 steps ("a chunk" of K). Each block keeps R×C (≤ 2×2) tiles of
// 16×16 32-bit sums in tile registers 0-3, A's R row tiles in 4-5 and B's C column tiles in
// 6-7: per chunk it loads R + C tiles and issues R·C products.
//
// Blocking: B's column tiles go in groups that fill a quarter of L2 (lowp.cc picks `nc`), each
// group passing every 32 rows of A. The first group's first pass fetches its panels of B into
// L2 ahead of its tiles; every group's blocks, all passes of them, fetch the next group's
// panels a few lines a chunk, so that a weight streaming from memory arrives while the tiles
// multiply rather than before them; a long K is split into slices whose 32 rows of A stay in L1
// (kSliceBytes), the sums of a slice kept for the next in a buffer of the group's blocks, so
// that the tiles read A from L1 and only B from L2. Once a block's last slice is done its sums
// are stored and finished at once on the vector units (steps past the last whole chunk added
// with `vpdpbusd` / `vdpbf16ps`, then the epilogue), straight into C's rows. (Spreading a
// block's epilogue between the next block's chunks, so that it ran while the tiles multiply,
// was slower: each chunk's tile loads then waited for the epilogue's stores before them.)
// With 32 rows or fewer (a language model's tokens) and a large bf16 B, A passes B once and B
// only streams through: no groups, slices or fetches, a panel's three column tiles a block
// (panel_block).
#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/gemm/lowp_isa.h"
#include "runtime/cpu/gemm/lowp_residual.h"
#include "runtime/cpu/gemm/prefetch.h"
#include "runtime/cpu/lanes16.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm::lowp_amx {

namespace {

constexpr int64_t NR = kLowpTile.nr;
constexpr int64_t kGroupBytes = NR * 4;  // a group of 4 steps of a panel's NR columns
constexpr int64_t kTilesPerPanel = NR / 16;  // column tiles of 16
static_assert(kTilesPerPanel == 3, "panel_block multiplies a panel's three column tiles");
constexpr int64_t kLd = 32;              // columns of a block's sums as stored (two tiles)

// Tile d += tile a · tile b: u8 · s8 summed in s32, or bf16 pairs summed in f32. A macro: GCC's
// tile intrinsics spell their tile numbers into the instruction's text, so they must be literal.
#define KILN_TILE_PRODUCT(T, d, a, b)        \
  if constexpr (T == Lowp::u8s8) {           \
    _tile_dpbusd(d, a, b);                   \
  } else {                                   \
    _tile_dpbf16ps(d, a, b);                 \
  }

// Tiles 0-3 = `init` (R·16 × C·16 sums, kLd apart; null: zero) + A's R·16 rows (`lda` bytes
// apart) · B's column tiles b0, b1 over `chunks` chunks of K. With `fetch`, each chunk also
// asks for the matching 16 rows of another panel of B (3 KiB from `fetch`) to come into L2;
// and each chunk fetches its lines of `pf`'s share.
template <Lowp T, int R, int C>
void products(int64_t chunks, const uint8_t* a, int64_t lda, const uint8_t* b0, const uint8_t* b1, const void* init,
              const uint8_t* fetch, PanelPrefetch pf) {
  constexpr int64_t stride = kLd * 4;
  const auto* in = static_cast<const uint8_t*>(init);
  if (in) {
    _tile_loadd(0, in, stride);
    if constexpr (C > 1) _tile_loadd(1, in + 64, stride);
    if constexpr (R > 1) _tile_loadd(2, in + 16 * stride, stride);
    if constexpr (R > 1 && C > 1) _tile_loadd(3, in + 16 * stride + 64, stride);
  } else {
    _tile_zero(0);
    if constexpr (C > 1) _tile_zero(1);
    if constexpr (R > 1) _tile_zero(2);
    if constexpr (R > 1 && C > 1) _tile_zero(3);
  }
  const uint8_t* a1 = a + 16 * lda;
  for (int64_t s = 0; s < chunks; ++s) {
    const int64_t bo = s * 16 * kGroupBytes;
    if (fetch)
      for (int64_t line = 0; line < 16 * kGroupBytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(fetch + bo + line), _MM_HINT_T1);
    pf.fetch();
    _tile_loadd(6, b0 + bo, kGroupBytes);
    if constexpr (C > 1) _tile_loadd(7, b1 + bo, kGroupBytes);
    _tile_loadd(4, a + s * 64, lda);
    KILN_TILE_PRODUCT(T, 0, 4, 6)
    if constexpr (C > 1) { KILN_TILE_PRODUCT(T, 1, 4, 7) }
    if constexpr (R > 1) {
      _tile_loadd(5, a1 + s * 64, lda);
      KILN_TILE_PRODUCT(T, 2, 5, 6)
      if constexpr (C > 1) { KILN_TILE_PRODUCT(T, 3, 5, 7) }
    }
  }
}

// A whole panel's three column tiles for R·16 rows of A over `chunks` chunks of K, into tiles
// 0-5 (row tile r's column tile j in tile 3r + j), A's row tile in 6 and each column tile of B
// in turn in 7: the second row tile loads the panel's tiles again (from L1). Then the sums of
// the first two column tiles to `sums` (R·16 × 32, kLd apart), the third's to `third`.
template <Lowp T, int R>
void panel_block(int64_t chunks, const uint8_t* a, int64_t lda, const uint8_t* b, void* sums, void* third) {
  constexpr int64_t stride = kLd * 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  if constexpr (R > 1) {
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
  }
  const uint8_t* a1 = a + 16 * lda;
  for (int64_t s = 0; s < chunks; ++s) {
    const uint8_t* bs = b + s * 16 * kGroupBytes;
    _tile_loadd(6, a + s * 64, lda);
    _tile_loadd(7, bs, kGroupBytes);
    KILN_TILE_PRODUCT(T, 0, 6, 7)
    _tile_loadd(7, bs + 64, kGroupBytes);
    KILN_TILE_PRODUCT(T, 1, 6, 7)
    _tile_loadd(7, bs + 128, kGroupBytes);
    KILN_TILE_PRODUCT(T, 2, 6, 7)
    if constexpr (R > 1) {
      _tile_loadd(6, a1 + s * 64, lda);
      _tile_loadd(7, bs, kGroupBytes);
      KILN_TILE_PRODUCT(T, 3, 6, 7)
      _tile_loadd(7, bs + 64, kGroupBytes);
      KILN_TILE_PRODUCT(T, 4, 6, 7)
      _tile_loadd(7, bs + 128, kGroupBytes);
      KILN_TILE_PRODUCT(T, 5, 6, 7)
    }
  }
  auto* out = static_cast<uint8_t*>(sums);
  auto* out3 = static_cast<uint8_t*>(third);
  _tile_stored(0, out, stride);
  _tile_stored(1, out + 64, stride);
  _tile_stored(2, out3, stride);
  if constexpr (R > 1) {
    _tile_stored(3, out + 16 * stride, stride);
    _tile_stored(4, out + 16 * stride + 64, stride);
    _tile_stored(5, out3 + 16 * stride, stride);
  }
}

#undef KILN_TILE_PRODUCT

// Tiles 0-3's sums to `sums` (R·16 × C·16, kLd apart).
template <int R, int C>
void store_sums(void* sums) {
  constexpr int64_t stride = kLd * 4;
  auto* out = static_cast<uint8_t*>(sums);
  _tile_stored(0, out, stride);
  if constexpr (C > 1) _tile_stored(1, out + 64, stride);
  if constexpr (R > 1) _tile_stored(2, out + 16 * stride, stride);
  if constexpr (R > 1 && C > 1) _tile_stored(3, out + 16 * stride + 64, stride);
}

// products<T, R, C> then store_sums<R, C>, for R = rt and C = cols (1 or 2 each).
template <Lowp T, int R, int C>
void block(int64_t chunks, const uint8_t* a, int64_t lda, const uint8_t* b0, const uint8_t* b1, const void* init, const uint8_t* fetch,
           const PanelPrefetch& pf, void* sums) {
  products<T, R, C>(chunks, a, lda, b0, b1, init, fetch, pf);
  store_sums<R, C>(sums);
}
using BlockFn = void (*)(int64_t, const uint8_t*, int64_t, const uint8_t*, const uint8_t*, const void*, const uint8_t*,
                         const PanelPrefetch&, void*);
template <Lowp T>
constexpr BlockFn kBlocks[2][2] = {{&block<T, 1, 1>, &block<T, 1, 2>}, {&block<T, 2, 1>, &block<T, 2, 2>}};

// Column tile t of B (pack_b_s8's or pack_b_bf16's; both have 4-byte groups of NR columns).
const uint8_t* column_tile(const void* b, int64_t panel_bytes, int64_t t) {
  return static_cast<const uint8_t*>(b) + (t / kTilesPerPanel) * panel_bytes + (t % kTilesPerPanel) * 64;
}

// The bytes of a row of A that one slice of K takes: 32 rows of them fill a third of L1 (48 KiB
// on the AMX Xeons). K is sliced where a row is longer and the group has kSlicedPairs pairs of
// column tiles or more to pass each slice of A (with fewer, the sums' trips to the buffer and
// back cost more than L1 saves: BERT's FFN down in bf16, 4 column tiles a group, ran 840 us
// sliced against 746 unsliced). Single thread on the 2-core AMX Xeon, sliced against unsliced:
// bf16 128x768x768 151 against 169 us, 128x3072x768 757 against 812, 1024x1024x1024 2.62
// against 2.76 ms; u8s8 1024x1024x1024 1.07 against 1.13 ms.
constexpr int64_t kSliceBytes = 512, kSlicedPairs = 4;

// An activation as a clamp to [lo, hi]: none (-inf, inf), ReLU (0, inf) or Clip. min(hi, max(lo,
// y)) is then y's activation exactly, NaN and infinities too (`vmaxps` / `vminps` return their
// second operand where either is NaN).
struct Clamp {
  __m512 lo, hi;
  [[gnu::always_inline]] __m512 operator()(__m512 y) const { return _mm512_min_ps(hi, _mm512_max_ps(lo, y)); }
};
bool clamp_of(const ActivationSpec& a, Clamp& c) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  switch (a.kind) {
    case Activation::none: c = {_mm512_set1_ps(-inf), _mm512_set1_ps(inf)}; return true;
    case Activation::relu: c = {_mm512_setzero_ps(), _mm512_set1_ps(inf)}; return true;
    case Activation::clip: c = {_mm512_set1_ps(a.a), _mm512_set1_ps(a.b)}; return true;
    default: return false;
  }
}

// The epilogue past the bias where both its activations are clamps: act, the residual added
// (f32 `z`, bf16 `z16` or none, rows `ldz` apart), post.
struct ClampedEpilogue {
  Clamp act, post;
  const float* z = nullptr;
  const uint16_t* z16 = nullptr;
  int64_t ldz = 0;
};

// A block's sums (rows × `cols` tiles, kLd apart; C's rows from `i0`, columns from n0) plus the
// bias, through `ep`, rounded to bf16 (nearest even) into C's rows (`ldc` apart; w columns).
template <bool Z, bool Z16>
void clamped_bf16_rows(const float* sums, const __m512 (&bias)[2], const ClampedEpilogue& ep, int64_t i0, int64_t n0, int rows, int cols,
                       int w, uint16_t* c, int64_t ldc) {
  uint16_t* const y = c + i0 * ldc + n0;
  const auto row = [&](int i, int j, __mmask16 mk) {
    __m512 v = ep.act(_mm512_add_ps(_mm512_load_ps(sums + i * kLd + j * 16), bias[j]));
    const int64_t zo = (i0 + i) * ep.ldz + n0 + j * 16;
    if constexpr (Z) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, ep.z + zo));
    if constexpr (Z16) v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, ep.z16 + zo)), 16)));
    const __m256i out = (__m256i)_mm512_cvtneps_pbh(ep.post(v));
    if (mk == 0xffff)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldc + j * 16), out);
    else
      _mm256_mask_storeu_epi16(y + i * ldc + j * 16, mk, out);
  };
  if (w == 32) {
    for (int i = 0; i < rows; ++i) row(i, 0, 0xffff), row(i, 1, 0xffff);
    return;
  }
  for (int j = 0; j < cols; ++j) {
    const __mmask16 mk = lanes16(w - j * 16);
    for (int i = 0; i < rows; ++i) row(i, j, mk);
  }
}
using ClampedRowsFn = void (*)(const float*, const __m512 (&)[2], const ClampedEpilogue&, int64_t, int64_t, int, int, int, uint16_t*, int64_t);

// A block of C to finish: rows [i0, i0 + 16·rt) of column tiles t, t + 1 (cols of them).
struct Block {
  int64_t i0, t;
  int rt, cols;
};

// Runs C's column tiles [t0, t1) for rows [0, m) (a multiple of 16) over `chunks` chunks of K
// (A's rows `lda` bytes apart; B's panels `panel_bytes` each), in groups of `nc` column tiles
// and slices of K (32 rows or fewer of a large bf16 B: a panel at a time, K whole), then
// finish(block, sums) for each block once its sums are whole.
template <Lowp T, class Finish>
void run_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t chunks, const uint8_t* a, int64_t lda, const void* b,
               int64_t panel_bytes, Finish&& finish) {
  alignas(64) int32_t sums[32 * kLd];
  amx::configure();
  if (T == Lowp::bf16 && m <= 32 && chunks > 0 && (t1 - t0) * (panel_bytes / kTilesPerPanel) > amx_stream_bytes()) {
    // One pass of A's rows over a share of a bf16 B of more than four L2s: each byte of B is
    // read once and comes from memory, so B streams through, a panel at a time: its three
    // column tiles in one block, which reads the panel's lines in order, and no fetches (the
    // hardware's prefetchers follow a stream on their own). In pairs of column tiles (a panel's
    // first two, then its third with the next one's first), each panel read twice at a stride,
    // with the fetches below, the 32x50257x768 product (a language model's head) read its 77 MB
    // weight from memory at 7.6 GB/s, now at 10.6 (10.1 against 7.3 ms, `kiln_bench_gemm
    // --cold`, one thread; in GPT-2 compiled `--precision bf16 --lower-output-layers`, 11.3
    // against 8.5 ms, `kiln profile`). Smaller weights keep the groups and their fetches:
    // 32x8192x768 (12.6 MB) took 0.94 of their time this way with B cold but 1.14 with B left in
    // L3 by the call before, 32x3072x768 and 32x768x3072 (4.7 MB) 0.94-1.0 and 1.1-1.4;
    // 32x16384x768 (25 MB) 0.80 and 0.82.
    // So did u8s8: GPT-2's int8 head took 3.96 ms this way against 3.37 (its bench 4.2 against
    // 5.5), with the next panel fetched one or two panels ahead 3.8-4.1.
    alignas(64) int32_t third[32 * kLd];
    const int rt = m > 16 ? 2 : 1;
    for (int64_t t = t0; t < t1;) {
      if (t % kTilesPerPanel == 0 && t + kTilesPerPanel <= t1) {
        (rt == 2 ? panel_block<T, 2> : panel_block<T, 1>)(chunks, a, lda, column_tile(b, panel_bytes, t), sums, third);
        finish(Block{0, t, rt, 2}, sums);
        finish(Block{0, t + 2, rt, 1}, third);
        t += kTilesPerPanel;
        continue;
      }
      const int cols = t + 1 < t1 && (t + 1) % kTilesPerPanel != 0 ? 2 : 1;  // up to the panel's end
      kBlocks<T>[rt - 1][cols - 1](chunks, a, lda, column_tile(b, panel_bytes, t), cols > 1 ? column_tile(b, panel_bytes, t + 1) : nullptr,
                                   nullptr, nullptr, PanelPrefetch{}, sums);
      finish(Block{0, t, rt, cols}, sums);
      t += cols;
    }
    amx::release();
    return;
  }
  const int64_t row_bytes = chunks * 64;
  const int64_t pairs = (std::min(nc, t1 - t0) + 1) / 2;  // of a group
  const int64_t slices = row_bytes > kSliceBytes && pairs >= kSlicedPairs ? (row_bytes + kSliceBytes - 1) / kSliceBytes : 1;
  const int64_t per_slice = (chunks + slices - 1) / std::max<int64_t>(slices, 1);
  // The group's blocks' sums between slices: 32 × kLd each, one per pair of column tiles, from
  // a 64-byte boundary (tile loads across cache lines ran at half speed).
  thread_local std::vector<int32_t> partial;
  const size_t need = static_cast<size_t>(pairs * 32 * kLd + 16);
  if (slices > 1 && partial.size() < need) partial.resize(need);
  int32_t* const kept_base = slices > 1 ? reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(partial.data()) + 63) & ~uintptr_t{63}) : nullptr;
  const int64_t passes = (m + 31) / 32, slice_count = chunks > 0 ? (chunks + per_slice - 1) / per_slice : 1;
  for (int64_t tg = t0; tg < t1; tg += nc) {  // a group of B's column tiles stays in L2
    // The next group's panels come into L2 while this group's blocks run, each block (of every
    // pass and slice) fetching an equal share of them a few lines a chunk. Fetched only in the
    // first pass, a group's B arrived at the memory's pace while that pass's tiles waited on it:
    // int8 BERT-base's FFN layers 0.82-0.84x the time with this (kiln profile, one thread).
    const int64_t te = std::min(t1, tg + nc), next_end = std::min(t1, te + nc);
    const int64_t group_blocks = passes * slice_count * ((te - tg + 1) / 2);
    const int64_t next_panel = te / kTilesPerPanel, end_panel = (next_end + kTilesPerPanel - 1) / kTilesPerPanel;
    const uint8_t* next = te < t1 ? static_cast<const uint8_t*>(b) + next_panel * panel_bytes : nullptr;
    const int64_t next_bytes = (end_panel - next_panel) * panel_bytes;
    int64_t block_index = 0;
    for (int64_t i0 = 0; i0 < m; i0 += 32) {  // A's two tiles of rows pass it, a slice of K at a time in L1
      const int rt = m - i0 >= 32 ? 2 : 1;
      const uint8_t* ar = a + i0 * lda;
      for (int64_t c0 = 0; c0 < chunks || c0 == 0; c0 += per_slice) {
        const int64_t c1 = std::min(chunks, c0 + per_slice);
        const bool first = c0 == 0, last = c1 == chunks;
        for (int64_t t = tg; t < te; t += 2) {
          const int cols = static_cast<int>(std::min<int64_t>(2, t1 - t));
          const int64_t bo = c0 * 16 * kGroupBytes;
          int32_t* kept = kept_base ? kept_base + (t - tg) / 2 * 32 * kLd : nullptr;
          // The first group's first pass brings its B from memory: each block fetches the panel
          // of the pair two ahead (once per panel) into L2, as the hardware's prefetchers did
          // not keep up. BERT-base's 73 linear layers at one thread without fetches and with
          // them (a build fetching for every pair): int8 41.7 and 36.9 ms a run, bf16 53.1 and
          // 49.5 ms. Later groups came in while the group before ran (`next`).
          const int64_t ahead = t + 4, ahead_panel = ahead / kTilesPerPanel;
          const uint8_t* fetch = tg == t0 && i0 == 0 && ahead < te && ahead_panel != (ahead - 2) / kTilesPerPanel
                                     ? column_tile(b, panel_bytes, ahead_panel * kTilesPerPanel) + bo
                                     : nullptr;
          const PanelPrefetch pf = PanelPrefetch::share(next, next_bytes, block_index++, group_blocks, c1 - c0);
          kBlocks<T>[rt - 1][cols - 1](c1 - c0, ar + c0 * 64, lda, column_tile(b, panel_bytes, t) + bo,
                                       cols > 1 ? column_tile(b, panel_bytes, t + 1) + bo : nullptr, first ? nullptr : kept, fetch,
                                       pf, last ? sums : kept);
          if (last) finish(Block{i0, t, rt, cols}, sums);
        }
        if (last) break;
      }
    }
  }
  amx::release();
}

// How u8s8_finish ends its rows: through U8s8Finish (or `values` and u8s8_store) in `general`,
// or U8s8Clamped's rows: with its Z (none, u8, s8) and whether a clamp comes before it.
struct AmxFinish {
  bool general = true, act_clamp = false;
  U8s8Clamped::Z z = U8s8Clamped::none;
};

// The epilogue's finishers, made once a product (each block copies the one it uses, so that its
// stores to C leave the copy's constants in registers).
struct Finishers {
  explicit Finishers(const QuantEpilogue& ep) : general(ep), clamped(ep) {}
  U8s8Finish general;
  U8s8Clamped clamped;
};

// A block's sums finished into C's rows below `real` (those past it are A's padding).
template <int C, bool Tail, AmxFinish F>
void u8s8_finish(const Block& blk, const int32_t* sums, int64_t k, int64_t chunks, const uint8_t* a, int64_t lda, const uint8_t* const (&bt)[2],
                 const QuantEpilogue& ep, const Finishers& finishers, void* c, int64_t ldc, int64_t n, int64_t real) {
  const int64_t n0 = blk.t * 16, k4 = (k + 3) / 4;
  const int w = static_cast<int>(std::min<int64_t>(16 * C, n - n0)), rows = static_cast<int>(std::min<int64_t>(16 * blk.rt, real - blk.i0));
  __m512i comp[C];
  __m512 scale[C], bias[C];
  __mmask16 mk[C];
  const __m512i a_zero = _mm512_set1_epi32(ep.a_zero);
  for (int j = 0; j < C; ++j) {  // per column: what A's zero point adds (a_zero · Σb), the scale, the bias
    mk[j] = lanes16(w - j * 16);
    comp[j] = _mm512_mullo_epi32(a_zero, _mm512_maskz_loadu_epi32(mk[j], ep.col_sums + n0 + j * 16));
    scale[j] = _mm512_maskz_loadu_ps(mk[j], ep.scale + n0 + j * 16);
    bias[j] = ep.bias ? _mm512_maskz_loadu_ps(mk[j], ep.bias + n0 + j * 16) : _mm512_setzero_ps();
  }
  const bool direct = u8s8_on_registers(ep);
  const auto fin = [&] {
    if constexpr (F.general) return finishers.general;
    else return finishers.clamped;
  }();
  alignas(64) float values[32 * kLd];
  for (int i = 0; i < rows; ++i) {
    __m512i acc[C];
    for (int j = 0; j < C; ++j) acc[j] = _mm512_load_si512(sums + i * kLd + j * 16);
    if constexpr (Tail) {
      // The steps past the tiles' whole 64s; a last group shorter than 4 loaded masked (B is
      // zero past K, and no byte past A's row is read).
      const uint8_t* ar = a + (blk.i0 + i) * lda;
      for (int64_t g = chunks * 16; g < k4; ++g) {
        const __m128i group = g * 4 + 4 <= k ? _mm_loadu_si32(ar + g * 4)
                                             : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << (k % 4)) - 1), ar + g * 4);
        const __m512i av = _mm512_broadcastd_epi32(group);
        for (int j = 0; j < C; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], av, _mm512_loadu_si512(bt[j] + g * kGroupBytes));
      }
    }
    __m512 y[C];
    for (int j = 0; j < C; ++j) y[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[j], comp[j])), scale[j], bias[j]);
    if constexpr (!F.general) {
      fin.template row<F.act_clamp, F.z>(y, C, static_cast<uint8_t*>(c), ldc, blk.i0 + i, n0, mk);
    } else if (direct) {
      fin.row(y, C, c, ldc, blk.i0 + i, n0, mk);
    } else {
      for (int j = 0; j < C; ++j) _mm512_store_ps(values + i * kLd + j * 16, y[j]);
    }
  }
  if (F.general && !direct) lowp_avx512::u8s8_store(values, kLd, rows, w, ep, c, ldc, blk.i0, n0);
}

using U8s8FinishFn = void (*)(const Block&, const int32_t*, int64_t, int64_t, const uint8_t*, int64_t, const uint8_t* const (&)[2],
                              const QuantEpilogue&, const Finishers&, void*, int64_t, int64_t, int64_t);

// The finish for a block of `cols` column tiles, chosen once a product.
template <bool Tail, AmxFinish F>
U8s8FinishFn finish_of(int cols) {
  return cols == 2 ? u8s8_finish<2, Tail, F> : u8s8_finish<1, Tail, F>;
}

template <bool Tail>
U8s8FinishFn u8s8_finish_for(const QuantEpilogue& ep, int cols) {
  using Z = U8s8Clamped::Z;
  if (!U8s8Clamped::applies(ep)) return finish_of<Tail, AmxFinish{}>(cols);
  const bool act = U8s8Clamped::act_clamps(ep);
  switch (U8s8Clamped::z_kind(ep)) {
    case Z::none: return finish_of<Tail, AmxFinish{false, false, Z::none}>(cols);
    case Z::u8: return act ? finish_of<Tail, AmxFinish{false, true, Z::u8}>(cols) : finish_of<Tail, AmxFinish{false, false, Z::u8}>(cols);
    case Z::s8: return act ? finish_of<Tail, AmxFinish{false, true, Z::s8}>(cols) : finish_of<Tail, AmxFinish{false, false, Z::s8}>(cols);
  }
  return nullptr;
}

}  // namespace

void copy_bf16_rows(const uint16_t* x, int64_t ldx, int64_t rows, int64_t n, uint16_t* out, int64_t ldo, int64_t rows_pad) {
  for (int64_t r = 0; r < rows_pad; ++r) {
    uint16_t* to = out + r * ldo;
    for (int64_t j = 0; j < ldo; j += 32) {  // 32 values a vector, zeros past n and in the padding rows
      const int64_t left = r < rows ? std::clamp<int64_t>(n - j, 0, 32) : 0;
      const __mmask32 mk = left == 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
      _mm512_storeu_si512(to + j, left > 0 ? _mm512_maskz_loadu_epi16(mk, x + r * ldx + j) : _mm512_setzero_si512());
    }
  }
}

void u8s8_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b,
                const QuantEpilogue& ep, void* c, int64_t ldc, int64_t n, int64_t real) {
  const int64_t chunks = k / 64, panel_bytes = (k + 3) / 4 * kGroupBytes;
  const bool tail = chunks * 64 < k;
  const U8s8FinishFn finish[2] = {tail ? u8s8_finish_for<true>(ep, 1) : u8s8_finish_for<false>(ep, 1),
                                  tail ? u8s8_finish_for<true>(ep, 2) : u8s8_finish_for<false>(ep, 2)};
  const Finishers finishers(ep);
  run_tiles<Lowp::u8s8>(m, nc, t0, t1, chunks, a, lda, b, panel_bytes, [&](const Block& blk, const int32_t* sums) {
    const uint8_t* const bt[2] = {column_tile(b, panel_bytes, blk.t), blk.cols > 1 ? column_tile(b, panel_bytes, blk.t + 1) : nullptr};
    if (blk.i0 < real) finish[blk.cols - 1](blk, sums, k, chunks, a, lda, bt, ep, finishers, c, ldc, n, real);
  });
}

void bf16_tiles(int64_t m, int64_t nc, int64_t t0, int64_t t1, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
                const Epilogue& ep, const uint16_t* z16, void* c_out, bool c_bf16, int64_t ldc, std::span<const ColumnPart> parts,
                int64_t row0, int64_t n) {
  const RowKernels& rows_k = row_kernels(Isa::avx512);
  const int64_t k2 = (k + 1) / 2, chunks = k / 32, panel_bytes = k2 * kGroupBytes;
  const int64_t padded = (m + 15) / 16 * 16;  // A's copy has zero rows up to whole tiles
  // GELU alone applies on the registers (as u8s8's), the rest over the block in C.
  const bool gelu = ep.act.kind == Activation::gelu && !ep.z && !z16 && ep.post.kind == Activation::none;
  // A bf16 C: each block finished on the registers where its activations are clamps (no steps of
  // K left past the tiles'), else in f32 here (in L1; a bf16 Z widened beside it), then rounded
  // into C's rows.
  ClampedEpilogue clamped{.z = ep.z, .z16 = z16, .ldz = ep.ldz};
  const bool clamp = c_bf16 && chunks * 16 == k2 && clamp_of(ep.act, clamped.act) && clamp_of(ep.post, clamped.post);
  const ClampedRowsFn clamped_rows = ep.z ? clamped_bf16_rows<true, false> : z16 ? clamped_bf16_rows<false, true> : clamped_bf16_rows<false, false>;
  alignas(64) float block_values[32 * kLd];
  alignas(64) float z_values[32 * kLd];
  auto* const c = c_bf16 ? nullptr : static_cast<float*>(c_out);
  run_tiles<Lowp::bf16>(padded, nc, t0, t1, chunks, reinterpret_cast<const uint8_t*>(a), lda * 2, b, panel_bytes,
                        [&](const Block& blk, const int32_t* sum_bits) {
    const auto* sums = reinterpret_cast<const float*>(sum_bits);
    const int64_t i0 = blk.i0, n0 = blk.t * 16;
    const int w = static_cast<int>(std::min<int64_t>(16 * blk.cols, n - n0));
    const int rows = static_cast<int>(std::min<int64_t>(16 * blk.rt, m - i0));  // the real ones
    const uint8_t* bt[2] = {column_tile(b, panel_bytes, blk.t), blk.cols > 1 ? column_tile(b, panel_bytes, blk.t + 1) : nullptr};
    __m512 bias[2];
    for (int j = 0; j < blk.cols; ++j) bias[j] = ep.bias ? _mm512_maskz_loadu_ps(lanes16(w - j * 16), ep.bias + n0 + j * 16) : _mm512_setzero_ps();
    if (clamp) {
      clamped_rows(sums, bias, clamped, i0, n0, rows, blk.cols, w, static_cast<uint16_t*>(c_out), ldc);
      return;
    }
    const uint16_t* ar = a + i0 * lda;
    // Where each tile of 16 columns goes: C's rows (or the block's values, for a bf16 C), or the
    // part of `parts` that holds them; and whether the activations skip it (a plain part).
    CAt at[2];
    for (int j = 0; j < blk.cols; ++j)
      at[j] = c_bf16 ? CAt{block_values + j * 16, kLd, false}
              : parts.empty() ? CAt{c + i0 * ldc + n0 + j * 16, ldc, false}
                              : c_at(c, ldc, parts, row0 + i0, n0 + j * 16);
    for (int i = 0; i < rows; ++i) {
      __m512 acc[2];
      for (int j = 0; j < blk.cols; ++j) acc[j] = _mm512_add_ps(_mm512_load_ps(sums + i * kLd + j * 16), bias[j]);
      // The pairs past the tiles' whole 32 steps (B and A's copy are zero past K).
      for (int64_t g = chunks * 16; g < k2; ++g) {
        const __m512bh av = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(ar + i * lda + g * 2));
        for (int j = 0; j < blk.cols; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], av, (__m512bh)_mm512_loadu_si512(bt[j] + g * kGroupBytes));
      }
      for (int j = 0; j < blk.cols; ++j)
        _mm512_mask_storeu_ps(at[j].c + i * at[j].ldc, lanes16(w - j * 16), gelu && !at[j].plain ? erf_rational::gelu_erf(acc[j]) : acc[j]);
    }
    if (c_bf16) {
      const float* z = ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr;
      int64_t ldz = ep.ldz;
      if (z16) {
        for (int i = 0; i < rows; ++i) rows_k.widen_bf16(z16 + (i0 + i) * ep.ldz + n0, z_values + i * kLd, w);
        z = z_values, ldz = kLd;
      }
      if ((ep.has_tail() || z16) && !gelu) rows_k.tile_epilogue(block_values, kLd, z, ldz, rows, w, ep.act, ep.post);
      uint16_t* y = static_cast<uint16_t*>(c_out) + i0 * ldc + n0;
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < blk.cols; ++j) {
          const __mmask16 mk = lanes16(w - j * 16);  // the lanes the values were written in
          const __m512 v = _mm512_maskz_load_ps(mk, block_values + i * kLd + j * 16);
          _mm256_mask_storeu_epi16(y + i * ldc + j * 16, mk, (__m256i)_mm512_cvtneps_pbh(v));
        }
      return;
    }
    if (!ep.has_tail() || gelu) return;
    if (parts.empty()) {
      rows_k.tile_epilogue(c + i0 * ldc + n0, ldc, ep.z ? ep.z + i0 * ep.ldz + n0 : nullptr, ep.ldz, rows, w, ep.act, ep.post);
      return;
    }
    for (int j = 0; j < blk.cols; ++j)
      if (!at[j].plain)
        rows_k.tile_epilogue(at[j].c, at[j].ldc, ep.z ? ep.z + i0 * ep.ldz + n0 + j * 16 : nullptr, ep.ldz, rows,
                             std::min(16, w - j * 16), ep.act, ep.post);
  });
}

}  // namespace kiln::cpu::gemm::lowp_amx
