// What the GEMM driver (gemm.cc) and its per-ISA builds (gemm.inc, built by gemm_avx512.cc and
// gemm_avx2.cc) share: the packing routines and each build's entry point.
#pragma once

#include <cstdint>

#include "runtime/cpu/gemm/gemm.h"

namespace kiln::cpu::gemm {

/// Packs B's rows [k0, k0 + kc) and columns [n0, n0 + nc) into panels of NR columns, each kc
/// rows of NR floats, `panel_stride` floats apart; columns past nc are zeros.
void pack_b_panels(const float* b, int64_t ld, bool trans, int64_t k0, int64_t kc, int64_t n0, int64_t nc, int nr,
                   float* out, int64_t panel_stride);
/// Packs A's rows [m0, m0 + mc) and columns [k0, k0 + kc) into panels of MR rows, each kc
/// columns of MR floats (panel p at p · kc · MR); rows past mc are zeros.
void pack_a_panels(const float* a, int64_t ld, bool trans, int64_t m0, int64_t mc, int64_t k0, int64_t kc, int mr,
                   float* out);

/// The most rows a block may have for its tiles to stream several panels of a packed B at once
/// (gemm.inc's streams_tile); each build's `streams` says how many, by rows.
inline constexpr int kStreamRows = 4;

/// One thread's part of a product: C's rows [m0, m1) and columns [n0, n1) (n0 a multiple of
/// NR), through `abuf` (Mc·Kc floats, rounded up to whole MR panels) and `bbuf` (Kc·Nc
/// floats, rounded up to whole NR panels; unused when B is packed).
using BlockFn = void (*)(const GemmParams& p, const GemmProblem& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                         float* abuf, float* bbuf);

// Each build's entry point and register tiles (the default first).
namespace avx512 {
extern const BlockFn kBlock;
extern const std::span<const Tile> kTiles;
int stream_panels(const Tile& t, int64_t rows);  ///< panels a block of `rows` rows takes at once (1 or more)
}  // namespace avx512
namespace avx2 {
extern const BlockFn kBlock;
extern const std::span<const Tile> kTiles;
int stream_panels(const Tile& t, int64_t rows);
}  // namespace avx2

}  // namespace kiln::cpu::gemm
