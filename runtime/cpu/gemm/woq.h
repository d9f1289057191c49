// kiln's weight-only-quantized GEMM, for `kiln quant --weight-only int8|int4`: C f32 = A f32 ·
// B, where B is a constant weight stored as 8- or 4-bit codes with a scale (and a zero point)
// per column, or per group of K values and column, and is dequantized inside the kernel. B is
// packed once (pack_b_woq) into panels of NR = 64 columns, its codes kept at their width and the
// scales and zero points turned into one scale and one offset per group and column, so that
// b = code · scale + offset is one FMA on the widened code.
//
// Two paths, chosen by the rows a thread has:
//  - up to 12 (LLM decode): the micro-kernel dequantizes B as it loads it, step by step along K,
//    into a 12×32 tile of f32 sums (half a panel); reading 1 or ½ byte of B per element instead
//    of 4 is the speed-up where the product is memory-bound. Up to 4 rows it sums a·code
//    within each group and applies the group's scale and offset to the sums at its end
//    (s·Σ a·code + o·Σ a), one FMA per code fewer;
//  - more: each panel is dequantized a Kc×64 slice at a time into the thread's workspace
//    (Inductor's "small dequant buffer", in L2), and kiln's f32 GEMM micro-kernel runs all the
//    thread's rows against it, so a code is dequantized once, not once per row tile.
// On CPUs with AVX512-VNNI, up to kWoqSplitRows rows take a third path: each
// value of A becomes two 16-bit integers, s·(q + rest·2^-15), with a scale s per block of up to
// kWoqABlock values of K (the block's largest |a| / 32767), so that A is kept to within
// 2^-31 of the block's largest value, as good as f32 for the sums; `vpdpwssd` multiplies both
// by the codes, 32 multiply-adds an instruction with no conversion, and the sums take the
// block's and the group's scales at the block's end (woq_vnni.cc). That halves a decode step's
// time, where the f32 path was bound by converting the codes, not by memory. (OpenVINO rounds
// A to 8 bits there instead, and its outputs move by ~3 %.)
// Threads split B's panels, and M too when there are fewer panels than threads. The epilogue is
// the f32 GEMM's (gemm.h), applied to each tile while it is hot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/cpu/gemm/gemm.h"
#include "runtime/target.h"

namespace kiln::cpu::gemm {

/// How B's codes are stored.
enum class WoqCodes { s8, u8, s4, u4 };

/// A quantized weight as a model stores it: codes of the stored shape K×N (or N×K when
/// `trans`), row-major; s4/u4 packed two per byte, element 2i in the low nibble of byte i and
/// 2i+1 in the high nibble (ONNX's int4 order, over the flat row-major index of the stored
/// shape; s4 nibbles are two's complement −8..7). Real value = (code − zero) · scale.
struct WoqWeight {
  WoqCodes codes = WoqCodes::s8;
  const void* data = nullptr;
  bool trans = false;
  int64_t k = 0, n = 0;
  /// 0: one scale per column over all of K; else `group` consecutive K values share one (the
  /// last group may be shorter).
  int64_t group = 0;
  /// Per column: N values; grouped: the stored shape with K replaced by ceil(K / group), i.e.
  /// [ceil(K / group), N], or [N, ceil(K / group)] when `trans`.
  const float* scale = nullptr;
  const int32_t* zero = nullptr;  ///< the shape of `scale`, or null for zero points of 0
};

/// The rows up to which, and the K values per scale with which, the 16-bit path splits A.
inline constexpr int64_t kWoqSplitRows = 4, kWoqABlock = 128;

/// Whether gemm_woq can take the 16-bit path for M rows on `cpu`: M up to kWoqSplitRows, one
/// group (a scale per column) or groups of an even length (so that no pair of K values
/// straddles two), and AVX512-VNNI. Decided once, at plan time, and passed to
/// woq_workspace_bytes and gemm_woq as `split_a`.
bool woq_splits_a(const CpuFeatures& cpu, int64_t m, int64_t group);

/// Why this CPU cannot run the weight-only GEMM ("the CPU lacks avx512"), or nullopt.
std::optional<std::string> woq_lacks(const CpuFeatures& cpu);

/// Bytes pack_b_woq writes: ceil(N / 64) panels, each K rows of codes (64 bytes a row for 8-bit
/// codes, 32 for 4-bit) rounded up to 64 bytes, then per group 64 scales and 64 offsets (f32).
int64_t packed_b_woq_bytes(const WoqWeight& w);

/// Packs the weight once (plan time) into `out` (packed_b_woq_bytes long, 64-byte aligned).
/// Padding columns get zero codes, scales and offsets.
void pack_b_woq(const WoqWeight& w, std::byte* out);

/// Workspace gemm_woq needs for M rows on `threads` threads: A split into 16-bit integers with
/// `split_a`, else a Kc×64 f32 slice of B per thread when M is more than 12 rows, else 0.
size_t woq_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t group, int threads, bool split_a);

/// C[M×N] = epilogue(A[M×K] f32 (`lda` floats between rows) · dequantized B), B packed by
/// pack_b_woq for this (k, n, group, codes), on min(threads, pool) threads; `ldc` floats between
/// C's rows. The epilogue is the f32 GEMM's: post(act(c + bias[n]) + z[m, n]). `split_a`: the
/// 16-bit path, only where woq_splits_a says so for the CPU that runs it. `workspace` is
/// woq_workspace_bytes(m, n, k, group, threads, split_a) long and 64-byte aligned (may be null
/// when that is 0).
void gemm_woq(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const std::byte* b_packed, WoqCodes codes,
              int64_t group, bool split_a, const Epilogue& ep, float* c, int64_t ldc, int threads, std::byte* workspace);

}  // namespace kiln::cpu::gemm
