#include "quant/convert.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <map>

namespace kiln::quant {

namespace {

// The scale and zero point as constants: rank 0 per tensor, [C] per channel; blocked, the
// shape of the tensor `like` they quantize with its blocked dim counted in blocks.
std::pair<ValueId, ValueId> param_constants(Graph& g, const std::string& base, const QParams& q, DType dtype, const Value& like) {
  std::vector<int64_t> shape;
  if (q.block_size > 0) {
    shape = like.shape.concrete();
    int64_t& d = shape[static_cast<size_t>(q.axis)];
    d = (d + q.block_size - 1) / q.block_size;
  } else if (q.axis >= 0) {
    shape = {static_cast<int64_t>(q.scale.size())};
  }
  Tensor scale(DType::f32, shape);
  Tensor zero(dtype, shape);
  for (int64_t i = 0; i < scale.numel(); ++i) {
    scale.data<float>()[i] = q.scale[static_cast<size_t>(i)];
    const int64_t z = q.zero_point[static_cast<size_t>(i)];
    if (is_int4(dtype)) set_int4(zero.raw(), i, static_cast<int>(z));
    else if (dtype == DType::u8) zero.data<uint8_t>()[i] = static_cast<uint8_t>(z);
    else if (dtype == DType::i8) zero.data<int8_t>()[i] = static_cast<int8_t>(z);
    else zero.data<int32_t>()[i] = static_cast<int32_t>(z);
  }
  return {g.add_constant(base + "_scale", std::move(scale)), g.add_constant(base + "_zero_point", std::move(zero))};
}

// x quantized numerically (a weight): round half to even, plus the zero point, saturated.
Tensor quantize_tensor(const Tensor& x, const QParams& q, const QuantSpec& spec) {
  Tensor out(spec.dtype, x.shape());
  const std::vector<double> v = x.to_double_vector();
  const ChannelIndex index(x.shape(), std::max<int64_t>(q.axis, 0), q.block_size);
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);
  for (size_t i = 0; i < v.size(); ++i) {
    const size_t c = q.axis >= 0 ? static_cast<size_t>(index(static_cast<int64_t>(i))) : 0;
    const float scaled = static_cast<float>(v[i]) / q.scale[c];  // divided in f32, as QuantizeLinear does
    const int64_t r = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(scaled)) + q.zero_point[c], spec.qmin, spec.qmax);
    if (is_int4(spec.dtype)) set_int4(out.raw(), static_cast<int64_t>(i), static_cast<int>(r));
    else if (spec.dtype == DType::u8) out.data<uint8_t>()[i] = static_cast<uint8_t>(r);
    else if (spec.dtype == DType::i8) out.data<int8_t>()[i] = static_cast<int8_t>(r);
    else out.data<int32_t>()[i] = static_cast<int32_t>(r);
  }
  std::fesetround(saved);
  return out;
}

}  // namespace

QParams group_qparams(const Prepared& p, size_t gi) {
  const ObserverGroup& g = p.groups[gi];
  if (g.fixed) return QParams{{g.fixed->scale}, {g.fixed->zero_point}, -1};
  if (g.derived) {
    QParams out{{1.0f}, {0}, -1};
    for (const Edge& e : g.derived->from) {
      const QParams q = group_qparams(p, p.group_of.at(e));
      if (q.scale.size() > out.scale.size()) {  // per channel: broadcast what there is so far
        out.scale.assign(q.scale.size(), out.scale[0]);
        out.axis = q.axis;
      }
      for (size_t i = 0; i < out.scale.size(); ++i) out.scale[i] *= q.scale[q.scale.size() == 1 ? 0 : i];
    }
    out.zero_point.assign(out.scale.size(), 0);
    if (out.axis >= 0) out.axis = 0;  // a derived bias is 1-D
    return out;
  }
  return g.observer ? g.observer->qparams() : QParams{{1.0f}, {0}, -1};
}

Result<ConvertStats> convert(Model& model, const Prepared& prepared) {
  Graph& g = model.graph;
  ConvertStats stats;
  const size_t nn = g.nodes.size();
  std::vector<std::vector<Node>> before(nn), after(nn);
  // Which group's DQ an input (node, slot) reads already: a quantized output's readers.
  std::map<std::pair<size_t, int>, size_t> reads_group;
  std::vector<std::vector<std::pair<size_t, int>>> readers(g.values.size());
  for (size_t n = 0; n < nn; ++n)
    for (size_t i = 0; i < g.nodes[n].inputs.size(); ++i)
      if (g.nodes[n].inputs[i] != kNoValue) readers[static_cast<size_t>(g.nodes[n].inputs[i])].emplace_back(n, static_cast<int>(i));

  size_t made = 0;  // numbers the new nodes' names, which must stay unique
  auto make_node = [&](const std::string& op, const std::string& name, std::vector<ValueId> in, ValueId out, const QParams& q) {
    Node node;
    node.name = name + "_" + std::to_string(made++);
    node.op = op;
    node.inputs = std::move(in);
    node.outputs = {out};
    if (q.axis >= 0) node.set_attr("axis", q.axis);
    if (q.block_size > 0) node.set_attr("block_size", q.block_size);
    return node;
  };
  // A DQ of `q` (quantized like `like`, as `dtype`) for reader (n, slot), placed before it.
  auto dequantize_for = [&](size_t n, int slot, ValueId q, ValueId scale, ValueId zero, const QParams& params, const Value& like) {
    const ValueId dq = g.add_value(like.name + "_dq", like.dtype, like.shape);
    before[n].push_back(make_node("DequantizeLinear", g.nodes[n].name + "/dq" + std::to_string(slot), {q, scale, zero}, dq, params));
    g.nodes[n].inputs[static_cast<size_t>(slot)] = dq;
    ++stats.dequantize_nodes;
  };

  // Outputs first: one Q after the producer, a DQ before each reader.
  for (size_t gi = 0; gi < prepared.groups.size(); ++gi) {
    const ObserverGroup& group = prepared.groups[gi];
    if (group.spec.is_dynamic) continue;
    const QParams q = group_qparams(prepared, gi);
    for (const Edge& e : group.edges) {
      if (!e.is_output()) continue;
      const ValueId v = edge_value(g, e);
      if (readers[static_cast<size_t>(v)].empty()) continue;  // a graph output alone stays float
      const Value like = g.value(v);
      auto [scale, zero] = param_constants(g, like.name, q, group.spec.dtype, like);
      const ValueId qv = g.add_value(like.name + "_q", group.spec.dtype, like.shape);
      after[e.node].push_back(make_node("QuantizeLinear", g.nodes[e.node].name + "/q", {v, scale, zero}, qv, q));
      ++stats.quantize_nodes;
      for (auto [n, slot] : readers[static_cast<size_t>(v)]) {
        dequantize_for(n, slot, qv, scale, zero, q, like);
        reads_group[{n, slot}] = gi;
      }
    }
  }
  // Then input edges not already reading their group: a weight stored quantized, or Q → DQ.
  for (size_t gi = 0; gi < prepared.groups.size(); ++gi) {
    const ObserverGroup& group = prepared.groups[gi];
    if (group.spec.is_dynamic) continue;
    const QParams q = group_qparams(prepared, gi);
    for (const Edge& e : group.edges) {
      if (e.is_output()) continue;
      if (auto it = reads_group.find({e.node, e.input}); it != reads_group.end() && it->second == gi) continue;
      const ValueId v = g.nodes[e.node].inputs[static_cast<size_t>(e.input)];
      const Value like = g.value(v);
      auto [scale, zero] = param_constants(g, like.name, q, group.spec.dtype, like);
      ValueId qv;
      if (like.is_constant()) {
        qv = g.add_constant(like.name + "_quantized", quantize_tensor(like.constant, q, group.spec));
        ++stats.quantized_weights;
      } else {
        qv = g.add_value(like.name + "_q", group.spec.dtype, like.shape);
        before[e.node].push_back(make_node("QuantizeLinear", g.nodes[e.node].name + "/q" + std::to_string(e.input), {v, scale, zero}, qv, q));
        ++stats.quantize_nodes;
      }
      dequantize_for(e.node, e.input, qv, scale, zero, q, like);
    }
  }
  // Dynamic input edges: DynamicQuantizeLinear, then a DQ of its three outputs.
  for (size_t gi = 0; gi < prepared.groups.size(); ++gi) {
    const ObserverGroup& group = prepared.groups[gi];
    if (!group.spec.is_dynamic) continue;
    for (const Edge& e : group.edges) {
      if (e.is_output()) continue;
      const ValueId v = g.nodes[e.node].inputs[static_cast<size_t>(e.input)];
      const Value like = g.value(v);
      const ValueId q = g.add_value(like.name + "_dq_u8", DType::u8, like.shape);
      const ValueId scale = g.add_value(like.name + "_dq_scale", DType::f32, Shape(std::vector<Dim>{}));
      const ValueId zero = g.add_value(like.name + "_dq_zero_point", DType::u8, Shape(std::vector<Dim>{}));
      Node dyn;
      dyn.name = g.nodes[e.node].name + "/dynamic_q" + std::to_string(e.input) + "_" + std::to_string(made++);
      dyn.op = "DynamicQuantizeLinear";
      dyn.inputs = {v};
      dyn.outputs = {q, scale, zero};
      before[e.node].push_back(std::move(dyn));
      ++stats.dynamic_quantize_nodes;
      const ValueId dq = g.add_value(like.name + "_dq", like.dtype, like.shape);
      before[e.node].push_back(make_node("DequantizeLinear", g.nodes[e.node].name + "/dq" + std::to_string(e.input), {q, scale, zero}, dq, QParams{}));
      g.nodes[e.node].inputs[static_cast<size_t>(e.input)] = dq;
      ++stats.dequantize_nodes;
    }
  }
  std::vector<Node> nodes;
  nodes.reserve(nn + stats.quantize_nodes + stats.dequantize_nodes + stats.dynamic_quantize_nodes);
  for (size_t n = 0; n < nn; ++n) {
    for (Node& x : before[n]) nodes.push_back(std::move(x));
    nodes.push_back(std::move(g.nodes[n]));
    for (Node& x : after[n]) nodes.push_back(std::move(x));
  }
  g.nodes = std::move(nodes);
  model.stage = Stage::quantized;
  return stats;
}

}  // namespace kiln::quant
