// kiln's lower-precision GEMMs, for `kiln quant` and `--precision` to build on: u8 · s8 → s32
// on AVX512-VNNI (`vpdpbusd`, four byte products per 32-bit lane) with a dequantizing or
// requantizing epilogue, and bf16 · bf16 → f32 on AVX512-BF16 (`vdpbf16ps`, two products per
// lane). Both use the f32 templates' shape: a register tile of MR rows × NR columns of 32-bit
// accumulators, B packed once in panels of NR columns with the K dimension grouped by 4 (u8s8)
// or 2 (bf16) so that one vector load feeds a whole row of the tile, A broadcast one group at a
// time (u8 read from its rows in place, bf16 from its rounded copy); Kc is the whole of K and
// the threads split the panels of B. Where the CPU has AMX, both multiply on AMX tiles from the
// same packed B (lowp_amx.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "formats/ops/epilogue.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/target.h"

namespace kiln::cpu::gemm {

/// The lower-precision element types.
enum class Lowp { u8s8, bf16, f16 };

/// Why this CPU cannot run `kind` ("the CPU lacks avx512-vnni"), or nullopt.
std::optional<std::string> lowp_lacks(const CpuFeatures& cpu, Lowp kind);

/// The register tile of the lower-precision kernels: 8 rows × 48 columns (24 accumulators).
inline constexpr Tile kLowpTile{8, 48};

// ---- u8 · s8 -------------------------------------------------------------------------------

/// Bytes pack_b_s8 writes for a K×N s8 B: ceil(N / NR) panels of ceil(K / 4) groups of NR×4.
int64_t packed_b_s8_bytes(int64_t k, int64_t n);
/// Packs s8 B (K×N, or N×K when `trans`; `ld` between stored rows) for kLowpTile, zero-padded
/// in K and N; `col_sums` (N values) gets Σ_k B[k][n], which the epilogue needs to remove A's
/// zero point.
void pack_b_s8(const int8_t* b, int64_t ld, bool trans, int64_t k, int64_t n, int8_t* out, int32_t* col_sums);
/// pack_b_s8's placement of B's elements (K×N, or N×K when `trans`), for a compiled model to
/// store B packed (QFusedMatMul's weight).
PackedLayout packed_b_s8_layout(int64_t k, int64_t n, bool trans);
/// pack_b_s8's placement of a convolution's weight [N, C, taps] (N output channels, taps =
/// KH·KW) packed as the transpose of its windows' order (K = taps runs of C channels); nullopt
/// where C is not a multiple of 4, so that a group of K steps would span two taps.
std::optional<PackedLayout> packed_b_s8_windows_layout(int64_t n, int64_t c, int64_t taps);
/// The column sums pack_b_s8 gives, from its packed B (a weight a compiled model stored packed).
void packed_b_s8_column_sums(const int8_t* packed, int64_t k, int64_t n, int32_t* col_sums);

/// What becomes of each s32 sum: y = scale[n] · (sum − a_zero · col_sums[n]) + bias[n], then
/// the activation, the residual Z added, the post activation; then, when `out_u8`,
/// q = clamp(round_half_even(y / out_scale) + out_zero, 0, 255) stored as u8; when `out_dq`,
/// that q stored as the f32 (q − out_zero) · out_scale (QuantizeLinear then DequantizeLinear);
/// else y stored as f32.
struct QuantEpilogue {
  const int32_t* col_sums = nullptr;
  int32_t a_zero = 0;
  const float* scale = nullptr;  ///< N values: A's scale × B's scale of the column
  const float* bias = nullptr;   ///< N values, or null
  ActivationSpec act;
  /// The residual, M×N values `ldz` apart: f32 (`z_f32`), or 8-bit (`z_q`: u8, s8 when `z_s8`)
  /// read as z_scale · (q − z_zero); or neither.
  const float* z_f32 = nullptr;
  const void* z_q = nullptr;
  bool z_s8 = false;
  float z_scale = 1;
  int32_t z_zero = 0;
  int64_t ldz = 0;
  ActivationSpec post;
  bool out_u8 = false;
  bool out_dq = false;
  float out_scale = 1;
  int32_t out_zero = 0;

  bool has_z() const { return z_f32 || z_q; }
};

/// The rows of A gemm_u8s8 runs every panel of B over at a time by default (`mc` 0), for K
/// steps, N columns, C's values of `c_bytes` and an L2 of `l2` bytes: whole tiles whose rows
/// of A take at most half of L2 and, with their rows of C, a quarter, but 128 rows or more (a
/// transformer's products stay one block: each panel of B read once). C's rows pass through L2
/// as the tiles write them: on the AMX-less Xeon (2 MiB of L2), 1024x1024x1024 u8s8 → f32 ran
/// at 71-75 % of the `vpdpbusd` peak in blocks of 1,024 rows (A's alone half of L2), 3.26-3.34x
/// kiln's f32 GEMM, and in blocks of 128 at 80-83 %, 3.62-3.68x.
int64_t u8s8_block_rows(int64_t k, int64_t n, int64_t c_bytes, int64_t l2 = CacheSizes::host().l2);

/// Whether gemm_u8s8 should multiply M×K rows on AMX tiles on `cpu`: where it has AMX-INT8,
/// with at least 16 rows (a tile's) and 64 steps of K (one `tdpbusd`'s).
bool u8s8_on_amx(const CpuFeatures& cpu, int64_t m, int64_t k);

/// C[M×N] = epilogue(A[M×K] u8 · B s8), B packed by pack_b_s8, C f32 or u8 (`ldc` elements
/// between rows), on min(threads, pool) threads. A's rows are read in place (`lda` bytes apart),
/// `mc` at a time (a multiple of 8; 0: as many as fill half of L2); no workspace. With `amx`
/// (u8s8_on_amx's answer for the CPU it runs on), the rows down to a multiple of 16 are
/// multiplied on AMX tiles (`tdpbusd`, 16 rows × 16 columns × 64 steps; blocked by the cache
/// sizes, `mc` aside), the rest on VNNI; with `a_padded` too (A's rows readable up to a multiple
/// of 16, any bytes past the m-th) the tiles take all of them, and only C's m rows are written.
void gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda, const int8_t* b_packed,
               const QuantEpilogue& ep, void* c, int64_t ldc, int threads, int64_t mc = 0, bool amx = false, bool a_padded = false);

// ---- bf16 · bf16 -----------------------------------------------------------------------------

/// uint16 elements pack_b_bf16 writes: ceil(N / NR) panels of ceil(K / 2) pairs of NR × 2, or
/// of `steps` / 2 pairs where the panels are laid out for `steps` ≥ K steps (even; zero past K).
int64_t packed_b_bf16_elements(int64_t k, int64_t n, int64_t steps = 0);
/// Packs f32 B (K×N, or N×K when `trans`) as bf16 (round to nearest even) for kLowpTile.
void pack_b_bf16(const float* b, int64_t ld, bool trans, int64_t k, int64_t n, uint16_t* out);
/// The same from a bf16 B (its bits), copied, into panels of `steps` steps (0: K).
void pack_b_bf16(const uint16_t* b, int64_t ld, bool trans, int64_t k, int64_t n, uint16_t* out, int64_t steps = 0);

/// pack_b_bf16's placement of B's elements (K×N, or N×K when `trans`) in panels of `steps`
/// steps (0: K), for a compiled model to store the packed weight.
PackedLayout packed_b_bf16_layout(int64_t k, int64_t n, bool trans, int64_t steps = 0);

/// The steps of K whose panels gemm_bf16_tiles multiplies: K up to a whole 32 (a tile's).
inline int64_t bf16_tile_steps(int64_t k) { return (k + 31) / 32 * 32; }

/// Whether gemm_bf16 should multiply on AMX tiles on `cpu`: where it has AMX-BF16, with at
/// least 32 steps of K (one `tdpbf16ps`'s).
bool bf16_on_amx(const CpuFeatures& cpu, int64_t k);

/// The bytes of a bf16 B a thread's share of a product of 32 rows or fewer on AMX tiles must
/// pass to stream through a panel at a time rather than in groups that fill a quarter of L2,
/// fetched ahead (lowp_amx.cc): four L2s.
int64_t amx_stream_bytes();

/// C[M×N] f32 = A[M×K] f32 (rounded to bf16 as each MR-row panel is packed) · B packed by
/// pack_b_bf16, then bias and the epilogue as in the f32 GEMM. With `amx` (bf16_on_amx's
/// answer for the CPU it runs on), on AMX tiles (`tdpbf16ps`, 16 rows × 16 columns × 32 steps),
/// A rounded to bf16 rows first (`mc` aside, as gemm_u8s8's). With `parts`, C lies in them as in
/// the f32 GEMM (a merged projection's split outputs; no residual Z then), each part beginning
/// at a multiple of 16 columns (one vector of C's row).
void gemm_bf16(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b_packed, const Epilogue& ep,
               float* c, int64_t ldc, int threads, std::byte* workspace, int64_t mc = 0, bool amx = false,
               std::span<const ColumnPart> parts = {});

/// Workspace gemm_bf16 takes for M rows of K (A's copy in bf16), either way.
size_t bf16_workspace_bytes(int64_t m, int64_t k);

/// gemm_bf16 on AMX tiles for a product between bf16 activations (a pointwise convolution in
/// lower_precision's bf16 chains): A's rows bf16 (`a_bf16`) or f32, `lda` elements apart; B
/// packed by pack_b_bf16 over bf16_tile_steps(k) steps, so that the tiles take all of K (where
/// gemm_bf16 leaves K below 32, and the steps past the last whole 32, to `vdpbf16ps`); C's rows
/// bf16 (`c_bf16`: each block's sums finished in f32 with the bias and the epilogue, then
/// rounded to nearest even; the residual f32, ep.z, or bf16, `z16`, rows ep.ldz apart) or f32
/// (ep.z alone), `ldc` elements apart. bf16 rows of a multiple of 32 steps are read where they
/// lie; other rows (and the last ones short of a tile) are copied, rounded if f32, a chunk of
/// rows at a time into each thread's share of the workspace. Only where this process was
/// granted the tile state (CpuFeatures::host().amx).
void gemm_bf16_tiles(int64_t m, int64_t n, int64_t k, const void* a, bool a_bf16, int64_t lda, const uint16_t* b_packed,
                     const Epilogue& ep, void* c, bool c_bf16, int64_t ldc, int threads, std::byte* workspace, const uint16_t* z16 = nullptr);

/// Workspace gemm_bf16_tiles takes for M rows of K on `threads` threads.
size_t bf16_tiles_workspace_bytes(int64_t m, int64_t k, int threads);

// ---- f16 · f16 (AVX512-FP16) -----------------------------------------------------------------

/// The f16 kernel's register tile: 6 rows × 64 columns over pairs of K steps, each row four
/// vectors of 16 columns × 2 steps of f16 sums (added into the tile's f32 sums every
/// kF16Block · kF16Group products, the two steps of each column added at the end).
inline constexpr Tile kF16Tile{6, 64};
/// The products each f16 sum adds in a row (a block of 2·kF16Block steps of K, a lane taking
/// every other one): AVX512-FP16's FMAs round each sum to f16 (11 bits), so a block's error
/// grows with its length. 64 kept BERT-base within 2.6e-3 relative L2 of f32 (32: 2.0e-3) and
/// ResNet-50 within 4.1e-4 (3.9e-4), and ResNet-50 ran 6 % faster than with 32 (half as many
/// widenings of the sum registers).
inline constexpr int64_t kF16Block = 64;
/// Blocks whose f16 sums are added together in f16 (one add a register a block, each rounding
/// once at the group's size) before they are widened and added to the f32 sums (four uops a
/// register). With 4, BERT-base's relative L2 read 2.61e-3 and ResNet-50's 4.22e-4 (2.6e-3 and
/// 4.2e-4 widening every block), and on the AMX Xeon the GEMM bench's f16 rows ran 1.83-1.93x
/// kiln's f32 instead of 1.76-1.85x, the fp16 models in 0.950 (BERT-base) and 0.965 (ResNet-50)
/// of their time at one thread; 8 and 16 measured no faster than 4.
inline constexpr int64_t kF16Group = 4;
/// The most steps of K one pass over B's panels takes (more are split into even chunks of whole
/// blocks, the partial sums kept in C), so that a block of A's rows and a panel over a chunk
/// stay in L2 together (ResNet-50's 3x3 convolutions of 4,608 steps: 1.32 ms unsplit, 0.97 ms
/// in chunks of 1,536; chunks of 256 or 512 were no faster on the GEMM bench's shapes).
inline constexpr int64_t kF16Kc = 1536;
/// The rows of A the f16 GEMM copies and runs every panel over at a time (N columns, chunks of
/// `kc` steps of K, an L2 of `l2` bytes): whole tiles whose f16 copy takes at most half of L2
/// and, with the block's rows of C, at most a quarter, but 128 rows or more (a transformer's
/// product stays one block: each panel of B read once). C's rows pass through L2 as the tiles
/// write them and pushed the copy out while it was half of L2: on the AMX Xeon (2 MiB of L2),
/// one thread, three alternated runs each, ResNet-50's 1x1 products in blocks of 204-516 rows
/// instead of 1,020-4,092 took 0.87-0.89 (56x56, 256 to 64 channels), 0.90-0.96 (256 to 128)
/// and 0.94-1.00 (28x28) of their time, its 14x14 ones in 132-174 rows 0.95-0.99, 1024³
/// 0.89-0.94 (the GEMM bench), the fp16 model 0.97-0.98 at one and two threads; transformers' 197-row
/// products ran alike in one block or two.
int64_t f16_block_rows(int64_t n, int64_t kc, int64_t l2);

/// How gemm_f16 shares a product among its threads: ranges of A's rows (each thread copies its
/// own and runs every panel of B over them), or B's panels (each thread over all of A, which
/// the threads copy first).
enum class F16Split { automatic, rows, panels };

/// gemm_f16's blocking, what `kiln compile --mode max-autotune` searches for it (a compiled
/// model records it): `mc` rows of A copied and run over every panel at a time, K in passes of
/// at most `kc` steps over B's panels, the threads split as `split`. Zero and `automatic` are
/// the defaults, which f16_blocking resolves.
struct F16Blocking {
  int64_t mc = 0;
  int64_t kc = 0;
  F16Split split = F16Split::automatic;
  bool operator==(const F16Blocking&) const = default;
};

/// `asked` resolved for an M×N×K product on `threads` threads and an L2 of `l2` bytes: K split
/// into even chunks of whole blocks (2·kF16Block steps) of at most `asked.kc` steps (0:
/// kF16Kc), `mc` rounded up to whole tiles (0: f16_block_rows's for that chunk), and the
/// threads on B's panels where B is the larger to read twice (N > 2M, a panel for each thread)
/// or A has fewer tiles than threads, else on A's rows (automatic).
F16Blocking f16_blocking(int64_t m, int64_t n, int64_t k, int threads, F16Blocking asked = {}, int64_t l2 = CacheSizes::host().l2);

/// uint16 elements pack_b_f16 writes: ceil(N / 64) panels of ceil(K / 2) pairs of K rows, each
/// 64 columns of two f16 side by side (row 2q, then 2q + 1; zero past K and N).
int64_t packed_b_f16_elements(int64_t k, int64_t n);
/// Packs f16 B (bits; K×N, or N×K when `trans`; `ld` between stored rows) for kF16Tile,
/// zero-padded in N.
void pack_b_f16(const uint16_t* b, int64_t ld, bool trans, int64_t k, int64_t n, uint16_t* out);
/// pack_b_f16's output from B already in f32 panels of kF16Tile.nr columns (pack_b's for that
/// NR: `panels`, packed_b_floats(k, n, kF16Tile.nr) long), each rounded to f16 as half()
/// rounds: a row of pairs written at a time, where pack_b_f16 writes a column of each pair.
/// Needs what the f16 GEMM needs (lowp_lacks(..., Lowp::f16)).
void pack_b_f16_from_panels(const float* panels, int64_t k, int64_t n, uint16_t* out);
/// pack_b_f16's placement of B's elements (K×N, or N×K when `trans`), for a compiled model to
/// store the packed weight.
PackedLayout packed_b_f16_layout(int64_t k, int64_t n, bool trans);
/// pack_b_f16's placement of a convolution's weight [N, C, taps] (N output channels, taps =
/// KH·KW) packed as the transpose of its windows' order (K = taps runs of C channels); nullopt
/// for an odd C, where a pair of K steps spans two taps and no layout describes it.
std::optional<PackedLayout> packed_b_f16_windows_layout(int64_t n, int64_t c, int64_t taps);

/// C[M×N] f32 = A[M×K] f32 (rounded to f16 as it is copied to the workspace) · B packed by
/// pack_b_f16, the products summed in f16 over blocks of kF16Block and the blocks in f32, then
/// bias and the epilogue as in the f32 GEMM, blocked as `blocking` asks (f16_blocking fills in
/// what it leaves to the defaults). With `parts`, C lies in them as in the f32 GEMM
/// (GemmProblem::parts; every part begins at a multiple of 64 columns, kF16Tile's width).
void gemm_f16(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b_packed, const Epilogue& ep, float* c,
              int64_t ldc, int threads, std::byte* workspace, const F16Blocking& blocking = {}, std::span<const ColumnPart> parts = {});

/// A channels-last 2-D convolution's input as the rows of a product (an implicit im2col): row
/// (n, y, x) of A is output pixel (y, x)'s window of image n, KH · KW taps of C channels in that
/// order (K = KH · KW · C), zeros where the window leaves the image.
struct ImageWindows {
  int64_t h = 0, w = 0, c = 0;  ///< each image is [H, W, C]
  int64_t oh = 0, ow = 0;       ///< output rows and columns per image
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0;  ///< padding above and to the left
  int64_t k() const { return kh * kw * c; }
};

/// gemm_f16 over the windows of `x` (`m` rows: images × OH × OW; B K×N with K = g.k() in the
/// windows' order): a convolution, its windows gathered and rounded to f16 as A is copied.
void gemm_f16_windows(int64_t m, int64_t n, const ImageWindows& g, const float* x, const uint16_t* b_packed, const Epilogue& ep,
                      float* c, int64_t ldc, int threads, std::byte* workspace, const F16Blocking& blocking = {});

/// Why kiln's default rule leaves a convolution by an f16 weight, over `pixels` input pixels
/// (more than one) of `in` channels into `out` channels, to f32 kernels (the weight widened)
/// rather than gemm_f16: fewer than 16 input channels, 32 or fewer output channels, or for a
/// 1x1 one (`pointwise`) 32 or fewer input channels over 784 pixels or more (28x28); nullopt
/// where gemm_f16 takes it. matmul.cc's f16_defers (the measurements) asks it.
std::optional<std::string> f16_conv_stays_f32(int64_t in, int64_t out, int64_t pixels, bool pointwise);

/// Whether compile's fusion passes (fuse_pointwise_depthwise, fuse_concat) take a 1x1
/// convolution by an f16 weight of `in` channels into `out` over `pixels` input pixels into a
/// fused f32 kernel, which gemm_f16 then does not run: where f16_conv_stays_f32 leaves it to
/// f32 anyway, and where it has 64 or fewer input channels over 784 pixels or more (28x28),
/// whose few multiplies per output gain least from f16: with those stages apart on gemm_f16,
/// the fp16 MobileNetV2 took 1.125x and EfficientNet-B0 1.066x the time of their fused blocks
/// at one thread (6 alternated profiles each).
bool f16_pointwise_fuses(int64_t in, int64_t out, int64_t pixels);

/// Workspace gemm_f16 and gemm_f16_windows take for M rows of K (A's copy in f16, K rounded
/// up to pairs).
size_t f16_workspace_bytes(int64_t m, int64_t k);

/// A bf16 or f16 weight (`kiln compile --precision`) as plain f32 (exact; a packed one
/// unpacked first), f16 by vcvtph2ps where the CPU has it (nn::widen_f16; BERT-base's f16
/// session: 0.45 s, against 0.7 s converting one value at a time; packing the f32 copies takes
/// most of the rest).
Tensor widened_to_f32(const Tensor& w);

/// f32 to bf16, rounding to nearest even (NaN stays NaN), and back: what the kernels compute
/// with, for tests and references.
uint16_t to_bf16(float x);
float from_bf16(uint16_t x);

}  // namespace kiln::cpu::gemm
