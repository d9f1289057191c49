// kiln's own f32 GEMM templates (runtime/cpu/gemm/): C = A·B with a fused epilogue, built from a
// register-tile micro-kernel (MR rows × NR columns of C held in vector registers, one build
// per ISA), cache blocking (Kc of the shared dimension, Mc rows of A, Nc columns of B) and a
// grid of threads over M and N. Every choice is one field of GemmParams, whose name() is what
// profiles and compiled models show (`gemm_f32_avx512_6x64_mc192_nc3072_kc256_t2x1`), and
// which `--mode max-autotune` will search over.
//
// The loops, per thread's block of C (BLIS's order, for the small-M products of inference):
//   for each Nc columns:  for each Kc slice:  B's Kc×Nc block (packed: panels of NR columns)
//     for each Mc rows:  A's Mc×Kc block (packed into panels of MR rows, or read in place)
//       for each NR panel of B:  for each MR rows:  the micro-kernel over Kc
// A constant B (a weight) is packed once, ahead, over the whole of K (pack_b), so a run reads
// it where it lies; the epilogue (bias, activation, residual, second activation) is applied to
// each MR×NR tile right after its last Kc slice, while it is in L1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "formats/layout.h"
#include "formats/ops/epilogue.h"
#include "runtime/cpu/rows.h"

namespace kiln::cpu::gemm {

/// A register tile a build has a micro-kernel for.
struct Tile {
  int mr = 0, nr = 0;
  bool operator==(const Tile&) const = default;
};

/// The register tiles of an ISA's build, the preferred first. AVX-512 (32 registers of 16
/// floats): 8x48, 6x64, 14x32, 4x64; AVX2 (16 registers of 8 floats): 6x16, 4x24, 3x32.
std::span<const Tile> tiles(Isa isa);

/// One GEMM template instance: the ISA build, the register tile, the cache blocks and the
/// thread grid (tm × tn threads over M and N).
struct GemmParams {
  Isa isa = Isa::avx512;
  Tile tile;
  int64_t mc = 0, nc = 0, kc = 0;  ///< multiples of mr, nr, and any positive K slice
  int tm = 1, tn = 1;              ///< threads along M and along N
  bool pack_a = true;              ///< pack A's Mc×Kc blocks, or read A's rows in place

  int threads() const { return tm * tn; }
  /// `gemm_f32_avx512_6x64_mc192_nc3072_kc256_t2x1` (`_ua` when A is read unpacked).
  std::string name() const;
  /// Why these parameters cannot run (a tile the ISA has no kernel for, blocks that are not
  /// multiples of the tile or not positive, no threads), or nullopt.
  std::optional<std::string> invalid() const;
  bool operator==(const GemmParams&) const = default;
};

/// `p` with its blocks no larger than an M×N×K product needs (whole tiles; at least one), so
/// that recorded parameters from a file never size more workspace than the product does.
GemmParams fit(GemmParams p, int64_t m, int64_t n, int64_t k);

/// The data caches a thread sees, in bytes.
struct CacheSizes {
  int64_t l1d = 32 << 10, l2 = 1 << 20, l3 = 8 << 20;
  /// This machine's, from cpuinfo (the defaults above where it cannot tell).
  static const CacheSizes& host();
};

/// The tile of the ISA's build that pads N least (the first listed on a tie).
Tile default_tile(Isa isa, int64_t n);
/// The tile for M rows by a K×N weight: as above, but the preferred tile, the first listed,
/// where it pads N by at most 1 % (AVX2: 4 %) and either B outgrows a thread's share of L3 (it
/// then streams from memory on every call), M fits one of its tiles, or the tile that
/// pads N least pads M more. On GPT-2's LM head (32×768 by 768×50257, 154 MB) 8x48 ran 3-5 %
/// faster than the N-padding choice, 14x32 (whose 14-row tiles compute 42 rows for 32), in the
/// compiled model at 2 threads (kiln_bench_gemm: 10 %); on the LLaMA block's (32×512 by
/// 512×32000) it tied 6x64 there (kiln_bench_gemm: 15 % faster).
Tile default_tile(Isa isa, int64_t m, int64_t n, int64_t k, const CacheSizes& caches);

/// Parameters for an M×N×K product on `threads` threads, derived from the cache sizes: Kc the
/// whole of K while A's MR rows and B's Kc×NR micro-panel fit in three quarters of L2 and
/// the preferred tile's rows of A over Kc in two thirds of L1d, a longer K in equal chunks
/// under both; A read in place; Mc×Kc in half of L2 (but 128 rows where K is 64 or less and B,
/// of more than one panel, fits half of L2: C is then written in blocks of whole rows), B's
/// Kc×Nc block in half
/// a thread's share of L3; threads split N while each gets at least two NR panels, then M, but
/// M alone where B fits half of L2 and each thread has 192 rows or more (whole rows of C, in
/// the cache of the core that the next node's share of those rows runs on).
/// (`kiln_bench_gemm --sweep` measured this on the GEMM targets' shapes: Kc = K up to the L1
/// bound beat every smaller slice, chunks under it beat a longer K whole by 5-25 %, and reading
/// A in place beat packing it, at one and two threads.)
GemmParams default_params(Isa isa, const Tile& tile, const CacheSizes& caches, int64_t m, int64_t n, int64_t k,
                          int threads);

/// B of K×N (or its transpose, N×K, when `trans`) packed for tiles NR columns wide: panels of
/// NR columns, each K rows of NR floats, the last panel zero-padded. The layout depends on NR
/// alone, so one packed weight serves every Mc/Nc/Kc and thread grid.
PackedLayout packed_b_layout(int64_t k, int64_t n, int nr, bool trans);
/// A convolution's weight [N, C, taps] (N output channels, taps = KH·KW) as pack_b packs its
/// transpose in the windows' order (K = taps runs of C channels: in_windows_order's), for tiles
/// NR columns wide: the weight stored in the panels its GEMM reads, as packed_b_layout stores
/// a pointwise one's.
PackedLayout packed_b_windows_layout(int64_t n, int64_t c, int64_t taps, int nr);
/// The layout of a convolution's weight [N, C, taps] packed by a GEMM's packing in the windows'
/// order (K = taps runs of C channels) in panels of `nr` columns, K's steps in groups of
/// `group` (1: f32, 2: f16 pairs, 4: u8s8 quads; "`packed_for` windows"); nullopt where C is
/// not a multiple of `group`, as a group would then span two taps.
std::optional<PackedLayout> windows_panels_layout(int64_t n, int64_t c, int64_t taps, int64_t nr, int64_t group,
                                                  const std::string& packed_for);
/// Floats packed_b writes: ceil(N / NR) · K · NR.
int64_t packed_b_floats(int64_t k, int64_t n, int nr);
/// Packs B (`ld` floats between its rows as stored) into `out` (packed_b_floats long).
void pack_b(const float* b, int64_t ld, bool trans, int64_t k, int64_t n, int nr, float* out);

/// What follows the product, per element of C: post(act(c + bias[col]) + z[row, col]).
struct Epilogue {
  const float* bias = nullptr;  ///< N values, or null
  const float* z = nullptr;     ///< the residual, M×N with `ldz` floats between rows, or null
  int64_t ldz = 0;
  ActivationSpec act, post;

  bool has_tail() const { return z || act.kind != Activation::none || post.kind != Activation::none; }
};

/// Columns [begin, next part's begin) of C, stored apart: at `c`, `ldc` floats between rows;
/// `plain`: the epilogue's activations skip them (the bias still applies).
struct ColumnPart {
  int64_t begin = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool plain = false;
};

/// Where element (row, col) of C lies, the floats between C's rows there and whether the
/// activations skip it: in `c` (rows `ldc` apart), or in the part of `parts` that holds column
/// `col` when there are parts.
struct CAt {
  float* c;
  int64_t ldc;
  bool plain;
};
inline CAt c_at(float* c, int64_t ldc, std::span<const ColumnPart> parts, int64_t row, int64_t col) {
  if (parts.empty()) return {c + row * ldc + col, ldc, false};
  size_t i = parts.size() - 1;
  while (i > 0 && parts[i].begin > col) --i;
  const ColumnPart& part = parts[i];
  return {part.c + row * part.ldc + (col - part.begin), part.ldc, part.plain};
}

/// Columns [begin, next part's begin) of A, stored apart: at `a`, `lda` floats between rows
/// (a pointwise convolution reading the inputs of a channel Concat where they lie). A product
/// takes at most kMaxAParts.
inline constexpr size_t kMaxAParts = 16;
struct APart {
  int64_t begin = 0;
  const float* a = nullptr;
  int64_t lda = 0;
};

/// One product C[M×N] = A[M×K] · B[K×N], then the epilogue.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t lda = 0;      ///< floats between A's rows as stored ([M, K], or [K, M] when trans_a)
  bool trans_a = false;
  /// When not empty, A lies in these parts (at most kMaxAParts; a and lda unused; not trans_a),
  /// the first at column 0: A is read where it lies, whatever GemmParams::pack_a says, and a
  /// tile whose K slice spans parts sums them one after the other in its registers. run only,
  /// not run_batch.
  std::span<const APart> a_parts;
  const float* b = nullptr;
  int64_t ldb = 0;      ///< as for A; unused when b_packed
  bool trans_b = false;
  bool b_packed = false;  ///< B is pack_b's output for the tile's NR
  /// Floats between a packed B's panels: 0 for K · NR (B packed over this product's K); more
  /// when the product reads a slice of a B packed over a longer K (b then points into it).
  int64_t b_panel_stride = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  /// When not empty, C lies in these parts (c and ldc unused): a merged projection writing Q,
  /// K and V where each is read. The first begins at 0; every begin is a multiple of the
  /// tile's NR, so that no tile straddles two parts. run only, not run_batch.
  std::span<const ColumnPart> parts;
  /// A gated product (SwiGLU's up and gate projections in one): when positive, B's N columns
  /// alternate `gate_block` values and the `gate_block` gates of those values, and C (ldc) is
  /// the product's output, N / 2 wide, value · act(gate) (the epilogue's act; no Z, no post).
  /// gate_block is a multiple of the tile's NR and N of 2 · gate_block. `gates` (M × N / 2,
  /// rows `ldgates` apart) holds the gates while their K slices are summed. run only.
  int64_t gate_block = 0;
  float* gates = nullptr;
  int64_t ldgates = 0;
  /// A packed B the caller multiplies next (Winograd's 36 products one after the other): the
  /// tiles of this product's last panel fetch its first panel, as they fetch each next one of
  /// their own. Null: none.
  const float* b_next = nullptr;
  bool accumulate = false;  ///< C += A·B (then the epilogue) instead of C = A·B
  Epilogue epilogue;
};

/// Workspace bytes one product needs with these parameters (A and B blocks per thread).
size_t workspace_bytes(const GemmParams& p, const GemmProblem& problem);

/// Runs the product on the calling thread's OpenMP pool with min(p.threads(), pool size)
/// threads; `workspace` is workspace_bytes long and 64-byte aligned. The parameters must be
/// valid (GemmParams::invalid) for this ISA, which the caller's CPU must have.
void run(const GemmParams& p, const GemmProblem& problem, std::byte* workspace);

/// Runs a batch of products of the same shape: product i reads A at problem.a + a_offsets[i]
/// and B at problem.b + b_offsets[i] (elements), and writes C (and reads Z) c_stride · i
/// elements on. With `batch_threads` > 1 the products are shared among that many threads, each
/// running whole products with `p` (whose grid must then be 1×1), and `workspace` holds
/// workspace_bytes for each; otherwise they run one after the other, each on p's grid.
void run_batch(const GemmParams& p, const GemmProblem& problem, std::span<const int64_t> a_offsets,
               std::span<const int64_t> b_offsets, int64_t c_stride, int batch_threads, std::byte* workspace);

}  // namespace kiln::cpu::gemm
