// Reference kernels of the attention family: Attention and RotaryEmbedding. The loss kernels
// live in runtime/ref/loss.cc. Every float type computes in double (converted on the way in
// and out), which also satisfies any softmax_precision the node asks for. Shapes and
// attributes were validated by the ops' inference (formats/ops/attention.cc), which the
// executor runs before each kernel.
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/kernel.h"

namespace kiln {

namespace attention {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Writes doubles into a float tensor of any float dtype.
void store(const std::vector<double>& v, Tensor& t) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(static_cast<float>(v[i]));
  });
}

void store_f64(const std::vector<double>& v, Tensor& t) {
  if (t.dtype() == DType::f64) {
    for (size_t i = 0; i < v.size(); ++i) t.data<double>()[i] = v[i];
  } else {
    store(v, t);
  }
}

// Q [B, H, S, D] from a 4-D tensor or a 3-D [B, S, H * D] one.
std::vector<double> heads_first(const Tensor& t, int64_t heads) {
  std::vector<double> v = t.to_double_vector();
  if (t.rank() == 4) return v;
  const int64_t b = t.dim(0), s = t.dim(1), d = t.dim(2) / heads;
  std::vector<double> out(v.size());
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < s; ++si)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t di = 0; di < d; ++di)
          out[static_cast<size_t>(((bi * heads + h) * s + si) * d + di)] = v[static_cast<size_t>((bi * s + si) * heads * d + h * d + di)];
  return out;
}

// Rotates x [B, H, S, D] in place, rotate-half form: token t of batch b by cache row b·S + t
// (cos and sin [B, S, D/2]), as RotaryEmbedding without position ids.
void rotate_halves(std::vector<double>& x, int64_t b, int64_t h, int64_t s, int64_t d, const std::vector<double>& cos,
                   const std::vector<double>& sin) {
  const int64_t half = d / 2;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t t = 0; t < s; ++t) {
        double* row = x.data() + ((bi * h + hi) * s + t) * d;
        const double* c = cos.data() + (bi * s + t) * half;
        const double* sn = sin.data() + (bi * s + t) * half;
        for (int64_t e = 0; e < half; ++e) {
          const double x1 = row[e], x2 = row[e + half];
          row[e] = c[e] * x1 - sn[e] * x2;
          row[e + half] = sn[e] * x1 + c[e] * x2;
        }
      }
}

// v rounded to bf16 (nearest even), as the products of product_type bf16 read it.
double bf16_value(double v) { return static_cast<float>(bfloat16(static_cast<float>(v))); }

void round_bf16(std::vector<double>& x) {
  for (double& v : x) v = bf16_value(v);
}

// past [B, H, P, D] ++ cur [B, H, L, D] along the sequence.
std::vector<double> concat_seq(const std::vector<double>& past, int64_t p, const std::vector<double>& cur, int64_t l,
                               int64_t b, int64_t h, int64_t d) {
  std::vector<double> out(static_cast<size_t>(b * h * (p + l) * d));
  for (int64_t bh = 0; bh < b * h; ++bh) {
    double* dst = out.data() + bh * (p + l) * d;
    for (int64_t i = 0; i < p * d; ++i) dst[i] = past[static_cast<size_t>(bh * p * d + i)];
    for (int64_t i = 0; i < l * d; ++i) dst[p * d + i] = cur[static_cast<size_t>(bh * l * d + i)];
  }
  return out;
}

Status ref_attention(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor &q = ctx.input(0), &k = ctx.input(1), &v = ctx.input(2);
  const bool three_d = q.rank() == 3;
  const int64_t batch = q.dim(0);
  int64_t hq, hkv, s, d, l, dv;
  if (three_d) {
    hq = node.attr_int("q_num_heads", 0);
    hkv = node.attr_int("kv_num_heads", 0);
    s = q.dim(1), d = q.dim(2) / hq, l = k.dim(1), dv = v.dim(2) / hkv;
  } else {
    hq = q.dim(1), hkv = k.dim(1), s = q.dim(2), d = q.dim(3), l = k.dim(2), dv = v.dim(3);
  }
  const bool has_past = ctx.has_input(4);
  const int64_t p = has_past ? ctx.input(4).dim(2) : 0, total = p + l;

  std::vector<double> qd = heads_first(q, hq), kd = heads_first(k, hkv), vd = heads_first(v, hkv);
  if (ctx.has_input(7)) {  // RoPE on Q and the new keys, token t of batch b at cache row b·S + t (L = S)
    const std::vector<double> cosv = ctx.input(7).to_double_vector(), sinv = ctx.input(8).to_double_vector();
    rotate_halves(qd, batch, hq, s, d, cosv, sinv);
    rotate_halves(kd, batch, hkv, l, d, cosv, sinv);
  }
  if (has_past) {
    kd = concat_seq(ctx.input(4).to_double_vector(), p, kd, l, batch, hkv, d);
    vd = concat_seq(ctx.input(5).to_double_vector(), p, vd, l, batch, hkv, dv);
  }
  if (ctx.num_outputs() > 1 && ctx.output(1).defined()) store_f64(kd, ctx.output(1));
  if (ctx.num_outputs() > 2 && ctx.output(2).defined()) store_f64(vd, ctx.output(2));
  // product_type bf16: Q, K (rotated) and V rounded to bf16, and each probability rounded to
  // bf16 before it weighs V (e^(x − max), the sum taken unrounded); the products in double.
  const bool bf16_products = node.attr_string("product_type", "f32") == "bf16";
  if (bf16_products) {
    round_bf16(qd);
    round_bf16(kd);
    round_bf16(vd);
  }

  // The additive mask, broadcast from the right against [B, Hq, S, total]; its last dim may be
  // shorter than total and is then padded with -inf (false for bool masks).
  const Tensor* mask = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  std::vector<double> mv;
  int64_t mstride[3] = {0, 0, 0}, mlast = 0;
  const bool mask_bool = mask && mask->dtype() == DType::boolean;
  if (mask) {
    mv = mask->to_double_vector();
    const int64_t mr = mask->rank();
    mlast = mask->dim(mr - 1);
    int64_t stride = mlast;
    for (int64_t i = mr - 2; i >= 0; --i) {
      const int64_t axis = 4 - mr + i;  // of [B, Hq, S, total]
      mstride[axis] = mask->dim(i) == 1 ? 0 : stride;
      stride *= mask->dim(i);
    }
  }
  std::vector<int64_t> nonpad;
  if (ctx.has_input(6)) nonpad = ctx.input(6).to_int64_vector();

  const double scale = node.has_attr("scale") ? node.attr_float("scale", 1.0) : 1.0 / std::sqrt(static_cast<double>(d));
  // Q and K are each scaled by sqrt(scale) (the ONNX formulation, which avoids overflow).
  const double root = std::sqrt(scale), factor = root * root;
  const double softcap = node.attr_float("softcap", 0.0);
  const bool causal = node.attr_int("is_causal", 0) != 0;
  const int64_t mode = node.attr_int("qk_matmul_output_mode", 0);
  Tensor* qk_out = ctx.num_outputs() > 3 && ctx.output(3).defined() ? &ctx.output(3) : nullptr;
  std::vector<double> qk;
  if (qk_out) qk.resize(static_cast<size_t>(batch * hq * s * total));
  std::vector<double> y(static_cast<size_t>(batch * hq * s * dv), 0.0);

  const int64_t group = hq / hkv;
  std::vector<double> row(static_cast<size_t>(total));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      // Query head h reads kv head h / group: each kv head serves `group` consecutive q heads.
      const double* kh = kd.data() + (b * hkv + h / group) * total * d;
      const double* vh = vd.data() + (b * hkv + h / group) * total * dv;
      for (int64_t i = 0; i < s; ++i) {
        const double* qi = qd.data() + ((b * hq + h) * s + i) * d;
        double* qk_row = qk_out ? qk.data() + ((b * hq + h) * s + i) * total : nullptr;
        const int64_t mbase = mstride[0] * b + mstride[1] * h + mstride[2] * i;
        for (int64_t j = 0; j < total; ++j) {
          const double* kj = kh + j * d;
          double x = 0;
          for (int64_t e = 0; e < d; ++e) x += qi[e] * kj[e];
          x *= factor;
          if (qk_row && mode == 0) qk_row[j] = x;
          if (softcap > 0) x = softcap * std::tanh(x / softcap);
          if (qk_row && mode == 1) qk_row[j] = x;
          double bias = 0;
          if (mask) {
            if (j >= mlast) bias = kNegInf;
            else if (mask_bool) bias = mv[static_cast<size_t>(mbase + j)] != 0 ? 0.0 : kNegInf;
            else bias = mv[static_cast<size_t>(mbase + j)];
          }
          if (causal && j > i + p) bias += kNegInf;
          if (!nonpad.empty() && j >= nonpad[static_cast<size_t>(b)]) bias += kNegInf;
          x += bias;
          if (qk_row && mode == 2) qk_row[j] = x;
          row[static_cast<size_t>(j)] = x;
        }
        // Softmax over the keys. A row masked entirely gives NaN, as in the ONNX reference.
        double mx = kNegInf;
        for (double x : row) mx = std::isnan(x) || x > mx ? x : mx;
        double sum = 0;
        for (double& x : row) sum += (x = std::exp(x - mx));
        for (double& x : row) x = (bf16_products ? bf16_value(x) : x) / sum;
        if (qk_row && mode == 3)
          for (int64_t j = 0; j < total; ++j) qk_row[j] = row[static_cast<size_t>(j)];
        double* yi = y.data() + ((b * hq + h) * s + i) * dv;
        for (int64_t j = 0; j < total; ++j) {
          const double pj = row[static_cast<size_t>(j)];
          const double* vj = vh + j * dv;
          for (int64_t e = 0; e < dv; ++e) yi[e] += pj * vj[e];
        }
      }
    }
  }
  if (qk_out) store_f64(qk, *qk_out);
  if (three_d) {
    // [B, Hq, S, Dv] back to [B, S, Hq * Dv].
    std::vector<double> t(y.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t i = 0; i < s; ++i)
          for (int64_t e = 0; e < dv; ++e)
            t[static_cast<size_t>((b * s + i) * hq * dv + h * dv + e)] = y[static_cast<size_t>(((b * hq + h) * s + i) * dv + e)];
    y.swap(t);
  }
  store_f64(y, ctx.output(0));
  return {};
}

Status ref_rotary(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const bool four_d = x.rank() == 4;
  const int64_t batch = x.dim(0);
  const int64_t heads = four_d ? x.dim(1) : node.attr_int("num_heads", 0);
  const int64_t seq = four_d ? x.dim(2) : x.dim(1);
  const int64_t hd = four_d ? x.dim(3) : x.dim(2) / heads;
  const int64_t rot = node.attr_int("rotary_embedding_dim", 0) > 0 ? node.attr_int("rotary_embedding_dim", 0) : hd;
  const int64_t half = rot / 2;
  const bool interleaved = node.attr_int("interleaved", 0) != 0;
  const std::vector<double> xv = x.to_double_vector(), cosv = ctx.input(1).to_double_vector(), sinv = ctx.input(2).to_double_vector();
  std::vector<int64_t> pos;
  const bool has_pos = ctx.has_input(3);
  if (has_pos) pos = ctx.input(3).to_int64_vector();
  const int64_t max_pos = has_pos ? ctx.input(1).dim(0) : 0;
  if (has_pos && ctx.input(2).dim(0) != max_pos)
    return ctx.error("cos_cache has " + std::to_string(max_pos) + " positions but sin_cache has " + std::to_string(ctx.input(2).dim(0)));
  std::vector<double> out(xv.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      int64_t cache_row = b * seq + t;
      if (has_pos) {
        cache_row = pos[static_cast<size_t>(b * seq + t)];
        if (cache_row < 0 || cache_row >= max_pos)
          return ctx.error("position id " + std::to_string(cache_row) + " is out of range for a cache of " + std::to_string(max_pos) +
                           " positions");
      }
      const double* c = cosv.data() + cache_row * half;
      const double* sn = sinv.data() + cache_row * half;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = four_d ? ((b * heads + h) * seq + t) * hd : (b * seq + t) * heads * hd + h * hd;
        const double* in = xv.data() + base;
        double* o = out.data() + base;
        for (int64_t e = 0; e < half; ++e) {
          const int64_t i1 = interleaved ? 2 * e : e, i2 = interleaved ? 2 * e + 1 : e + half;
          const double x1 = in[i1], x2 = in[i2];
          o[i1] = c[e] * x1 - sn[e] * x2;
          o[i2] = sn[e] * x1 + c[e] * x2;
        }
        for (int64_t e = rot; e < hd; ++e) o[e] = in[e];
      }
    }
  }
  store_f64(out, ctx.output(0));
  return {};
}

}  // namespace
}  // namespace attention

namespace ref {
Status attention(KernelContext& ctx) { return kiln::attention::ref_attention(ctx); }
}  // namespace ref

void register_ref_attention(KernelRegistry& r) {
  r.add_reference("Attention", attention::ref_attention);
  r.add_reference("RotaryEmbedding", attention::ref_rotary);
}

}  // namespace kiln
