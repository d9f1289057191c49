// kiln's direct int8 convolution over few input channels (kiln.qconv_direct_u8s8_avx512,
// runtime/cpu/qconv_direct.cc): an image's first layer, over RGB, and on AMX tiles 5 to 64
// channels. What the kernel prepares once and what its AVX-512 VNNI build
// (qconv_direct_avx512.cc) and its AMX build (qconv_direct_amx.cc) compute an output row at a
// time.
//
// A window's row of KW pixels of C channels is KW·C contiguous bytes of a channels-last input
// (9 over RGB with a 3x3 filter). `vpdpbusd` adds four u8 · s8 products into each 32-bit lane:
// each 4-byte group of such a row is broadcast to every lane and multiplied by the filter's four
// weights of those bytes for each lane's output channel (16 a vector). A row's last group reads
// up to 3 bytes past it (the next pixel's), whose weights are zero, so the input is read where
// it lies: no window is gathered. A pixel whose window leaves the image (or whose last group
// would read past the input) has its window's rows copied first, x's zero point outside the
// image; a row above or below the image reads a line of zero points.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::cpu::qcd {

/// Output channels a vector; vectors at most (64 output channels).
inline constexpr int64_t kLanes = 16, kMaxVectors = 4;
/// A window's rows at most, and the 4-byte groups of one at most (KW·C <= 28).
inline constexpr int64_t kMaxRows = 11, kMaxRowGroups = 7;
/// The most output pixels a row kernel's block takes at once (each the window's rows read again
/// `step` bytes on).
inline constexpr int64_t kMaxBlock = 12;

/// What the row kernel needs, set once by prepare.
struct Params {
  int64_t h = 0, w = 0, c = 0;  ///< x is [n, h, w, c] u8
  int64_t kh = 0, kw = 0, s = 1, pt = 0, pl = 0;
  int64_t oh = 0, ow = 0, cout = 0;  ///< y is [n, oh, ow, cout] u8
  int64_t vectors = 0;               ///< ceil(cout / 16)
  int64_t row_groups = 0;            ///< ceil(kw · c / 4)
  uint8_t x_zero = 0;                ///< the bytes of a padded pixel
  /// [kh][row_groups][vectors][16 lanes][4 bytes]: lane i of vector v, output channel 16·v + i,
  /// holds the weights of a window row's bytes 4·g .. 4·g + 3 (byte b is the row's pixel b / c,
  /// channel b % c; zero past kw · c and past cout).
  const int8_t* weights = nullptr;
  /// [vectors][16] each: what x's zero point adds to a lane's sum Σ x·w (zx · Σw: the sums
  /// start at its negative, so that it leaves them exactly, as in oneDNN's and the reference's
  /// arithmetic), and the factor and offset that make the sum Σ (x − zx)·w its value: with
  /// SiLU, y = sum · x_scale·w_scale + bias (the SiLU's argument); otherwise that y already in
  /// y's codes (· 1 / y_scale, + y's zero point), unrounded.
  const int32_t* zero_sums = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
  bool silu = false;
  float inv_y_scale = 1, y_zero = 0;  ///< values (after the SiLU) into codes
  /// The codes' bounds before rounding: [0, 255], narrowed by a ReLU's or Clip's.
  float lo = 0, hi = 255;
  /// x's zero point, zero_line_bytes of them: a window's row above or below the image.
  const uint8_t* zero_line = nullptr;

  // On AMX tiles (amx_rows): the image padded with x's zero point, [hp, wp, c] (padded pixel
  // (py, px) is x's (py − pt, px − pl) inside the image), so that a tile of 16 output pixels'
  // window row ky reads 16 rows of 64 bytes `s·c` apart from padded pixel (oy·s + ky, ox·s),
  // `chunks` of them a window row; its bytes past KW·C meet zero weights.
  int64_t chunks = 0, hp = 0, wp = 0;
  /// [kh][chunks][vectors] tiles of B, each 16 groups × 16 lanes × 4 bytes: lane i of the
  /// tile for vector v, row g, the weights of window row bytes 64·chunk + 4·g .. + 3 for output
  /// channel 16·v + i (zero past kw · c and past cout).
  const int8_t* amx_weights = nullptr;
  /// A residual z (u8, y's shape; AMX only), added in codes after the activation, whose clamp
  /// in codes is then [act_lo, act_hi] ([lo, hi] the codes' bounds, with a ReLU after z):
  /// y's code = clamp(act + (z − z_zero) · z_factor).
  bool residual = false;
  float act_lo = 0, act_hi = 255, z_factor = 1, z_zero = 0;
};

/// Bytes of the line of zero points: a block's pixels' rows and their last groups.
inline int64_t zero_line_bytes(const Params& p) { return (kMaxBlock - 1) * p.s * p.c + p.row_groups * 4 + 64; }
/// Bytes of one thread's scratch: one pixel's window rows, each its groups' bytes.
inline int64_t scratch_bytes(const Params& p) { return p.kh * p.row_groups * 4 + 64; }

/// Output row `oy` of an image: y's row (y: the image's [oh, ow, cout]) from x (its [h, w, c]);
/// `x_end` the end of the whole input (no read goes past it), `scratch` scratch_bytes long.
using RowFn = void (*)(const Params& p, const uint8_t* x, const uint8_t* x_end, uint8_t* y, int64_t oy, uint8_t* scratch);
/// The row kernel for p's output vectors (chosen once, when the kernel is prepared).
RowFn row_kernel(const Params& p);

/// The padded image's width (amx_rows): the input's columns and padding, and those that the
/// last tile of 16 output pixels' 64-byte chunks read.
inline int64_t amx_padded_width(const Params& p) {
  const int64_t tiles_px = (p.ow + 15) / 16 * 16;
  return std::max(p.pl + p.w + p.kw, (tiles_px - 1) * p.s + (p.chunks * 64 + p.c - 1) / p.c);
}
/// Image `x` ([h, w, c]) padded into `padded` ([hp, wp, c]): rows [py0, py1) of it.
void amx_pad(const Params& p, const uint8_t* x, uint8_t* padded, int64_t py0, int64_t py1);
/// Output rows [oy0, oy1) of an image (y its [oh, ow, cout]; z the residual's, or null) from its padded copy, on AMX tiles
/// (qconv_direct_amx.cc, built with AMX-INT8; only on a CPU whose tile state was granted):
/// each tile's sums stored and finished as `block`'s. Loads the tile configuration and
/// releases it.
void amx_rows(const Params& p, const uint8_t* padded, uint8_t* y, const uint8_t* z, int64_t oy0, int64_t oy1);

}  // namespace kiln::cpu::qcd
