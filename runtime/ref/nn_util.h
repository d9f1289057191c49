// Helpers shared by the nn family's reference kernels (runtime/ref/nn*.cc): the one GEMM loop
// nest that MatMul, Gemm, Conv and ConvTranspose all use, and the dtype plumbing that lets a
// kernel be written once for float and double while f16 / bf16 compute through float.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/kernel.h"

namespace kiln::nn {

/// C[M, N] += A[M, K] @ B[K, N], all row-major with leading dims lda, ldb, ldc.
///
/// The loop order is i-k-j so the innermost loop runs contiguously over a row of B and a row
/// of C (the compiler vectorises it); N and K are blocked so the block of B being reused by
/// every row of A stays in L2, and four k steps are fused so each C element is loaded and
/// stored once per four multiply-adds. Integer types wrap (computed as unsigned).
/// The type GEMM arithmetic runs in: T for floats, the unsigned twin for integers (so
/// overflow wraps instead of being undefined).
template <class T, bool = std::is_integral_v<T>>
struct gemm_arith { using type = T; };
template <class T>
struct gemm_arith<T, true> { using type = std::make_unsigned_t<T>; };

template <class T>
void gemm_acc(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  using U = typename gemm_arith<T>::type;
  const U* a_ = reinterpret_cast<const U*>(A);
  const U* b_ = reinterpret_cast<const U*>(B);
  U* c_ = reinterpret_cast<U*>(C);
  constexpr int64_t kBlockN = 512, kBlockK = 128;
  for (int64_t j0 = 0; j0 < N; j0 += kBlockN) {
    const int64_t jn = std::min(kBlockN, N - j0);
    for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
      const int64_t kn = std::min(kBlockK, K - k0);
      for (int64_t i = 0; i < M; ++i) {
        U* __restrict c = c_ + i * ldc + j0;
        const U* a = a_ + i * lda + k0;
        const U* b = b_ + k0 * ldb + j0;
        int64_t k = 0;
        for (; k + 4 <= kn; k += 4) {
          const U a0 = a[k], a1 = a[k + 1], a2 = a[k + 2], a3 = a[k + 3];
          const U* __restrict b0 = b + k * ldb;
          const U* __restrict b1 = b0 + ldb;
          const U* __restrict b2 = b1 + ldb;
          const U* __restrict b3 = b2 + ldb;
          for (int64_t j = 0; j < jn; ++j) c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
        }
        for (; k < kn; ++k) {
          const U a0 = a[k];
          const U* __restrict b0 = b + k * ldb;
          for (int64_t j = 0; j < jn; ++j) c[j] += a0 * b0[j];
        }
      }
    }
  }
}

/// Copies a [rows, cols] matrix with leading dim ld into `out` transposed ([cols, rows]).
template <class T>
void transpose_into(const T* src, int64_t rows, int64_t cols, int64_t ld, std::vector<T>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = src[r * ld + c];
}

/// A tensor's elements converted to f32 (for f16 / bf16 inputs).
Tensor to_f32(const Tensor& t);
/// `n` f16 values (bits) as f32, exactly as half's conversion: 8 at a time by F16C's vcvtph2ps
/// where the CPU has it.
void widen_f16(const uint16_t* in, int64_t n, float* out);
/// Writes f32 `src` into `dst` (f16 / bf16) element by element.
void store_from_f32(const Tensor& src, Tensor& dst);

/// Runs `fn(T{}, inputs, outputs)` with T = float or double. Inputs and outputs of the first
/// input's dtype that is f16 / bf16 are converted to and from f32 around the call; other
/// tensors (indices, shapes) pass through. Omitted inputs / outputs are nullptr.
template <class Fn>
Status run_float(KernelContext& ctx, Fn&& fn) {
  const DType t = ctx.input(0).dtype();
  std::vector<const Tensor*> in(ctx.num_inputs(), nullptr);
  std::vector<Tensor*> out(ctx.num_outputs(), nullptr);
  for (size_t i = 0; i < in.size(); ++i)
    if (ctx.has_input(i)) in[i] = &ctx.input(i);
  for (size_t i = 0; i < out.size(); ++i)
    if (ctx.output(i).defined()) out[i] = &ctx.output(i);
  if (t == DType::f32) return fn(float{}, in, out);
  if (t == DType::f64) return fn(double{}, in, out);
  if (t != DType::f16 && t != DType::bf16)
    return ctx.error(std::string(ctx.node().op) + " does not support " + std::string(dtype_name(t)));
  std::vector<Tensor> in32(in.size()), out32(out.size());
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] && in[i]->dtype() == t) in[i] = &(in32[i] = to_f32(*in[i]));
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i] && out[i]->dtype() == t) out[i] = &(out32[i] = Tensor(DType::f32, out[i]->shape()));
  KILN_RETURN_IF_ERROR(fn(float{}, in, out));
  for (size_t i = 0; i < out.size(); ++i)
    if (out32[i].defined()) store_from_f32(out32[i], ctx.output(i));
  return {};
}

/// Spatial sizes padded on the left with 1s to three dims (D, H, W), so the conv and pool
/// loops are written once for 1-D, 2-D and 3-D.
inline std::vector<int64_t> to3(const std::vector<int64_t>& v, int64_t fill) {
  std::vector<int64_t> r(3 - std::min<size_t>(3, v.size()), fill);
  r.insert(r.end(), v.begin(), v.end());
  return r;
}

// Registration of the nn family's kernel groups (one per file).
/// The epilogue of FusedConv / FusedMatMul after the bias: activation, + Z (input 3), post-activation.
Status fused_epilogue(KernelContext& ctx, Tensor& y);

void register_ref_nn_conv(KernelRegistry& r);
void register_ref_nn_pool(KernelRegistry& r);
void register_ref_nn_sample(KernelRegistry& r);
void register_ref_nn_einsum(KernelRegistry& r);
void register_ref_nn_quant(KernelRegistry& r);

/// The fused ops' reference kernels, which the quantized ones run on dequantized operands.
Status ref_fused_conv_any(KernelContext& ctx);  ///< FusedConv, either layout
Status ref_fused_matmul(KernelContext& ctx);

}  // namespace kiln::nn

namespace kiln::ref {
/// LayerNormalization's reference kernel (reduce_norm.cc), which QLayerNormalization's runs.
Status layer_normalization(KernelContext& ctx);
/// Attention's reference kernel (attention.cc), which QAttention's runs.
Status attention(KernelContext& ctx);
/// GlobalAveragePool's reference kernel, either layout (nn_pool.cc), which QGlobalAveragePool's runs.
Status global_average_pool(KernelContext& ctx);
}  // namespace kiln::ref
