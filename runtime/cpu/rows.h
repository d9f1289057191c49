// kiln's own row kernels (runtime/cpu/): loops over contiguous rows of f32 that the compiler
// vectorises, built once per ISA (rows_avx512.cc with AVX-512, rows_avx2.cc with AVX2 + FMA)
// and chosen at run time from the target's CPU features, never the build machine's.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/ops/epilogue.h"
#include "runtime/target.h"

namespace kiln::cpu {

enum class Isa { avx2, avx512 };

/// The binary elementwise ops RowKernels::binary computes, as the reference kernels define them
/// (Max and Min as a < b ? b : a and b < a ? b : a, so NaNs fall the same way).
enum class BinaryOp { add, sub, mul, div, max, min, square };

/// RowKernels::softmax_block's causal limit when there is none.
inline constexpr int64_t kNoCausal = INT64_MAX;

/// The best ISA path the CPU has, or nullopt when it has neither (the reference kernels run).
std::optional<Isa> best_isa(const CpuFeatures& cpu);
/// "avx512" / "avx2", as kernel names carry it.
const char* isa_name(Isa isa);
/// The CPU features a build for `isa` uses.
CpuFeatures isa_features(Isa isa);
/// Why a kernel built for `isa` cannot run on `cpu` ("the CPU lacks avx512"), or nullopt.
std::optional<std::string> lacks(const CpuFeatures& cpu, Isa isa);

/// A per-tensor quantization: scale, zero point, and whether the values are u8 (else s8).
struct Int8Params {
  float scale = 1;
  int32_t zero = 0;
  bool u8 = true;
};

/// QLayerNormalization's constants (RowKernels::qnorm): x's and y's quantization, the scale
/// and bias over the normalized dims (bias may be null), and the same folded into y's
/// quantization, scale / y.scale and bias / y.scale + y.zero (never null; the kernel's).
struct QNormParams {
  Int8Params x, y;
  const float* scale = nullptr;
  const float* bias = nullptr;
  const float* scale_y = nullptr;
  const float* bias_y = nullptr;
  float eps = 1e-5f;
};

/// A 2-D pool's window over channels-last images (RowKernels::max_pool): kh x kw taps, strides
/// sh / sw, dilations dh / dw, top / left padding pt / pl.
struct PoolWindow {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0;
};

/// The values RowKernels::max_pool compares, its index.
enum class PoolValues { f32, bf16, u8, s8 };

struct RowKernels {
  /// y = (x - mean) / sqrt(var + eps) * scale + bias per row of d values (bias may be null);
  /// with `rms`, y = x / sqrt(mean(x²) + eps) * scale.
  void (*norm)(const float* x, const float* scale, const float* bias, float* y, int64_t rows, int64_t d, float eps,
               bool rms);
  /// In place: row = softmax(row * scale + mask_row) per row of n values; mask_row may be null,
  /// `mask_stride` apart (0: one row for all), and masked by -inf; a row that is -inf everywhere
  /// becomes NaN (as the reference does). e^x is a vectorised polynomial, within 2e-7 relative
  /// (AVX-512: for |x| <= 1, 6e-7 to 10, less than 4e-6 to 87.3), and exactly 0 for masked
  /// entries (below e^-87.3), never a denormal.
  void (*softmax)(float* rows, int64_t count, int64_t n, float scale, const float* mask, int64_t mask_stride);
  /// One step of flash attention's online softmax, on the calling thread: a block of `rows`
  /// score rows of n keys (`lds` apart) becomes, in place, x = s·scale + mask (an additive f32
  /// `mask`, or a bool `keep` where false is −∞; rows `mask_stride` apart; both may be null),
  /// keys j > causal + i out when causal is not kNoCausal, then p = e^(x − m'), where m' is the
  /// row's running maximum m[i] taken over the block; the running sum becomes l·e^(m − m') +
  /// Σp, and the row of the output accumulated so far (dv values of `o`, `ldo` apart) is
  /// scaled by e^(m − m') unless the row had nothing to attend to before (o is then left as it
  /// is, for the block's P·V to write). A row with nothing to attend to yet adds zeros. `only`:
  /// the row's only block of keys: p is divided by its sum instead (P·V is then the output; a
  /// row with nothing to attend to is NaN), and m, l and o are left alone.
  void (*softmax_block)(float* s, int64_t lds, int64_t rows, int64_t n, float scale, const float* mask, const bool* keep,
                        int64_t mask_stride, int64_t causal, float* m, float* l, float* o, int64_t ldo, int64_t dv, bool only);
  /// The same, with the probabilities p written as bf16 (nearest even) into `p16`, rows `ldp`
  /// apart, with zeros from the last valid key up to n rounded up to 32 (AMX's whole tiles); the
  /// scores' block is left as scratch.
  void (*softmax_block_bf16)(float* s, int64_t lds, int64_t rows, int64_t n, float scale, const float* mask, const bool* keep,
                             int64_t mask_stride, int64_t causal, float* m, float* l, float* o, int64_t ldo, int64_t dv, uint16_t* p16,
                             int64_t ldp);
  /// The fused ops' epilogue in place over n values: y = post(act(y) + z) (z may be null).
  /// Sigmoid, Silu and the tanh GELU use the polynomial e^x, Tanh and the exact GELU rational
  /// polynomials (tanh, erf), each within a few ulp.
  void (*epilogue)(float* y, const float* z, int64_t n, const ActivationSpec& act, const ActivationSpec& post);
  /// The epilogue over a tile of `rows` rows of n values, `ldy` (and Z's `ldz`) apart, on the
  /// calling thread: what a GEMM applies to each register tile it finishes.
  void (*tile_epilogue)(float* y, int64_t ldy, const float* z, int64_t ldz, int64_t rows, int64_t n,
                        const ActivationSpec& act, const ActivationSpec& post);
  /// A gated product's tile (SwiGLU): values[i, j] ·= act(gates[i, j]) over `rows` rows of n,
  /// each `ldv` / `ldg` floats apart; the gates are overwritten. On the calling thread.
  void (*gated_tile)(float* values, int64_t ldv, float* gates, int64_t ldg, int64_t rows, int64_t n, const ActivationSpec& act);
  /// y[r·n + i] = a[r·lda + i·as] op b[r·ldb + i·bs] over `rows` rows of n values, each step 0
  /// (one value for the row) or 1, each row step 0 (the same row for every row) or more; `square`
  /// is a·a (Pow by a constant 2, b unused). y may be a or b. On the calling thread.
  void (*binary)(BinaryOp op, const float* a, int64_t as, int64_t lda, const float* b, int64_t bs, int64_t ldb, float* y,
                 int64_t rows, int64_t n);
  /// y = act(x) over n values (y may be x), as the epilogue computes it.
  void (*activation)(const float* x, float* y, int64_t n, const ActivationSpec& act);
  /// RotaryEmbedding's rotate-half form over x [batch, heads, seq, d] (or [batch, seq, heads·d]
  /// when `seq_major`) into y: per token, with c, s the cache rows of `half` values (row
  /// cache_rows[token], or the token's own index b·seq + t when cache_rows is null), each head's
  /// (x[e], x[e + half]) becomes (c·x[e] − s·x[e + half], s·x[e] + c·x[e + half]); features from
  /// 2·half on are copied.
  void (*rotary)(const float* x, float* y, const float* cos, const float* sin, const int64_t* cache_rows, int64_t batch,
                 int64_t seq, int64_t heads, int64_t d, int64_t half, bool seq_major);
  /// The same rotation over `rows` rows of d features, x's `ldx` and y's `ldy` floats apart
  /// (y may be x), row r taking cache row r (cos and sin [rows, half]) on the calling thread:
  /// what flash attention applies to a block of Q rows or K rows as it loads them.
  void (*rotate_rows)(const float* x, int64_t ldx, float* y, int64_t ldy, const float* cos, const float* sin, int64_t rows,
                      int64_t d, int64_t half);
  /// y[c·ldy + r] = x[r·ldx + c] for r < rows, c < cols: a block of rows transposed, as flash
  /// attention packs Kᵀ's panels (blocks of 16 x 16 in registers on AVX-512). On the calling thread.
  void (*transpose)(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* y, int64_t ldy);
  /// Depthwise 2-D convolution of `planes` [H, W] planes (one filter [KH, KW] and bias per
  /// plane, plane p using filter p % channels), stride s, top/left padding pt/pl, into [OH, OW]
  /// planes, then the epilogue (z: the residual planes, may be null). `scratch` holds
  /// `threads` padded planes of dwconv_scratch_floats each.
  void (*dwconv)(const float* x, int64_t planes, int64_t channels, int64_t h, int64_t w, const float* filters,
                 const float* bias, int64_t kh, int64_t kw, int64_t s, int64_t pt, int64_t pl, float* y, int64_t oh,
                 int64_t ow, const float* z, const ActivationSpec& act, const ActivationSpec& post, float* scratch);
  /// Depthwise 2-D convolution channels-last: x [n, H, W, C] with filters packed [KH, KW, C]
  /// and bias [C] (may be null), stride s, top/left padding pt/pl, into y [n, OH, OW, C], then
  /// the epilogue per output row while it is in cache (z: the residual [n, OH, OW, C], may be
  /// null); kh at most kDwconvNhwcMaxRows. Channels are the vector lanes (contiguous in X, the
  /// filters and Y alike).
  void (*dwconv_nhwc)(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, const float* filters,
                      const float* bias, int64_t kh, int64_t kw, int64_t s, int64_t pt, int64_t pl, float* y,
                      int64_t oh, int64_t ow, const float* z, const ActivationSpec& act, const ActivationSpec& post);
  /// `rows` output rows of that convolution (1, or dwconv_nhwc_step's 2) on the calling thread,
  /// from input rows given by pointer: in[i] the input row [w, c] under filter row i of the
  /// first output row, for i in [i0, i1) (the rows outside the image, in the padding, are not
  /// read; i1 at most kh + rows − 1); the output rows at `out`, ow · c floats apart, then the
  /// epilogue over them (z: their residual, may be null; an activation alone, a ReLU, Clip, SiLU
  /// or Sigmoid, is applied in the registers as the sums are stored). What a fused kernel whose
  /// input rows are computed into a ring of row buffers calls (PointwiseDepthwiseConv's).
  void (*dwconv_nhwc_rows)(const float* const* in, int64_t i0, int64_t i1, int64_t rows, int64_t w, int64_t c,
                           const float* filters, const float* bias, int64_t kh, int64_t kw, int64_t s, int64_t pl, float* out,
                           int64_t ow, const float* z, const ActivationSpec& act, const ActivationSpec& post);
  /// Direct 2-D convolution of few input channels (an image model's first layer) into
  /// channels-last output: x [n, c, h, w] or [n, h, w, c] read through its strides (image `sn`,
  /// row `sy`, pixel `sx`, channel `sc` floats), filters packed [KH, KW, C, K] and bias [K] (may
  /// be null), stride s, top/left padding pt/pl, into y [n, OH, OW, K], then the epilogue per
  /// output row while it is in cache (z: the residual [n, OH, OW, K], may be null). K a multiple
  /// of 16, kh at most kDirectConvMaxRows, kw · c at most kDirectConvMaxTaps. The output
  /// channels are the vector lanes; each input value is broadcast against them.
  void (*direct_conv)(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t sn, int64_t sy, int64_t sx, int64_t sc,
                      const float* filters, const float* bias, int64_t k, int64_t kh, int64_t kw, int64_t s, int64_t pt, int64_t pl,
                      float* y, int64_t oh, int64_t ow, const float* z, const ActivationSpec& act, const ActivationSpec& post);
  /// Winograd F(m x m, 3x3)'s input transform (m = 4 or 2), channels-last, on the calling
  /// thread: for tiles [t0, t1) of one image x [h, w, c] (tile t at tile row t / tiles_w and
  /// column t % tiles_w, its (m + 2)² window from pixel (m·row − pt, m·column − pl), zeros
  /// outside the image), v[ξ·ldv + (t − t0)·c + ch] = (Bᵀ d B)[ξ] of the window d of channel ch
  /// for the (m + 2)² points ξ; `zeros` holds c zeros, read for the pixels outside.
  void (*winograd_input)(int m, const float* x, int64_t h, int64_t w, int64_t c, int64_t tiles_w, int64_t pt, int64_t pl,
                         int64_t t0, int64_t t1, float* v, int64_t ldv, const float* zeros);
  /// Its output transform: for tiles [t0, t1), the m x m outputs Aᵀ p A of the products
  /// p[ξ·ldp + (t − t0)·k + ch] (k output channels) plus bias[ch] (may be null), max(., 0) with
  /// `relu`, written into y [oh, ow, k] where they lie inside it.
  void (*winograd_output)(int m, const float* p, int64_t ldp, int64_t k, int64_t tiles_w, int64_t t0, int64_t t1,
                          const float* bias, bool relu, float* y, int64_t oh, int64_t ow);
  /// Its filter transform: U_ξ = (G g Gᵀ)[ξ] for the (m + 2)² points ξ, computed in floats, as
  /// C×K matrices (input channel ch, output channel o; filters g [k, c, 3, 3]) packed for the f32
  /// GEMM in panels of `nr` columns (pack_b's: element (ch, o) at (o / nr)·c·nr + ch·nr + o % nr,
  /// zeros in the columns past k), U_ξ at u + ξ·point_stride; on the calling thread. With nr = k,
  /// U_ξ is the C×K matrix.
  void (*winograd_filters)(int m, const float* g, int64_t k, int64_t c, int64_t nr, float* u, int64_t point_stride);
  /// Column sums (or maxima, with `max`) of `rows` rows of c values, `ld` floats apart, into
  /// acc[0..c), whose values they start from; on the calling thread (a channels-last global
  /// pool's share of the pixels).
  void (*column_reduce)(const float* x, int64_t rows, int64_t c, int64_t ld, float* acc, bool max);
  /// Output rows [r0, r1) of a 2-D max pool of one channels-last image x [h, w, c] into y
  /// [oh, ow, c] (the output's size given, ceil_mode's included), on the calling thread: each
  /// output pixel the largest of its window's taps inside the image (none: the lowest value),
  /// as the reference compares them (the first tap, then any tap greater than the maximum so
  /// far: NaN stays where it is first, and is passed over later). One function per PoolValues:
  /// f32, bf16 (compared as the floats they are), u8 and s8 codes.
  std::array<void (*)(const void* x, int64_t h, int64_t w, int64_t c, const PoolWindow& win, void* y, int64_t ow, int64_t r0,
                      int64_t r1),
             4>
      max_pool;
  /// QuantizeLinear per tensor over n values: y = saturate(round_half_even(x / scale) + zero)
  /// as u8 (or s8), NaN to the zero point: the reference's arithmetic exactly.
  void (*quantize)(const float* x, void* y, int64_t n, float scale, int32_t zero, bool u8);
  /// DequantizeLinear per tensor: y = (x − zero) · scale from u8 (or s8), exactly.
  void (*dequantize)(const void* x, float* y, int64_t n, float scale, int32_t zero, bool u8);
  /// The smallest and largest of n values and 0 (DynamicQuantizeLinear's range) into lo and
  /// hi; true when a value is NaN.
  bool (*range)(const float* x, int64_t n, float* lo, float* hi);
  /// QAdd in one pass: y = saturate(round_half_even(t) + zy) with t = a·ka + b·kb + c (the
  /// operands' scales over y's folded in, their zero points into c), max(t, 0) with `relu`;
  /// a, b, y u8 or s8 each.
  void (*qadd)(const void* a, bool a_u8, const void* b, bool b_u8, void* y, bool y_u8, int64_t n, float ka, float kb, float c,
               float zy, bool relu);
  /// Codes scaled per column and requantized (QMul), `rows` rows of c values: y =
  /// saturate(round_half_even(a · m[j] + o[j]) + zy), row r's factors and offsets at m + r · ldm
  /// and o + r · ldm (ldm 0: one row of them for every row, a channel gate); a and y u8 or s8.
  void (*qscale)(const void* a, bool a_u8, const float* m, const float* o, int64_t ldm, void* y, bool y_u8, int64_t rows, int64_t c,
                 float zy);
  /// LookupTable: y[i] = table[x[i]] for n u8 codes (s8 ones, with `s8`, plus 128).
  void (*lookup)(const void* x, bool s8, const float* table, float* y, int64_t n);
  /// Column sums of `rows` rows of c codes (u8, or s8), `ld` apart, added into acc[0..c); on the
  /// calling thread (QGlobalAveragePool's share of an image's pixels).
  void (*qcolumn_sum)(const void* x, bool u8, int64_t rows, int64_t c, int64_t ld, int32_t* acc);
  /// QLayerNormalization: LayerNormalization of each row of x (d values) dequantized, the
  /// result quantized into y, on up to `threads` of the pool's threads. On AVX-512 a row's mean
  /// and variance come from its codes' integer sums, and one more pass normalizes and quantizes
  /// it by the folded scale and bias; otherwise each row is dequantized, normalized and
  /// quantized in thread t's f32 row at rows_f32 + t · ld_f32 (dequantize, norm and quantize's
  /// arithmetic).
  void (*qnorm)(const QNormParams& p, const void* x, void* y, int64_t rows, int64_t d, float* rows_f32, int64_t ld_f32, int threads);
  /// Planes into pixels (an image to channels-last): pixels[a·count + b] = planes[b·stride + a]
  /// for a < n pixels and b < count planes of 4-byte elements (moved as bits). Three planes
  /// (RGB) go 16 pixels at a time through two permutes a vector on AVX-512. On the calling thread.
  void (*interleave)(const uint32_t* planes, int64_t stride, int64_t count, uint32_t* pixels, int64_t n);
  /// The same for 1-byte elements (a quantized image): three planes go 16 pixels at a time on
  /// AVX-512, each pixel a 32-bit word of its bytes, the words' bytes packed by a shuffle and a
  /// permute.
  void (*interleave_u8)(const uint8_t* planes, int64_t stride, int64_t count, uint8_t* pixels, int64_t n);
  /// bf16 to f32 over n values (exact: the bits moved up). On the calling thread.
  void (*widen_bf16)(const uint16_t* x, float* y, int64_t n);
  /// f32 to bf16 over n values, rounded to nearest even, NaN kept a (quiet) NaN: bfloat16's
  /// conversion. On the calling thread.
  void (*narrow_bf16)(const float* x, uint16_t* y, int64_t n);
  /// narrow_bf16 then widen_bf16 in one pass (y may be x): f32 values rounded to bf16's
  /// precision, as a bf16 weight's products take an f32 input.
  void (*round_bf16)(const float* x, float* y, int64_t n);
};

/// Floats of scratch one thread's padded plane takes in RowKernels::dwconv.
inline int64_t dwconv_scratch_floats(int64_t kh, int64_t kw, int64_t s, int64_t oh, int64_t ow) {
  return ((oh - 1) * s + kh) * ((ow - 1) * s + kw + 1);  // + 1: stride 2 splits odd widths in two
}

/// The output rows RowKernels::dwconv_nhwc computes at a time: two for a stride-1 3x3 filter
/// (each input row loaded once for both; 5x5 filters take too many registers for it to pay),
/// else one.
inline int64_t dwconv_nhwc_step(int64_t kh, int64_t kw, int64_t s) { return s == 1 && kh == 3 && kw == 3 ? 2 : 1; }

/// Depthwise filters [C, 1, KH, KW] (`taps` = KH · KW) packed as RowKernels::dwconv_nhwc reads
/// them, [KH, KW, C]: each tap's C weights side by side.
inline void pack_dwconv_nhwc_filters(const float* from, int64_t c, int64_t taps, float* to) {
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t t = 0; t < taps; ++t) to[t * c + ch] = from[ch * taps + t];
}

/// The tallest filter RowKernels::dwconv_nhwc takes.
inline constexpr int64_t kDwconvNhwcMaxRows = 16;

/// Why the depthwise row kernels cannot run a convolution's window (`dilations`, `strides` of
/// `node`): they take undilated ones of stride 1 or 2, the same both ways; nullopt if they can.
inline std::optional<std::string> dwconv_window_declines(const Node& node) {
  for (int64_t d : node.attr_ints("dilations"))
    if (d != 1) return "dilated";
  const std::vector<int64_t> strides = node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != strides[1] || (strides[0] != 1 && strides[0] != 2)) return "strides other than 1 or 2";
  return std::nullopt;
}

/// The tallest filter RowKernels::direct_conv takes, and the most taps (columns × input
/// channels) of a filter row.
inline constexpr int64_t kDirectConvMaxRows = 16, kDirectConvMaxTaps = 64;

/// The output columns [j0, j1) of a depthwise convolution's row whose taps all lie inside an
/// input row of w columns (filter width kw, stride s, left padding pl, ow output columns): the
/// columns dwconv_nhwc computes in blocks, the others being edge columns.
inline std::pair<int64_t, int64_t> dwconv_inside_columns(int64_t w, int64_t kw, int64_t s, int64_t pl, int64_t ow) {
  const int64_t j0 = std::min(ow, (pl + s - 1) / s);  // the first with no tap left of the image
  const int64_t j1 = w - kw + pl >= 0 ? std::max(j0, std::min(ow, (w - kw + pl) / s + 1)) : j0;  // past the last with none right
  return {j0, j1};
}

const RowKernels& row_kernels(Isa isa);

}  // namespace kiln::cpu
