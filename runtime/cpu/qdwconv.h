// kiln's int8 depthwise convolution (kiln.qdwconv_u8s8_avx512, runtime/cpu/qdwconv.cc): what
// the kernel prepares once and what its AVX-512 VNNI build (qdwconv_avx512.cc) computes a row
// at a time.
//
// `vpdpbusd` adds four u8 · s8 products into each 32-bit lane. Here the four are four filter
// rows of one filter column and one channel: for each input column, the bytes of four input
// rows are interleaved (two byte unpacks and two word unpacks of 64 channels), so that lane i
// of "quad" vector v holds channel 16·(i / 4) + 4·v + i % 4's four rows. A quad serves every
// output column whose window covers its input column, against the packed weights of that
// filter column (the same interleave of four filter rows, zero past the filter's height). The
// sums' lanes are therefore channels in that order; two saturating packs (s32 → s16 of vectors
// 0 and 1, 2 and 3, then s16 → u8) undo it, so a block's 64 codes are stored in channel order.
// A last block of 32 channels or fewer (a layer of 32 or fewer, or 96, 480, 672...) runs in
// pair mode (Params::pair): each vector's halves are two output columns, so no lane runs empty
// past the block's 32nd channel.
#pragma once

#include <cstdint>

namespace kiln::cpu::qdw {

/// Channels a block (four vectors of sums); rows of the filter a group (one quad).
inline constexpr int64_t kBlock = 64, kGroupRows = 4;

/// What the row kernel needs, set once by prepare.
struct Params {
  int64_t h = 0, w = 0, c = 0;  ///< x is [n, h, w, c] u8
  int64_t kh = 0, kw = 0, s = 1, pt = 0, pl = 0;
  int64_t oh = 0, ow = 0;  ///< y is [n, oh, ow, c] u8
  int64_t blocks = 0, groups = 0;
  uint8_t x_zero = 0;  ///< the bytes of a padded pixel
  /// [blocks][groups][kw][4 vectors][64 bytes]: each lane's four rows of the filter column.
  const int8_t* weights = nullptr;
  /// [blocks][4 vectors][16 lanes] each, in the sums' lane order: where a lane's sum starts,
  /// −x's zero point · Σw (so that the sum is Σ (x − zx)·w, exactly, as oneDNN's and the
  /// reference's are), and the factor and the offset that make it its value: with SiLU,
  /// y = sum · x_scale·w_scale + bias (the SiLU's argument); otherwise that y already in y's
  /// codes (· 1 / y_scale, + y's zero point), unrounded.
  const int32_t* start = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
  bool silu = false;
  float inv_y_scale = 1, y_zero = 0;  ///< SiLU's values into codes
  /// The codes' bounds before rounding: ReLU's or Clip's in codes, within [−1, 256] (the packs
  /// saturate to 0..255 after).
  float lo = -1, hi = 256;
  /// The last block has 32 channels or fewer (a layer of 32 or fewer: MobileNetV2's and
  /// EfficientNet-B0's first depthwise layers; 96, 480 or 672 channels) and runs in pair mode:
  /// its vectors hold two output columns, each half the 32-channel quads of one (lane i of
  /// vector v: the block's channel 16·(i % 8 / 4) + 4·v + i % 4, of column j for i < 8 and
  /// j + 1 after), where a block of 64 would run half its lanes empty. Its weights and
  /// constants repeat in both halves.
  bool pair = false;
};

/// Input columns a row's quads cover in pair mode: one output column more than the row has
/// (the second half of the last pair when the width is odd), so that every load stays inside.
inline int64_t pair_columns(const Params& p) { return p.ow * p.s + p.kw; }
/// Quads (32 bytes each) a group holds in pair mode, for each of its 4 vectors: the columns of
/// each residue modulo the stride together, so that columns q and q + s are adjacent and one
/// 64-byte load gives both halves of a pair's vector.
inline int64_t pair_slots(const Params& p) { return p.s * ((pair_columns(p) + p.s - 1) / p.s); }

/// Bytes of one thread's scratch: a block's quads of each group over the input columns the
/// output row reads (the full blocks' and the pair-mode block's in turn).
inline int64_t scratch_bytes(const Params& p) {
  const int64_t full = p.blocks > (p.pair ? 1 : 0) ? p.groups * ((p.ow - 1) * p.s + p.kw) * 4 * kBlock : 0;
  const int64_t pair = p.pair ? p.groups * 4 * pair_slots(p) * 32 : 0;
  return full > pair ? full : pair;
}

/// Output row `oy` of an image: y's row (y: the image's [oh, ow, c]) from x (its [h, w, c]),
/// `scratch` 64-byte aligned, scratch_bytes long.
using RowFn = void (*)(const Params& p, const uint8_t* x, uint8_t* y, int64_t oy, uint8_t* scratch);
/// The row kernel for p's filter and stride (chosen once, when the kernel is prepared).
RowFn row_kernel(const Params& p);

}  // namespace kiln::cpu::qdw
