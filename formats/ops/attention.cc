// Core ops of the attention family: Attention (scaled dot-product attention with grouped-query
// heads, masks, KV cache and softcap, kept whole so fast kernels can fuse it) and
// RotaryEmbedding (schemas and type/shape inference). The loss ops of the same family live in
// formats/ops/loss.cc. Semantics are those of ONNX Attention-24 and RotaryEmbedding-23, plus
// Attention's rotary_cos / rotary_sin inputs (kiln's: RoPE applied to Q and K as they load);
// see docs/ops/attention.md.
#include <string>

#include "formats/checked.h"
#include "formats/op_schema.h"

namespace kiln {

namespace attention {
namespace {

// The known one of two dims that must agree (a symbolic or unknown one gives way); fails when
// both are known and differ.
Result<Dim> unify(const Dim& a, const Dim& b, const InferContext& ctx, const std::string& what) {
  if (a.is_known() && b.is_known() && a.value != b.value)
    return ctx.error(what + ": " + std::to_string(a.value) + " vs " + std::to_string(b.value));
  if (a.is_known()) return a;
  if (b.is_known()) return b;
  return a.is_symbolic() ? a : b;
}

Dim dim_at(const Shape& s, int64_t i) { return s.rank() > i ? s.dims[static_cast<size_t>(i)] : Dim::unknown(); }

// `total` / `parts` when known, checking divisibility.
Result<Dim> split_dim(const Dim& total, int64_t parts, const InferContext& ctx, const std::string& what) {
  if (!total.is_known()) return Dim::unknown();
  if (total.value % parts != 0)
    return ctx.error(what + " " + std::to_string(total.value) + " is not a multiple of the head count " + std::to_string(parts));
  return Dim::known(total.value / parts);
}

Result<Dim> mul_dim(const Dim& d, int64_t k, const InferContext& ctx) {
  if (!d.is_known()) return Dim::unknown();
  std::optional<int64_t> p = checked_mul(d.value, k);
  if (!p) return ctx.error("head size " + std::to_string(d.value) + " x " + std::to_string(k) + " heads overflows int64");
  return Dim::known(*p);
}

// Inputs: Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, and kiln's rotary_cos,
// rotary_sin. Outputs: Y, present_key, present_value, qk_matmul_output.
Status infer_attention(InferContext& ctx) {
  const Node& node = ctx.node();
  const DType qt = ctx.dtype(0), vt = ctx.dtype(2);
  const bool has_past_k = ctx.has_input(4), has_past_v = ctx.has_input(5);
  if (has_past_k != has_past_v) return ctx.error("past_key and past_value must be given together");
  const bool rotary = ctx.has_input(7);
  if (rotary != ctx.has_input(8)) return ctx.error("rotary_cos and rotary_sin must be given together");
  if (rotary)
    for (size_t i : {7, 8})
      if (ctx.rank(i) >= 0 && ctx.rank(i) != 3)
        return ctx.error(std::string(i == 7 ? "rotary_cos" : "rotary_sin") + " must be 3-D [batch, q_seq, head_size / 2], got rank " +
                         std::to_string(ctx.rank(i)));

  const int64_t mode = node.attr_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) return ctx.error("qk_matmul_output_mode " + std::to_string(mode) + " is not one of 0, 1, 2, 3");
  if (node.has_attr("scale") && !(node.attr_float("scale", 1.0) >= 0))
    return ctx.error("scale " + std::to_string(node.attr_float("scale", 1.0)) + " is negative");
  if (node.has_attr("softmax_precision")) {
    std::string p = node.attr_string("softmax_precision", "");
    auto t = dtype_from_name(p);
    if (!t || !is_float(*t)) return ctx.error("softmax_precision '" + p + "' is not one of f16, bf16, f32, f64");
  }
  const std::string products = node.attr_string("product_type", "f32");
  if (products != "f32" && products != "bf16") return ctx.error("product_type '" + products + "' is neither f32 nor bf16");
  for (DType t : {qt, vt})
    if (products == "bf16" && t != DType::undefined && t != DType::f32)
      return ctx.error("product_type bf16 needs f32 Q, K and V, got " + std::string(dtype_name(t)));
  const int64_t qh_attr = node.attr_int("q_num_heads", 0), kvh_attr = node.attr_int("kv_num_heads", 0);
  if (qh_attr < 0 || kvh_attr < 0) return ctx.error("q_num_heads and kv_num_heads must not be negative");

  const int64_t r = ctx.rank(0);
  if (r >= 0 && r != 3 && r != 4) return ctx.error("Q must be 3-D or 4-D, got rank " + std::to_string(r));
  for (size_t i : {1, 2})
    if (ctx.rank(i) >= 0 && r >= 0 && ctx.rank(i) != r)
      return ctx.error(std::string(i == 1 ? "K" : "V") + " has rank " + std::to_string(ctx.rank(i)) + " but Q has rank " + std::to_string(r));
  for (size_t i : {4, 5})
    if (ctx.has_input(i) && ctx.rank(i) >= 0 && ctx.rank(i) != 4)
      return ctx.error(std::string(i == 4 ? "past_key" : "past_value") + " must be 4-D, got rank " + std::to_string(ctx.rank(i)));
  if (ctx.has_input(3) && (ctx.rank(3) > 4 || ctx.rank(3) == 0))
    return ctx.error("attn_mask must have rank 1 to 4, got " + std::to_string(ctx.rank(3)));
  if (ctx.has_input(6) && ctx.rank(6) >= 0 && ctx.rank(6) != 1)
    return ctx.error("nonpad_kv_seqlen must be 1-D, got rank " + std::to_string(ctx.rank(6)));

  if (r < 0) {
    ctx.set_output(0, qt, Shape::unknown_rank());
    for (size_t i = 1; i < ctx.num_outputs(); ++i)
      ctx.set_output(i, i == 2 ? vt : qt, Shape(std::vector<Dim>(4, Dim::unknown())));
    return {};
  }
  const Shape &qs = ctx.shape(0), &ks = ctx.shape(1), &vs = ctx.shape(2);
  Dim b = dim_at(qs, 0), s = Dim::unknown(), d = Dim::unknown(), l = Dim::unknown(), dv = Dim::unknown();
  Dim hq = Dim::unknown(), hkv = Dim::unknown(), dk = Dim::unknown(), lv = Dim::unknown();
  if (r == 3) {
    if (qh_attr == 0 || kvh_attr == 0) return ctx.error("3-D Q, K, V need the q_num_heads and kv_num_heads attributes");
    hq = Dim::known(qh_attr);
    hkv = Dim::known(kvh_attr);
    s = dim_at(qs, 1);
    KILN_ASSIGN_OR_RETURN(d, split_dim(dim_at(qs, 2), qh_attr, ctx, "Q hidden size"));
    l = dim_at(ks, 1);
    KILN_ASSIGN_OR_RETURN(dk, split_dim(dim_at(ks, 2), kvh_attr, ctx, "K hidden size"));
    lv = dim_at(vs, 1);
    KILN_ASSIGN_OR_RETURN(dv, split_dim(dim_at(vs, 2), kvh_attr, ctx, "V hidden size"));
  } else {
    hq = dim_at(qs, 1);
    s = dim_at(qs, 2);
    d = dim_at(qs, 3);
    hkv = dim_at(ks, 1);
    l = dim_at(ks, 2);
    dk = dim_at(ks, 3);
    KILN_ASSIGN_OR_RETURN(hkv, unify(hkv, dim_at(vs, 1), ctx, "K and V head counts differ"));
    lv = dim_at(vs, 2);
    dv = dim_at(vs, 3);
    if (qh_attr > 0) {
      KILN_ASSIGN_OR_RETURN(hq, unify(hq, Dim::known(qh_attr), ctx, "Q head count and q_num_heads differ"));
    }
    if (kvh_attr > 0) {
      KILN_ASSIGN_OR_RETURN(hkv, unify(hkv, Dim::known(kvh_attr), ctx, "K head count and kv_num_heads differ"));
    }
  }
  KILN_ASSIGN_OR_RETURN(b, unify(b, dim_at(ks, 0), ctx, "Q and K batch sizes differ"));
  KILN_ASSIGN_OR_RETURN(b, unify(b, dim_at(vs, 0), ctx, "Q and V batch sizes differ"));
  KILN_ASSIGN_OR_RETURN(d, unify(d, dk, ctx, "Q and K head sizes differ"));
  KILN_ASSIGN_OR_RETURN(l, unify(l, lv, ctx, "K and V sequence lengths differ"));
  if (hq.is_known() && hkv.is_known() && (hkv.value == 0 || hq.value % hkv.value != 0))
    return ctx.error("q heads (" + std::to_string(hq.value) + ") are not a multiple of kv heads (" + std::to_string(hkv.value) + ")");
  if (rotary) {
    // Q and the new keys are rotated at the queries' positions: one cache row per (batch, token).
    if (d.is_known() && d.value % 2 != 0) return ctx.error("rotary embedding needs an even head size, got " + std::to_string(d.value));
    KILN_RETURN_IF_ERROR(unify(s, l, ctx, "rotary embedding needs as many new keys as queries").status());
    for (size_t i : {7, 8}) {
      if (ctx.rank(i) != 3) continue;
      const Shape& cs = ctx.shape(i);
      const std::string name = i == 7 ? "rotary_cos" : "rotary_sin";
      KILN_ASSIGN_OR_RETURN(b, unify(b, cs.dims[0], ctx, name + "'s batch size differs from Q's"));
      KILN_ASSIGN_OR_RETURN(s, unify(s, cs.dims[1], ctx, name + "'s sequence length differs from Q's"));
      if (d.is_known()) {
        KILN_RETURN_IF_ERROR(unify(cs.dims[2], Dim::known(d.value / 2), ctx, name + "'s last dim is not head_size / 2").status());
      }
    }
  }

  // The KV cache: total = past + new.
  Dim total = l;
  if (has_past_k) {
    const Shape &pk = ctx.shape(4), &pv = ctx.shape(5);
    if (pk.rank() == 4) {
      KILN_ASSIGN_OR_RETURN(b, unify(b, pk.dims[0], ctx, "past_key batch size differs from Q"));
      KILN_ASSIGN_OR_RETURN(hkv, unify(hkv, pk.dims[1], ctx, "past_key head count differs from K"));
      KILN_ASSIGN_OR_RETURN(d, unify(d, pk.dims[3], ctx, "past_key head size differs from K"));
    }
    Dim p = dim_at(pk, 2);
    if (pv.rank() == 4) {
      KILN_ASSIGN_OR_RETURN(b, unify(b, pv.dims[0], ctx, "past_value batch size differs from Q"));
      KILN_ASSIGN_OR_RETURN(hkv, unify(hkv, pv.dims[1], ctx, "past_value head count differs from V"));
      KILN_ASSIGN_OR_RETURN(p, unify(p, pv.dims[2], ctx, "past_key and past_value lengths differ"));
      KILN_ASSIGN_OR_RETURN(dv, unify(dv, pv.dims[3], ctx, "past_value head size differs from V"));
    }
    total = Dim::unknown();
    if (p.is_known() && l.is_known()) {
      std::optional<int64_t> sum = checked_add(p.value, l.value);
      if (!sum) return ctx.error("past length " + std::to_string(p.value) + " + sequence length " + std::to_string(l.value) +
                                 " overflows int64");
      total = Dim::known(*sum);
    }
  }
  if (ctx.has_input(3) && ctx.rank(3) >= 1) {
    // Broadcast against [B, Hq, S, total]; the last dim may be shorter (padded with -inf).
    const Shape& ms = ctx.shape(3);
    const std::vector<Dim> target{b, hq, s};
    const int64_t mr = ms.rank();
    const Dim& last = ms.dims.back();
    if (last.is_known() && total.is_known() && last.value > total.value)
      return ctx.error("attn_mask's last dim " + std::to_string(last.value) + " is longer than the total sequence length " +
                       std::to_string(total.value));
    for (int64_t i = 0; i + 1 < mr; ++i) {
      const Dim& md = ms.dims[static_cast<size_t>(i)];
      const Dim& td = target[static_cast<size_t>(3 - (mr - 1) + i)];
      if (md.is_known() && md.value != 1 && td.is_known() && md.value != td.value)
        return ctx.error("attn_mask shape " + ms.str() + " does not broadcast to [batch, q_heads, q_seq, total_seq] [" +
                         std::to_string(b.value) + ", " + std::to_string(hq.value) + ", " + std::to_string(s.value) + ", " +
                         std::to_string(total.value) + "]");
    }
  }
  if (ctx.has_input(6) && ctx.rank(6) == 1) {
    KILN_ASSIGN_OR_RETURN(b, unify(b, ctx.shape(6).dims[0], ctx, "nonpad_kv_seqlen length differs from the batch size"));
  }

  if (r == 3) {
    KILN_ASSIGN_OR_RETURN(Dim width, mul_dim(dv, qh_attr, ctx));
    ctx.set_output(0, qt, Shape({b, s, width}));
  } else {
    ctx.set_output(0, qt, Shape({b, hq, s, dv}));
  }
  if (ctx.num_outputs() > 1) ctx.set_output(1, qt, Shape({b, hkv, total, d}));
  if (ctx.num_outputs() > 2) ctx.set_output(2, vt, Shape({b, hkv, total, dv}));
  if (ctx.num_outputs() > 3) ctx.set_output(3, qt, Shape({b, hq, s, total}));
  return {};
}

// QAttention (compile's lower_int8 makes it): Attention of DQ(Q), DQ(K), DQ(V) with an optional
// mask, Y f32 or quantized. Inputs: Q, q_scale, q_zero_point, K, k_scale, k_zero_point, V,
// v_scale, v_zero_point, attn_mask, y_scale, y_zero_point; Y takes y_zero_point's type, f32
// without it. Attention's inference runs on Q, K, V and the mask.
Status infer_qattention(InferContext& ctx) {
  for (size_t i : {1, 2, 4, 5, 7, 8})
    if (!ctx.has_input(i)) return ctx.error("input " + std::to_string(i) + " (a scale or zero point of Q, K or V) is missing");
  KILN_RETURN_IF_ERROR(check_scalar_inputs(ctx, {1, 2, 4, 5, 7, 8, 10, 11}));
  if (ctx.has_input(10) != ctx.has_input(11)) return ctx.error("y_scale and y_zero_point must be given together");
  auto in = [&](size_t i) {
    return ctx.has_input(i) ? InferInput{ctx.dtype(i), ctx.shape(i), ctx.fold_value(i)} : InferInput{};
  };
  InferContext sub(ctx.node(), {in(0), in(3), in(6), in(9)});
  KILN_RETURN_IF_ERROR(infer_attention(sub));
  ctx.set_output(0, ctx.has_input(11) ? ctx.dtype(11) : DType::f32, sub.outputs()[0].shape);
  return {};
}

// Inputs: X, cos_cache, sin_cache, position_ids (optional).
Status infer_rotary(InferContext& ctx) {
  const Node& node = ctx.node();
  const bool has_pos = ctx.has_input(3);
  const int64_t heads = node.attr_int("num_heads", 0), rdim = node.attr_int("rotary_embedding_dim", 0);
  const int64_t interleaved = node.attr_int("interleaved", 0);
  if (heads < 0) return ctx.error("num_heads " + std::to_string(heads) + " is negative");
  if (interleaved != 0 && interleaved != 1) return ctx.error("interleaved " + std::to_string(interleaved) + " is not 0 or 1");
  if (rdim < 0 || rdim % 2 != 0) return ctx.error("rotary_embedding_dim " + std::to_string(rdim) + " is not a non-negative even number");
  const int64_t r = ctx.rank(0);
  if (r >= 0 && r != 3 && r != 4) return ctx.error("the input must be 3-D or 4-D, got rank " + std::to_string(r));
  const int64_t cache_rank = has_pos ? 2 : 3;
  for (size_t i : {1, 2})
    if (ctx.rank(i) >= 0 && ctx.rank(i) != cache_rank)
      return ctx.error(std::string(i == 1 ? "cos_cache" : "sin_cache") + " must be " + std::to_string(cache_rank) + "-D " +
                       (has_pos ? "with position_ids" : "without position_ids") + ", got rank " + std::to_string(ctx.rank(i)));
  if (has_pos && ctx.rank(3) >= 0 && ctx.rank(3) != 2)
    return ctx.error("position_ids must be 2-D, got rank " + std::to_string(ctx.rank(3)));
  if (r >= 0) {
    const Shape& xs = ctx.shape(0);
    Dim head_size = Dim::unknown(), batch = xs.dims[0], seq = xs.dims[r == 4 ? 2 : 1];
    if (r == 3) {
      if (heads == 0) return ctx.error("a 3-D input needs the num_heads attribute");
      KILN_ASSIGN_OR_RETURN(head_size, split_dim(xs.dims[2], heads, ctx, "hidden size"));
    } else {
      head_size = xs.dims[3];
      if (heads > 0 && xs.dims[1].is_known() && xs.dims[1].value != heads)
        return ctx.error("num_heads " + std::to_string(heads) + " differs from the input's head count " + std::to_string(xs.dims[1].value));
    }
    if (head_size.is_known()) {
      if (rdim > head_size.value)
        return ctx.error("rotary_embedding_dim " + std::to_string(rdim) + " is larger than the head size " + std::to_string(head_size.value));
      const int64_t rot = rdim > 0 ? rdim : head_size.value;
      if (rot % 2 != 0) return ctx.error("the head size " + std::to_string(rot) + " is odd");
      for (size_t i : {1, 2})
        if (ctx.rank(i) == cache_rank && ctx.shape(i).dims.back().is_known() && ctx.shape(i).dims.back().value != rot / 2)
          return ctx.error(std::string(i == 1 ? "cos_cache" : "sin_cache") + "'s last dim " +
                           std::to_string(ctx.shape(i).dims.back().value) + " is not rotary_embedding_dim / 2 = " + std::to_string(rot / 2));
    }
    // The per-token rows come from position_ids [B, S] or the caches' leading [B, S].
    const size_t src = has_pos ? 3 : 1;
    if (ctx.rank(src) >= 2) {
      KILN_RETURN_IF_ERROR(unify(batch, ctx.shape(src).dims[0], ctx, "batch size differs from the input's").status());
      KILN_RETURN_IF_ERROR(unify(seq, ctx.shape(src).dims[1], ctx, "sequence length differs from the input's").status());
    }
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  return {};
}

}  // namespace
}  // namespace attention

void register_attention_ops(OpRegistry& r) {
  using namespace attention;
  using namespace types;
  r.add("", OpSchema{"Attention", "scaled dot-product attention: grouped-query heads, mask, causal, KV cache, softcap, rotary", 3, 9, 1, 4,
                     {{"is_causal", AttrType::int64, false, "mask keys after the query position (0)"},
                      {"kv_num_heads", AttrType::int64, false, "K/V heads of 3-D inputs"},
                      {"q_num_heads", AttrType::int64, false, "Q heads of 3-D inputs"},
                      {"qk_matmul_output_mode", AttrType::int64, false, "0 raw, 1 softcapped, 2 plus mask, 3 softmax (0)"},
                      {"product_type", AttrType::string, false,
                       "kiln's: the two products' operands, f32 (default) or bf16 (Q, K, V and the softmax's probabilities rounded to bf16, sums in f32)"},
                      {"scale", AttrType::float64, false, "factor on Q K^T (1/sqrt(head_size))"},
                      {"softcap", AttrType::float64, false, "c * tanh(x / c) when > 0 (0)"},
                      {"softmax_precision", AttrType::string, false, "kiln type name the softmax must at least use"}},
                     infer_attention})
      .traits.types = {input(0, kFloat, "Q"), same_as(1, 0, "K"), input(2, kFloat, "V"), input(3, kAny, "attn_mask"),
                       same_as(4, 0, "past_key"), same_as(5, 2, "past_value"), input(6, DType::i64, "nonpad_kv_seqlen"),
                       same_as(7, 0, "rotary_cos"), same_as(8, 0, "rotary_sin")};
  const TypeSet int8 = DType::u8 | DType::i8;
  r.add("", OpSchema{"QAttention", "Attention of dequantized u8/s8 Q, K and V, its output f32 or quantized (made by compile)", 9, 12, 1, 1,
                     {{"is_causal", AttrType::int64, false, "mask keys after the query position (0)"},
                      {"kv_num_heads", AttrType::int64, false, "K/V heads of 3-D inputs"},
                      {"q_num_heads", AttrType::int64, false, "Q heads of 3-D inputs"},
                      {"scale", AttrType::float64, false, "factor on Q K^T (1/sqrt(head_size))"}},
                     infer_qattention})
      .traits.types = {input(0, int8, "Q"), input(1, DType::f32, "q_scale"), same_as(2, 0, "q_zero_point"),
                       input(3, int8, "K"), same_as(4, 1, "k_scale"), same_as(5, 3, "k_zero_point"),
                       input(6, int8, "V"), same_as(7, 1, "v_scale"), same_as(8, 6, "v_zero_point"),
                       input(9, kAny, "attn_mask"), same_as(10, 1, "y_scale"), input(11, int8, "y_zero_point")};
  r.add("", OpSchema{"RotaryEmbedding", "rotary position embedding of the first rotary_embedding_dim features of each head", 3, 4, 1, 1,
                     {{"interleaved", AttrType::int64, false, "rotate (even, odd) pairs instead of halves (0)"},
                      {"num_heads", AttrType::int64, false, "heads of a 3-D input"},
                      {"rotary_embedding_dim", AttrType::int64, false, "features rotated per head (0: all)"}},
                     infer_rotary})
      .traits.types = {input(0, kFloat, "input"), same_as(1, 0, "cos_cache"), same_as(2, 0, "sin_cache"),
                       input(3, DType::i64, "position_ids")};
}

}  // namespace kiln
