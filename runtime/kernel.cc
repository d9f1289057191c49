// Kernel registry.
#include "runtime/kernel.h"

#include <algorithm>

#include "formats/ops/epilogue.h"
#include "formats/ops/nn_util.h"

namespace kiln {

void KernelRegistry::add(std::string op, std::string device, KernelImpl impl) {
  impls_[{std::move(op), std::move(device)}].push_back(std::move(impl));
}

void KernelRegistry::add_reference(std::string op, KernelFn fn) {
  add(std::move(op), "cpu",
      KernelImpl{std::string(kReferenceKernel), [](const KernelQuery&) { return std::optional<std::string>(); },
                 [fn](const KernelQuery&) -> std::unique_ptr<Kernel> { return std::make_unique<FunctionKernel>(fn); }});
}

std::span<const KernelImpl> KernelRegistry::find(std::string_view op, std::string_view device) const {
  auto it = impls_.find(std::pair<std::string, std::string>(op, device));
  if (it == impls_.end()) return {};
  return it->second;
}

Result<KernelSelection> KernelRegistry::select(const KernelQuery& query, bool reference_only) const {
  const Node& node = query.node;
  const std::string& device = query.target.device;
  std::span<const KernelImpl> impls = find(node.qualified_op(), device);
  if (impls.empty()) return user_error(node.where(), "no kernel for op '" + node.qualified_op() + "' on " + device);
  KernelSelection sel;
  if (reference_only) {
    auto it = std::find_if(impls.begin(), impls.end(), [](const KernelImpl& k) { return k.name == kReferenceKernel; });
    if (it == impls.end())
      return user_error(node.where(), "no reference kernel for op '" + node.qualified_op() + "' on " + device);
    impls = std::span<const KernelImpl>(&*it, 1);
  }
  const std::string pinned = reference_only ? std::string() : node.kernel.name;
  if (!pinned.empty()) {
    auto it = std::find_if(impls.begin(), impls.end(), [&](const KernelImpl& k) { return k.name == pinned; });
    if (it == impls.end())
      return user_error(node.where(), "the model chose kernel '" + pinned + "', which this kiln does not have for '" +
                                          node.qualified_op() + "' on " + device);
    impls = std::span<const KernelImpl>(&*it, 1);
  }
  std::string reasons;
  for (const KernelImpl& impl : impls) {
    std::optional<std::string> why = impl.declines(query);
    if (!why && pinned.empty() && impl.defers) why = impl.defers(query);
    if (why) {
      if (!pinned.empty()) return user_error(node.where(), "the model chose kernel '" + pinned + "', which declines here: " + *why);
      reasons += (reasons.empty() ? "" : "; ") + impl.name + ": " + *why;
      sel.declined.emplace_back(impl.name, *why);
      continue;
    }
    sel.name = impl.name;
    sel.needs_isa = impl.needs_isa;
    sel.reads_packed = impl.reads_packed;
    sel.kernel = impl.create(query);
    if (!sel.kernel) return internal_error(node.where(), "kernel '" + impl.name + "' accepted the node but made no kernel");
    return sel;
  }
  return user_error(node.where(), "every kernel for '" + node.qualified_op() + "' declined: " + reasons);
}

std::vector<std::pair<std::string, std::string>> KernelRegistry::keys() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : impls_) out.push_back(k);
  return out;
}

KernelRegistry KernelRegistry::without(const std::vector<std::string>& names) const {
  KernelRegistry r;
  for (const auto& [key, impls] : impls_)
    for (const KernelImpl& impl : impls)
      if (std::find(names.begin(), names.end(), impl.name) == names.end()) r.add(key.first, key.second, impl);
  return r;
}

Tensor PackedWeights::find(const Tensor& plain, const PackedLayout& layout, DType dtype) const {
  for (const Form& f : forms_)
    if (f.source == plain.raw() && f.source_bytes == plain.nbytes() && f.packed.layout() && f.packed.dtype() == dtype &&
        f.packed.layout()->same_placement(layout))
      return f.packed;
  return {};
}

void PackedWeights::keep(const Tensor& plain, const Tensor& packed) {
  if (!packed.layout() || packed.raw() == plain.raw() || find(plain, *packed.layout(), packed.dtype()).defined()) return;
  forms_.push_back(Form{plain.raw(), plain.nbytes(), packed});
}

Tensor PackedWeights::unpacked(const Tensor& packed) {
  for (const Form& f : forms_)
    if (f.source == packed.raw() && f.source_bytes == packed.nbytes() && !f.packed.is_packed()) return f.packed;
  Tensor plain = unpack(packed);
  forms_.push_back(Form{packed.raw(), packed.nbytes(), plain});
  return plain;
}

void PackedWeights::drop_unused() {
  std::erase_if(forms_, [](const Form& f) { return f.packed.sole_owner(); });
}

size_t PackedWeights::bytes() const {
  size_t total = 0;
  for (const Form& f : forms_) total += f.packed.nbytes();
  return total;
}

Tensor packed_before(const KernelQuery& q, const Tensor& w, const PackedLayout& layout, DType dtype) {
  if (w.layout() && w.dtype() == dtype && w.layout()->same_placement(layout)) return w;
  return q.packed_weights ? q.packed_weights->find(w, layout, dtype) : Tensor();
}

void keep_packed(const KernelQuery& q, const Tensor& w, const Tensor& packed) {
  if (q.packed_weights && packed.defined()) q.packed_weights->keep(w, packed);
}

std::optional<std::string> f32_and_concrete(const KernelQuery& q) { return f32_and_concrete(q, TypeSet()); }

std::optional<std::string> f32_and_concrete(const KernelQuery& q, TypeSet weights) {
  for (size_t i = 0; i < q.inputs.size(); ++i) {
    if (q.inputs[i].dtype == DType::undefined) continue;
    const bool weight = i == 1 && weights.contains(q.inputs[i].dtype);
    if (weight && !q.inputs[i].value) return "the " + std::string(dtype_name(q.inputs[i].dtype)) + " weight is computed at run time";
    if (q.inputs[i].dtype != DType::f32 && !weight)
      return "input " + std::to_string(i) + " is " + std::string(dtype_name(q.inputs[i].dtype)) + ", not f32";
    if (!q.inputs[i].shape.is_concrete()) return "input " + std::to_string(i) + "'s shape is not known ahead";
    if (shape_numel(q.inputs[i].shape.concrete()) == 0) return "input " + std::to_string(i) + " is empty";
  }
  for (size_t i = 0; i < q.outputs.size(); ++i) {
    if (q.outputs[i].dtype == DType::undefined) continue;
    if (q.outputs[i].dtype != DType::f32) return "output " + std::to_string(i) + " is not f32";
    if (!q.outputs[i].shape.is_concrete()) return "output " + std::to_string(i) + "'s shape is not known ahead";
  }
  return std::nullopt;
}

std::optional<std::string> gemm_form_declines(const KernelQuery& q) {
  if (q.node.attr_float("alpha", 1.0) != 1.0) return "alpha is not 1";
  if (q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined) {
    if (q.node.attr_float("beta", 1.0) != 1.0) return "beta is not 1";
    const std::vector<int64_t> c = q.inputs[2].shape.concrete(), y = q.outputs[0].shape.concrete();
    const bool row = (c.size() == 1 && c[0] == y[1]) || (c.size() == 2 && c[0] == 1 && c[1] == y[1]);
    if (!row && c != y) return "C " + shape_str(c) + " is neither a row of N values nor [M, N]";
  }
  return std::nullopt;
}

std::optional<AttentionGeometry> attention_geometry(const KernelQuery& q) {
  if (q.inputs.size() < 3) return std::nullopt;
  for (size_t i = 0; i < 3; ++i)
    if (!q.inputs[i].shape.is_concrete() || q.inputs[i].shape.rank() != q.inputs[0].shape.rank()) return std::nullopt;
  const std::vector<int64_t> qs = q.inputs[0].shape.concrete(), ks = q.inputs[1].shape.concrete(), vs = q.inputs[2].shape.concrete();
  AttentionGeometry a;
  if (qs.size() == 4) {
    a = {.b = qs[0], .hq = qs[1], .s = qs[2], .d = qs[3], .hkv = ks[1], .t = ks[2], .dv = vs[3]};
    if (vs[1] != a.hkv || vs[2] != a.t || ks[3] != a.d) return std::nullopt;
  } else if (qs.size() == 3) {
    const int64_t hq = q.node.attr_int("q_num_heads", 0), hkv = q.node.attr_int("kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || qs[2] % hq || ks[2] % hkv || vs[2] % hkv) return std::nullopt;
    a = {.b = qs[0], .hq = hq, .s = qs[1], .d = qs[2] / hq, .hkv = hkv, .t = ks[1], .dv = vs[2] / hkv, .seq_major = true};
    if (vs[1] != a.t || ks[2] / hkv != a.d) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (ks[0] != a.b || vs[0] != a.b) return std::nullopt;
  return a;
}

std::optional<std::string> x_form_decline(const KernelQuery& q) {
  if (q.node.has_attr("x_parts")) return "X in parts (kiln's f32 GEMM reads them where they lie)";
  if (nn::x_channels_first(q.node)) return "X channels-first beside a channels-last Y (kiln.direct_conv reads it)";
  return std::nullopt;
}

bool piecewise_linear_activation(const Node& node) {
  const Result<ActivationSpec> act = read_activation(node, "activation");
  const Activation kind = act.ok() ? act->kind : Activation::none;
  return kind == Activation::none || kind == Activation::relu || kind == Activation::leaky_relu || kind == Activation::clip;
}

bool windows_tile_image(const KernelQuery& q) {
  if (q.node.op != "Conv" && q.node.op != "FusedConv") return false;
  if (q.inputs[0].shape.rank() != 4 || q.inputs[1].shape.rank() != 4 || !q.inputs[1].shape.is_concrete()) return false;
  if (q.node.attr_int("group", 1) != 1) return false;
  const std::vector<int64_t> w = q.inputs[1].shape.concrete();
  const std::vector<int64_t> strides = q.node.attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] != w[2] || strides[1] != w[3]) return false;
  for (int64_t d : q.node.attr_ints("dilations"))
    if (d != 1) return false;
  for (int64_t v : q.node.attr_ints("pads"))
    if (v != 0) return false;
  const std::string pad = q.node.attr_string("auto_pad", "NOTSET");
  return pad == "NOTSET" || pad == "VALID";
}

bool attention_rotary(const KernelQuery& q) { return q.inputs.size() > 8 && q.inputs[7].dtype != DType::undefined; }

bool attention_lengths(const KernelQuery& q) { return q.inputs.size() > 6 && q.inputs[6].dtype != DType::undefined; }

bool attention_bf16_products(const KernelQuery& q) { return q.node.attr_string("product_type", "f32") == "bf16"; }

int64_t attention_past(const KernelQuery& q) {
  if (q.inputs.size() <= 4 || q.inputs[4].dtype == DType::undefined || !q.inputs[4].shape.is_concrete() || q.inputs[4].shape.rank() != 4)
    return 0;
  return q.inputs[4].shape.concrete()[2];
}

bool attention_kv_cache(const KernelQuery& q) {
  const auto output = [&](size_t i) { return q.outputs.size() > i && q.outputs[i].dtype != DType::undefined; };
  return (q.inputs.size() > 4 && q.inputs[4].dtype != DType::undefined) || output(1) || output(2);
}

std::optional<std::string> attention_declines(const KernelQuery& q) {
  if (q.outputs.size() > 3 && q.outputs[3].dtype != DType::undefined) return "the scores output";
  for (size_t i = 0; i < 3; ++i) {
    const InferInput& in = q.inputs[i];
    if (in.dtype != DType::f32) return "not f32";
    if (!in.shape.is_concrete() || (in.shape.rank() != 4 && in.shape.rank() != 3)) return "not 3-D or 4-D with shapes known ahead";
    if (shape_numel(in.shape.concrete()) == 0) return "an empty input";
  }
  const std::string precision = q.node.attr_string("softmax_precision", "");
  if (!precision.empty() && precision != "f32" && precision != "f16" && precision != "bf16") return "softmax precision " + precision;
  const std::optional<AttentionGeometry> a = attention_geometry(q);
  if (!a || a->hkv == 0 || a->hq % a->hkv != 0) return "shapes that do not line up";
  if (attention_lengths(q) && (q.inputs[6].dtype != DType::i64 || !q.inputs[6].shape.is_concrete() ||
                               q.inputs[6].shape.concrete() != std::vector<int64_t>{a->b}))
    return "sequence lengths that are not i64 [batch]";
  // A KV cache: past keys and values [B, Hkv, P, D] / [B, Hkv, P, Dv] before the new ones.
  const int64_t past = attention_past(q), keys = a->t + past;
  if (q.inputs.size() > 4 && q.inputs[4].dtype != DType::undefined) {
    const std::vector<int64_t> want_k = {a->b, a->hkv, past, a->d}, want_v = {a->b, a->hkv, past, a->dv};
    if (q.inputs[4].dtype != DType::f32 || q.inputs[5].dtype != DType::f32 || !q.inputs[5].shape.is_concrete() ||
        q.inputs[4].shape.concrete() != want_k || q.inputs[5].shape.concrete() != want_v)
      return "past keys and values that are not f32 [batch, kv_heads, past, head_size]";
  }
  if (attention_rotary(q)) {
    for (size_t i : {7, 8})
      if (q.inputs[i].dtype != DType::f32 || q.inputs[i].shape.concrete() != std::vector<int64_t>{a->b, a->s, a->d / 2})
        return "rotary caches that are not f32 [batch, q_seq, head_size / 2]";
    if (a->t != a->s || a->d % 2 != 0) return "rotary embedding with keys other than the queries' or an odd head size";
  }
  if (q.inputs.size() > 3 && q.inputs[3].dtype != DType::undefined) {
    const InferInput& m = q.inputs[3];
    if (m.dtype != DType::f32 && m.dtype != DType::boolean) return "a mask that is neither f32 nor bool";
    if (!m.shape.is_concrete() || m.shape.rank() < 1 || m.shape.rank() > 4) return "a mask of unknown shape";
    std::vector<int64_t> md = m.shape.concrete();
    md.insert(md.begin(), 4 - md.size(), 1);
    const int64_t full[4] = {a->b, a->hq, a->s, keys};
    if (md[3] > full[3]) return "a mask longer than the keys";
    for (int i = 0; i < 3; ++i)
      if (md[static_cast<size_t>(i)] != 1 && md[static_cast<size_t>(i)] != full[i]) return "a mask that does not broadcast";
  }
  return std::nullopt;
}

const KernelRegistry& default_kernels() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    // Providers first: earlier implementations are preferred, the reference kernels come last.
    // XNNPACK's only take the tiny linear layers, where a call's fixed cost is the time and
    // theirs is lowest; then kiln's own, which take what they match or beat the libraries at
    // (docs/architecture.md, "Choosing kernels"); oneDNN's the rest.
    register_xnnpack_kernels(r);
    register_cpu_kernels(r);
    register_onednn_kernels(r);
    register_ref_elementwise(r);
    register_ref_reduce(r);
    register_ref_shape(r);
    register_ref_nn(r);
    register_ref_quant(r);
    register_ref_misc(r);
    register_ref_control(r);
    register_ref_attention(r);
    register_ref_loss(r);
    return r;
  }();
  return registry;
}

}  // namespace kiln
