// A weight's next panel fetched into L2 while the tiles of the current one run. A constant B is
// read once a call and outgrows L2, so each panel streams from L3 or memory; without this the
// first tile of every panel waits on it. Each tile of a panel takes an equal share of the next
// panel's lines and fetches a few of them every kFetchSteps steps of its K loop (kiln's f32,
// f16, bf16 and u8s8 GEMMs); the AMX tiles' blocks share the next group of panels the same way,
// a few lines a chunk of K.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

namespace kiln::cpu::gemm {

/// The steps of a tile's K loop (of K, or of its pairs or quads of K in the f16, bf16 and u8s8
/// tiles: 3-4 lines of B each) between two fetches. Every 64 steps, a burst of 48 lines for a
/// tile of a 32-row product filled the line fill buffers and stalled the loads of the tile's
/// own panel: fetching every 8 made the 32x32000x512 product (a language model's head) 0.70-0.72
/// of oneDNN's time instead of 0.94-0.97 (kiln_bench_gemm, one thread; 0.78-0.81 instead of
/// 0.94-0.96 on two); every 4 or 16 was between.
inline constexpr int64_t kFetchSteps = 8;

struct PanelPrefetch {
  const char* next = nullptr;  ///< the next line to fetch
  const char* end = nullptr;   ///< past this tile's share
  int64_t lines = 0;           ///< lines per block

  /// Tile `tile` of `tiles` over a panel, whose next panel (`bytes` long from `panel`; null:
  /// none) it fetches its share of over `blocks` blocks of its K loop (PanelShares, once).
  static PanelPrefetch share(const void* panel, int64_t bytes, int64_t tile, int64_t tiles, int64_t blocks);

  /// Before a block: its lines into L2. With the T2 hint: Intel's cores treat it as T1 (into
  /// L2), and on a Zen 3 core T1 was the slowest of the four hints, T2 the steadiest (products
  /// with their weight streaming from memory, alternated in one process, one thread: BERT-base's
  /// 128x3072x768 0.94-0.98 of T1's time, 128x768x768 0.95, ResNet-50's 196x1024x256 0.95-0.97,
  /// none slower beyond 1 %; two threads 0.97-1.00).
  void fetch() {
    for (int64_t l = 0; l < lines && next < end; ++l, next += 64) _mm_prefetch(next, _MM_HINT_T2);
  }
};

/// The shares of a panel's `tiles` tiles in its next panel (`bytes` long from `panel`; null:
/// none), each fetched over `blocks` blocks of a tile's K loop: the divisions made once a panel,
/// not once a tile (two 64-bit divisions a tile were 3-4 % of a short-K product's tile time,
/// MobileNetV2's 112x112 expansion; perf). Every share fetches as many lines a block as the
/// first, so a last, shorter share is done a few blocks early.
class PanelShares {
 public:
  PanelShares(const void* panel, int64_t bytes, int64_t tiles, int64_t blocks) {
    if (!panel || tiles <= 0) return;
    panel_ = static_cast<const char*>(panel);
    all_ = bytes / 64;
    each_ = (all_ + tiles - 1) / tiles;
    lines_ = (each_ + std::max<int64_t>(blocks, 1) - 1) / std::max<int64_t>(blocks, 1);
  }
  /// Tile `tile`'s share.
  PanelPrefetch operator()(int64_t tile) const {
    if (!panel_) return {};
    const int64_t first = std::min(tile * each_, all_), mine = std::min(each_, all_ - first);
    return {panel_ + first * 64, panel_ + (first + mine) * 64, lines_};
  }

 private:
  const char* panel_ = nullptr;
  int64_t all_ = 0, each_ = 0, lines_ = 0;
};

inline PanelPrefetch PanelPrefetch::share(const void* panel, int64_t bytes, int64_t tile, int64_t tiles, int64_t blocks) {
  return PanelShares(panel, bytes, tiles, blocks)(tile);
}

}  // namespace kiln::cpu::gemm
