#include "quant/report.h"

#include <algorithm>
#include <cstring>

namespace kiln::quant {

void Sqnr::add(const float* f, const float* q, int64_t n) {
  double s = 0, e = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(q[i]) - static_cast<double>(f[i]);
    s += static_cast<double>(f[i]) * f[i];
    e += d * d;
  }
  signal += s;
  noise += e;
  elements += n;
}

namespace {

Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor out(DType::f32, t.shape());
  const std::vector<double> v = t.to_double_vector();
  for (size_t i = 0; i < v.size(); ++i) out.data<float>()[i] = static_cast<float>(v[i]);
  return out;
}

}  // namespace

// The float run: a copy of each followed layer's output (the arena reuses its memory later).
class AccuracyReport::FloatCapture final : public ExecutionObserver {
 public:
  FloatCapture(const std::map<ValueId, size_t>& layer_of, std::vector<Tensor>& out) : layer_of_(layer_of), out_(out) {}
  void on_node_end(const NodeEvent& e) override {
    for (size_t i = 0; i < e.node.outputs.size() && i < e.outputs.size(); ++i) {
      auto it = layer_of_.find(e.node.outputs[i]);
      if (it == layer_of_.end() || !e.outputs[i] || !e.outputs[i]->defined()) continue;
      const Tensor& t = *e.outputs[i];
      Tensor copy(t.dtype(), t.shape());
      std::memcpy(copy.raw(), t.raw(), t.nbytes());
      out_[it->second] = as_f32(copy);
    }
  }

 private:
  const std::map<ValueId, size_t>& layer_of_;
  std::vector<Tensor>& out_;
};

// The quantized run: each followed QuantizeLinear's output dequantized and compared.
class AccuracyReport::QuantizedCompare final : public ExecutionObserver {
 public:
  QuantizedCompare(const Graph& g, const std::map<size_t, size_t>& layer_of, const std::vector<Tensor>& floats,
                   std::vector<LayerSqnr>& layers)
      : g_(g), layer_of_(layer_of), floats_(floats), layers_(layers) {}
  void on_node_end(const NodeEvent& e) override {
    auto it = layer_of_.find(e.index);
    if (it == layer_of_.end() || e.outputs.empty() || !e.outputs[0] || !e.outputs[0]->defined()) return;
    const Tensor& f = floats_[it->second];
    const Tensor& q = *e.outputs[0];
    if (!f.defined() || f.numel() != q.numel()) return;
    const float scale = static_cast<float>(g_.value(e.node.inputs[1]).constant.to_double_vector()[0]);
    const double zero = g_.value(e.node.inputs[2]).constant.to_double_vector()[0];
    const std::vector<double> v = q.to_double_vector();
    std::vector<float> dq(v.size());
    for (size_t i = 0; i < v.size(); ++i) dq[i] = static_cast<float>(v[i] - zero) * scale;
    layers_[it->second].sqnr.add(f.data<float>(), dq.data(), f.numel());
  }

 private:
  const Graph& g_;
  const std::map<size_t, size_t>& layer_of_;
  const std::vector<Tensor>& floats_;
  std::vector<LayerSqnr>& layers_;
};

AccuracyReport::AccuracyReport(const Graph& float_graph, const Graph& quantized, const std::map<std::string, PatternOf>& patterns)
    : quantized_(quantized) {
  const std::vector<int32_t> producers = float_graph.producers();
  for (size_t n = 0; n < quantized.nodes.size(); ++n) {
    const Node& q = quantized.nodes[n];
    if (q.op != "QuantizeLinear" || !q.domain.empty() || q.inputs.size() < 3 || q.outputs.empty()) continue;
    const Value& scale = quantized.value(q.inputs[1]);
    const Value& zero = quantized.value(q.inputs[2]);
    if (!scale.is_constant() || scale.constant.numel() != 1 || !zero.is_constant() || zero.constant.numel() != 1) continue;
    const ValueId fv = float_graph.find_value(quantized.value(q.inputs[0]).name);
    if (fv == kNoValue || producers[static_cast<size_t>(fv)] < 0) continue;  // a graph input
    const Node& producer = float_graph.nodes[static_cast<size_t>(producers[static_cast<size_t>(fv)])];
    if (float_value_layer_.count(fv)) continue;
    LayerSqnr l;
    l.node = producer.name;
    l.value = float_graph.value(fv).name;
    if (auto it = patterns.find(producer.name); it != patterns.end()) {
      l.pattern = it->second.pattern;
      l.nodes = it->second.nodes;
    }
    float_value_layer_[fv] = layers_.size();
    q_node_layer_[n] = layers_.size();
    layers_.push_back(std::move(l));
  }
  for (ValueId o : float_graph.outputs) outputs_.emplace_back(float_graph.value(o).name, Sqnr{});
  // Each layer's upstream layers: back through the float graph from its producer's inputs to the
  // nearest layer outputs.
  upstream_.resize(layers_.size());
  for (const auto& [fv, layer] : float_value_layer_) {
    std::vector<ValueId> stack;
    std::vector<char> seen(float_graph.values.size(), 0);
    for (ValueId in : float_graph.nodes[static_cast<size_t>(producers[static_cast<size_t>(fv)])].inputs)
      if (in != kNoValue) stack.push_back(in);
    while (!stack.empty()) {
      const ValueId v = stack.back();
      stack.pop_back();
      if (seen[static_cast<size_t>(v)]) continue;
      seen[static_cast<size_t>(v)] = 1;
      if (auto it = float_value_layer_.find(v); it != float_value_layer_.end()) {
        upstream_[layer].push_back(it->second);
        continue;
      }
      const int32_t p = producers[static_cast<size_t>(v)];
      if (p < 0) continue;
      for (ValueId in : float_graph.nodes[static_cast<size_t>(p)].inputs)
        if (in != kNoValue) stack.push_back(in);
    }
  }
}

Status AccuracyReport::add_sample(Session& float_session, Session& quantized_session, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> floats(layers_.size());
  FloatCapture capture(float_value_layer_, floats);
  float_session.set_observer(&capture);
  Result<std::vector<Tensor>> want = float_session.run(inputs);
  float_session.set_observer(nullptr);
  if (!want.ok()) return want.status();
  QuantizedCompare compare(quantized_, q_node_layer_, floats, layers_);
  quantized_session.set_observer(&compare);
  Result<std::vector<Tensor>> got = quantized_session.run(inputs);
  quantized_session.set_observer(nullptr);
  if (!got.ok()) return got.status();
  for (size_t i = 0; i < outputs_.size() && i < want->size() && i < got->size(); ++i) {
    const Tensor f = as_f32((*want)[i]), q = as_f32((*got)[i]);
    if (f.numel() == q.numel()) outputs_[i].second.add(f.data<float>(), q.data<float>(), f.numel());
  }
  ++samples_;
  return {};
}

std::vector<LayerSqnr> AccuracyReport::ranking_by_own_error() const {
  auto ratio = [](const Sqnr& s) { return s.signal > 0 ? s.noise / s.signal : (s.noise > 0 ? 1.0 : 0.0); };
  std::vector<LayerSqnr> out = layers_;
  for (size_t l = 0; l < out.size(); ++l) {
    double before = 0;
    for (size_t u : upstream_[l]) before = std::max(before, ratio(layers_[u].sqnr));
    out[l].own_noise = ratio(layers_[l].sqnr) - before;
  }
  std::stable_sort(out.begin(), out.end(), [](const LayerSqnr& a, const LayerSqnr& b) { return a.own_noise > b.own_noise; });
  return out;
}

double AccuracyReport::end_to_end_db() const {
  double worst = std::numeric_limits<double>::infinity();
  for (const auto& [name, s] : outputs_) worst = std::min(worst, s.db());
  return worst;
}

std::vector<LayerSqnr> AccuracyReport::layers() const {
  std::vector<LayerSqnr> out = layers_;
  std::stable_sort(out.begin(), out.end(), [](const LayerSqnr& a, const LayerSqnr& b) { return a.sqnr.db() < b.sqnr.db(); });
  return out;
}

}  // namespace kiln::quant
