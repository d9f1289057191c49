// Reference kernels of the nn family: MatMul and Gemm here, and the registration of the rest
// (nn_conv.cc, nn_pool.cc, nn_sample.cc, nn_einsum.cc).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "formats/ops/epilogue.h"
#include "runtime/ref/layout.h"
#include "runtime/ref/nn_util.h"

namespace kiln {

namespace nn {

namespace {

// Conversions 8 values at a time where the CPU can (f16 by F16C's instructions, bf16's rounding
// in AVX2's integer lanes): the same bits as half's and bfloat16's one at a time (rounded to
// nearest even; NaNs quieted, their payload's top bits kept). BERT-base's f32 weights to f16
// (`kiln compile --precision fp16`) took 530 ms one at a time.
bool has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return CpuFeatures::host().avx2 && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx >> 29 & 1);
  }();
  return has;
}

__attribute__((target("avx2,f16c"))) int64_t widen_f16c(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}

__attribute__((target("avx2,f16c"))) int64_t narrow_f16_f16c(const float* in, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}

// bfloat16(float) on 8 lanes: x + 0x7fff + (bit 16 of x), its top half; a NaN's top half with
// the quiet bit set.
__attribute__((target("avx2"))) int64_t narrow_bf16_avx2(const float* in, int64_t n, uint16_t* out) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), infinity = _mm256_set1_epi32(0x7f800000);
  const __m256i half_ulp = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), top = _mm256_srli_epi32(x, 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, magnitude), infinity);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(half_ulp, _mm256_and_si256(top, one))), 16);
    const __m256i bits = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet), nan);
    // Each 128-bit half packed to 16 bits (values under 2^16: packus keeps them), its 4 in the low 64 bits.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0b1000);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  return i;
}

}  // namespace

void widen_f16(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = has_f16c() ? widen_f16c(in, n, out) : 0; i < n; ++i) out[i] = static_cast<float>(std::bit_cast<half>(in[i]));
}

Tensor to_f32(const Tensor& t) {
  Tensor r(DType::f32, t.shape());
  float* d = r.data<float>();
  if (t.dtype() == DType::f16) {
    widen_f16(static_cast<const uint16_t*>(t.raw()), t.numel(), d);
  } else if (t.dtype() == DType::bf16) {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = t.data<bfloat16>()[i];
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(t.as_double(i));
  }
  return r;
}

void store_from_f32(const Tensor& src, Tensor& dst) {
  const float* s = src.data<float>();
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::f16) {
    const int64_t done = has_f16c() ? narrow_f16_f16c(s, n, static_cast<uint16_t*>(dst.raw())) : 0;
    for (int64_t i = done; i < n; ++i) dst.data<half>()[i] = half(s[i]);
  } else if (dst.dtype() == DType::bf16) {
    const int64_t done = CpuFeatures::host().avx2 ? narrow_bf16_avx2(s, n, static_cast<uint16_t*>(dst.raw())) : 0;
    for (int64_t i = done; i < n; ++i) dst.data<bfloat16>()[i] = bfloat16(s[i]);
  }
}

namespace {

// numpy matmul: 1-D operands are promoted ([K] -> [1, K] on the left, [K, 1] on the right) and
// the batch dims broadcast; broadcast operands are read in place through zero strides.
template <class T>
Status matmul_impl(KernelContext& ctx, const Tensor& a, const Tensor& b, Tensor& y) {
  std::vector<int64_t> as = a.shape(), bs = b.shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  if (bs[bs.size() - 2] != K) return ctx.error("inner dims " + std::to_string(K) + " and " + std::to_string(bs[bs.size() - 2]) + " differ");
  const size_t nb = std::max(as.size(), bs.size()) - 2;
  std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  ab.insert(ab.begin(), nb - ab.size(), 1);
  bb.insert(bb.begin(), nb - bb.size(), 1);
  std::vector<int64_t> batch(nb), sa(nb, 0), sb(nb, 0);
  int64_t stride_a = M * K, stride_b = K * N;
  for (size_t i = nb; i-- > 0;) {
    if (ab[i] != bb[i] && ab[i] != 1 && bb[i] != 1)
      return ctx.error("cannot broadcast batch dims " + std::to_string(ab[i]) + " and " + std::to_string(bb[i]));
    batch[i] = ab[i] == 1 ? bb[i] : ab[i];
    if (ab[i] != 1) sa[i] = stride_a;
    if (bb[i] != 1) sb[i] = stride_b;
    stride_a *= ab[i];
    stride_b *= bb[i];
  }
  int64_t batches = 1;
  for (int64_t d : batch) batches *= d;
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* py = y.data<T>();
  std::fill(py, py + y.numel(), T{});
  if (batches == 0 || M == 0 || N == 0) return {};
  // When B is shared by every batch and A's batches are contiguous, one tall GEMM does it all.
  bool b_shared = std::all_of(sb.begin(), sb.end(), [](int64_t s) { return s == 0; });
  bool a_full = true;
  for (size_t i = 0; i < nb; ++i) a_full = a_full && (sa[i] != 0 || batch[i] == 1);
  if (b_shared && a_full) {
    gemm_acc<T>(batches * M, N, K, pa, K, pb, N, py, N);
    return {};
  }
  std::vector<int64_t> idx(nb, 0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t oa = 0, ob = 0;
    for (size_t i = 0; i < nb; ++i) {
      oa += idx[i] * sa[i];
      ob += idx[i] * sb[i];
    }
    gemm_acc<T>(M, N, K, pa + oa, K, pb + ob, N, py + bi * M * N, N);
    for (size_t i = nb; i-- > 0;) {
      if (++idx[i] < batch[i]) break;
      idx[i] = 0;
    }
  }
  return {};
}

Status ref_matmul(KernelContext& ctx) {
  const DType t = ctx.input(0).dtype();
  switch (t) {
    case DType::i32: return matmul_impl<int32_t>(ctx, ctx.input(0), ctx.input(1), ctx.output(0));
    case DType::i64: return matmul_impl<int64_t>(ctx, ctx.input(0), ctx.input(1), ctx.output(0));
    case DType::u32: return matmul_impl<uint32_t>(ctx, ctx.input(0), ctx.input(1), ctx.output(0));
    case DType::u64: return matmul_impl<uint64_t>(ctx, ctx.input(0), ctx.input(1), ctx.output(0));
    default: break;
  }
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return matmul_impl<T>(ctx, *in[0], *in[1], *out[0]);
  });
}

Status fused_matmul(KernelContext& ctx) {
  if (ctx.input(0).dtype() != DType::f32) return ctx.error("FusedMatMul is f32 only");
  KILN_RETURN_IF_ERROR(ref_matmul(ctx));
  Tensor& y = ctx.output(0);
  if (ctx.has_input(2)) {
    const Tensor& b = ctx.input(2);
    const int64_t n = y.rank() ? y.shape().back() : 1;
    if (b.rank() != 1 || b.numel() != n)
      return ctx.error("bias " + shape_str(b.shape()) + " does not have one value per output column (" + std::to_string(n) + ")");
    float* py = y.data<float>();
    const float* pb = b.data<float>();
    for (int64_t i = 0, rows = n ? y.numel() / n : 0; i < rows; ++i)
      for (int64_t j = 0; j < n; ++j) py[i * n + j] += pb[j];
  }
  return fused_epilogue(ctx, y);
}

// Y = alpha * op(A) @ op(B) + beta * C. op() transposes are copied once so the GEMM loop always
// reads contiguous rows; alpha is folded into the copy of A.
template <class T>
Status gemm_impl(KernelContext& ctx, const Tensor& a, const Tensor* c, const Tensor& b, Tensor& y) {
  const Node& node = ctx.node();
  const bool ta = node.attr_int("transA", 0) != 0, tb = node.attr_int("transB", 0) != 0;
  const T alpha = static_cast<T>(node.attr_float("alpha", 1.0)), beta = static_cast<T>(node.attr_float("beta", 1.0));
  const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  const int64_t N = tb ? b.dim(0) : b.dim(1);
  if ((tb ? b.dim(1) : b.dim(0)) != K) return ctx.error("inner dims of A and B differ");
  T* py = y.data<T>();
  if (c && beta != T{}) {
    // C broadcasts one way onto [M, N].
    const std::vector<int64_t>& cs = c->shape();
    const int64_t cm = cs.size() == 2 ? cs[0] : 1, cn = cs.empty() ? 1 : cs.back();
    if ((cm != 1 && cm != M) || (cn != 1 && cn != N)) return ctx.error("C " + shape_str(cs) + " cannot broadcast to [" + std::to_string(M) + ", " + std::to_string(N) + "]");
    const T* pc = c->data<T>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) py[i * N + j] = beta * pc[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
  } else {
    std::fill(py, py + M * N, T{});
  }
  std::vector<T> at, bt;
  const T* pa = a.data<T>();
  if (ta || alpha != T{1}) {
    if (ta) transpose_into(pa, K, M, M, at);
    else at.assign(pa, pa + M * K);
    for (T& v : at) v = static_cast<T>(alpha * v);
    pa = at.data();
  }
  const T* pb = b.data<T>();
  if (tb) {
    transpose_into(pb, N, K, K, bt);
    pb = bt.data();
  }
  gemm_acc<T>(M, N, K, pa, K, pb, N, py, N);
  return {};
}

Status ref_gemm(KernelContext& ctx) {
  const Tensor* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  switch (ctx.input(0).dtype()) {
    case DType::i32: return gemm_impl<int32_t>(ctx, ctx.input(0), c, ctx.input(1), ctx.output(0));
    case DType::i64: return gemm_impl<int64_t>(ctx, ctx.input(0), c, ctx.input(1), ctx.output(0));
    case DType::u32: return gemm_impl<uint32_t>(ctx, ctx.input(0), c, ctx.input(1), ctx.output(0));
    case DType::u64: return gemm_impl<uint64_t>(ctx, ctx.input(0), c, ctx.input(1), ctx.output(0));
    default: break;
  }
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return gemm_impl<T>(ctx, *in[0], in.size() > 2 ? in[2] : nullptr, *in[1], *out[0]);
  });
}

}  // namespace

// The node's whole product and bias as one [.., n] tensor of Y's shape but for the last dim,
// without the activations when `bare`: what split outputs and gated products are cut from.
Result<Tensor> whole_product(KernelContext& ctx, std::vector<int64_t> shape, int64_t n, bool bare) {
  shape.back() = n;
  std::vector<Tensor> in(ctx.num_inputs());
  for (size_t i = 0; i < in.size(); ++i)
    if (ctx.has_input(i)) in[i] = ctx.input(i);
  Node node = ctx.node();
  if (bare)
    for (const char* a : kActivationAttrs) node.erase_attr(a);
  ref::ViewContext whole(ctx, node, std::move(in), Tensor(DType::f32, shape));
  KILN_RETURN_IF_ERROR(ref::run_widened(whole, fused_matmul));
  return whole.y();
}

// A gated product: the whole product and bias without the activation, then Y's column
// b·G + j = value · activation(gate) from its block of G values and G gates.
Status ref_gated_matmul(KernelContext& ctx) {
  const int64_t g = ctx.node().attr_int("gate_block", 0);
  const int64_t half = ctx.output(0).shape().back(), n = 2 * half;
  KILN_ASSIGN_OR_RETURN(const Tensor whole, whole_product(ctx, ctx.output(0).shape(), n, true));
  const float* v = whole.data<float>();
  const int64_t rows = half ? whole.numel() / n : 0;
  Tensor gates(DType::f32, {rows, half});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < half; ++c) gates.data<float>()[r * half + c] = v[r * n + gated_value_column(c, g) + g];
  KILN_RETURN_IF_ERROR(fused_epilogue(ctx, gates));
  float* y = ctx.output(0).data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < half; ++c) y[r * half + c] = v[r * n + gated_value_column(c, g)] * gates.data<float>()[r * half + c];
  return {};
}

Status ref_fused_matmul(KernelContext& ctx) {
  if (ctx.node().has_attr("gate_block")) return ref_gated_matmul(ctx);
  const std::vector<int64_t> splits = ctx.node().attr_ints("splits");
  if (splits.empty()) return ref::run_widened(ctx, fused_matmul);
  // Split outputs: the whole product into one tensor, then each output's columns from it.
  if (splits.size() != ctx.num_outputs()) return ctx.error("the splits do not match the outputs");
  size_t given = 0;  // an output that is not omitted: Y's shape but for the last dim
  while (given + 1 < splits.size() && !ctx.output(given).defined()) ++given;
  if (ctx.output(given).shape().empty()) return ctx.error("split outputs of a scalar product");
  int64_t n = 0;
  for (int64_t w : splits) n += w;
  // The product and bias whole, without the activations when some outputs skip them.
  const std::vector<int64_t> on = ctx.node().attr_ints("activated", std::vector<int64_t>(splits.size(), 1));
  const bool per_output = std::find(on.begin(), on.end(), 0) != on.end();
  KILN_ASSIGN_OR_RETURN(const Tensor whole, whole_product(ctx, ctx.output(given).shape(), n, per_output));
  const float* y = whole.data<float>();
  const int64_t rows = n ? whole.numel() / n : 0;
  int64_t begin = 0;
  for (size_t o = 0; o < splits.size(); ++o) {
    if (!ctx.output(o).defined()) {  // an omitted output
      begin += splits[o];
      continue;
    }
    Tensor& part = ctx.output(o);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(part.data<float>() + r * splits[o], y + r * n + begin, static_cast<size_t>(splits[o]) * sizeof(float));
    if (per_output && on[o] != 0) KILN_RETURN_IF_ERROR(fused_epilogue(ctx, part));
    begin += splits[o];
  }
  return {};
}

}  // namespace nn

void register_ref_nn(KernelRegistry& r) {
  r.add_reference("MatMul", nn::ref_matmul);
  r.add_reference("Gemm", nn::ref_gemm);
  r.add_reference("FusedMatMul", nn::ref_fused_matmul);
  nn::register_ref_nn_conv(r);
  nn::register_ref_nn_pool(r);
  nn::register_ref_nn_sample(r);
  nn::register_ref_nn_einsum(r);
  nn::register_ref_nn_quant(r);
}

}  // namespace kiln
