// The weight-only-quantized GEMM's packing, its two paths and its threads (woq.h); the
// dequantizing kernels are in woq_avx512.cc, and the f32 micro-kernel the dequantized slices
// feed is the f32 GEMM's (gemm.inc).
#include "runtime/cpu/gemm/woq.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/cpu/gemm/gemm_isa.h"
#include "runtime/cpu/gemm/woq_isa.h"
#include "runtime/threads.h"

namespace kiln::cpu::gemm {

namespace {

using woq_avx512::kSliceTile;
using woq_avx512::MR;
using woq_avx512::NR;

int64_t panels(int64_t n) { return (n + NR - 1) / NR; }
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Kc of the dequantized slices: as the f32 GEMM takes it, B's Kc×NR slice and a tile's rows of A
// over it in three quarters of L2, so each row tile reads the slice from L2; K is cut into
// equal slices of a multiple of 16 rather than full ones and a short rest.
int64_t slice_rows(int64_t k) {
  const int64_t most = std::max<int64_t>(16, CacheSizes::host().l2 * 3 / 4 / (4 * (kSliceTile.mr + NR)) / 16 * 16);
  const int64_t slices = (std::max<int64_t>(k, 1) + most - 1) / most;
  return std::min(round_up((std::max<int64_t>(k, 1) + slices - 1) / slices, 16), most);
}

// Whether `rows` rows take the dequantizing micro-kernel: a single row tile dequantizes each
// code once anyway; with more, the codes would be dequantized again for every tile. (Measured
// on a 4096×4096 and a 768×3072 weight, int8 and int4, one thread, AMD Zen 4: the micro-kernel
// was faster up to 12 rows, even with the slices at 16, and slower from 24 on, by 10-20 % at
// 64-128.)
bool dequantizing(int64_t rows, int64_t k) { return rows <= MR || k == 0; }

size_t slice_bytes(int64_t k) { return static_cast<size_t>(round_up(slice_rows(k) * NR * 4, 64)); }

// C's rows [0, m) and panels [p0, p1) through dequantized Kc×NR slices of B in `slice`, each
// run against all the rows by the f32 GEMM's blocking and 6×64 micro-kernel (A in place, the
// slice as its packed B): bias on the first slice, the rest of the epilogue after the last.
void slice_panels(int64_t m, int64_t p0, int64_t p1, int64_t n, int64_t k, int64_t group, const float* a, int64_t lda,
                  const std::byte* b, WoqCodes codes, const Epilogue& ep, float* c, int64_t ldc, float* slice) {
  const int64_t kc = slice_rows(k), stride = woq_avx512::panel_bytes(k, group, codes);
  const GemmParams p{.isa = Isa::avx512, .tile = kSliceTile, .mc = round_up(m, kSliceTile.mr), .nc = NR, .kc = kc,
                     .pack_a = false};
  for (int64_t panel = p0; panel < p1; ++panel) {
    const int64_t n0 = panel * NR;
    for (int64_t k0 = 0; k0 < k; k0 += kc) {
      const int64_t rows = std::min(kc, k - k0);
      woq_avx512::dequantize(b + panel * stride, codes, k, group, k0, rows, slice);
      GemmProblem g{.m = m, .n = std::min(NR, n - n0), .k = rows, .a = a + k0, .lda = lda, .b = slice, .b_packed = true,
                    .c = c + n0, .ldc = ldc, .accumulate = k0 > 0};
      if (k0 == 0 && ep.bias) g.epilogue.bias = ep.bias + n0;
      if (k0 + rows == k) {
        g.epilogue.z = ep.z ? ep.z + n0 : nullptr;
        g.epilogue.ldz = ep.ldz;
        g.epilogue.act = ep.act;
        g.epilogue.post = ep.post;
      }
      avx512::kBlock(p, g, 0, m, 0, g.n, nullptr, nullptr);
    }
  }
}

}  // namespace

bool woq_splits_a(const CpuFeatures& cpu, int64_t m, int64_t group) {
  return cpu.avx512_vnni && m <= kWoqSplitRows && group % 2 == 0;
}

std::optional<std::string> woq_lacks(const CpuFeatures& cpu) {
  if (!cpu.avx512f || !cpu.avx512bw || !cpu.avx512vl) return "the CPU lacks avx512";
  return std::nullopt;
}

int64_t packed_b_woq_bytes(const WoqWeight& w) { return panels(w.n) * woq_avx512::panel_bytes(w.k, w.group, w.codes); }

void pack_b_woq(const WoqWeight& w, std::byte* out) {
  const bool nibbles = w.codes == WoqCodes::s4 || w.codes == WoqCodes::u4;
  const int64_t stride = woq_avx512::panel_bytes(w.k, w.group, w.codes), params_at = woq_avx512::codes_bytes(w.k, w.codes);
  const int64_t rb = woq_avx512::row_bytes(w.codes), groups = woq_avx512::groups(w.k, w.group);
  // s4 is stored as code + 8 (0..15, so the kernel widens every nibble alike) and the 8 goes
  // into the offset with the zero point: (code − zero) · scale = (code + 8) · scale − (zero + 8) · scale.
  const int shift = w.codes == WoqCodes::s4 ? 8 : 0;
  const auto* data = static_cast<const uint8_t*>(w.data);
  std::memset(out, 0, static_cast<size_t>(packed_b_woq_bytes(w)));
  for (int64_t j = 0; j < w.n; ++j) {
    auto* panel = reinterpret_cast<uint8_t*>(out + (j / NR) * stride);
    const int64_t col = j % NR;
    for (int64_t p = 0; p < w.k; ++p) {
      const int64_t at = w.trans ? j * w.k + p : p * w.n + j;  // in the stored shape
      if (!nibbles) {
        panel[p * rb + col] = data[at];
        continue;
      }
      const int code = ((data[at / 2] >> (at % 2 * 4)) & 15) ^ shift;  // s4: two's complement + 8
      panel[p * rb + col / 32 * 16 + col % 16] |= static_cast<uint8_t>(code << (col % 32 / 16 * 4));
    }
    auto* params = reinterpret_cast<float*>(out + (j / NR) * stride + params_at);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = w.group == 0 ? j : w.trans ? j * groups + g : g * w.n + j;
      const double scale = w.scale[at], zero = w.zero ? w.zero[at] : 0;
      params[g * 2 * NR + col] = static_cast<float>(scale);
      params[g * 2 * NR + NR + col] = static_cast<float>(-(zero + shift) * scale);
    }
  }
}

size_t woq_workspace_bytes(int64_t m, int64_t /*n*/, int64_t k, int64_t group, int threads, bool split_a) {
  if (split_a) return static_cast<size_t>(woq_vnni::SplitA(m, k, group).bytes());
  return dequantizing(m, k) ? 0 : slice_bytes(k) * static_cast<size_t>(std::max(threads, 1));
}

void gemm_woq(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const std::byte* b_packed, WoqCodes codes,
              int64_t group, bool split_a, const Epilogue& ep, float* c, int64_t ldc, int threads, std::byte* workspace) {
  if (m <= 0 || n <= 0) return;
  // Threads over B's panels; where there are fewer panels than threads, over M too, in whole
  // micro-kernel tiles (each thread then dequantizes its own copy of the slices it needs).
  const int64_t count = panels(n), tiles = (m + MR - 1) / MR;
  const int t = std::max(1, std::min(threads, pool_threads()));
  const int tn = static_cast<int>(std::min<int64_t>(t, count));
  const int tm = static_cast<int>(std::min<int64_t>(t / tn, tiles));
  // A split into 16-bit integers once, for every thread (m is at most kWoqSplitRows: one row
  // tile).
  if (split_a) woq_vnni::split_rows(m, k, group, a, lda, workspace);
  auto part = [&](int i) {
    const auto [p0, p1] = even_share(count, tn, i % tn);
    const auto [r0, r1] = even_share(tiles, tm, i / tn);
    const int64_t m0 = r0 * MR, rows = std::min(m, r1 * MR) - m0;
    if (p0 >= p1 || rows <= 0) return;
    Epilogue e = ep;
    if (e.z) e.z += m0 * e.ldz;
    if (split_a) {
      woq_vnni::split_panels(rows, p0, p1, n, k, group, workspace, b_packed, codes, e, c + m0 * ldc, ldc);
    } else if (dequantizing(rows, k)) {
      woq_avx512::dequantizing_panels(rows, p0, p1, n, k, group, a + m0 * lda, lda, b_packed, codes, e, c + m0 * ldc, ldc);
    } else {
      auto* slice = reinterpret_cast<float*>(workspace + slice_bytes(k) * static_cast<size_t>(i));
      slice_panels(rows, p0, p1, n, k, group, a + m0 * lda, lda, b_packed, codes, e, c + m0 * ldc, ldc, slice);
    }
  };
  if (tn * tm <= 1) {
    part(0);
    return;
  }
#pragma omp parallel num_threads(tn * tm)
  {
    WorkerSpan span;
    part(omp_get_thread_num());
  }
}

}  // namespace kiln::cpu::gemm
