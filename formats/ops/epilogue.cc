// Names and parameters of the fused ops' activations (epilogue.h).
#include "formats/ops/epilogue.h"

#include <array>
#include <utility>

namespace kiln {

namespace {

constexpr std::array<std::pair<Activation, std::string_view>, 10> kNames = {{
    {Activation::relu, "Relu"},
    {Activation::leaky_relu, "LeakyRelu"},
    {Activation::clip, "Clip"},
    {Activation::sigmoid, "Sigmoid"},
    {Activation::tanh, "Tanh"},
    {Activation::hard_sigmoid, "HardSigmoid"},
    {Activation::hard_swish, "HardSwish"},
    {Activation::gelu, "Gelu"},
    {Activation::gelu_tanh, "GeluTanh"},
    {Activation::silu, "Silu"},
}};

}  // namespace

std::string_view activation_name(Activation a) {
  for (const auto& [kind, name] : kNames)
    if (kind == a) return name;
  return "";
}

std::optional<Activation> activation_from_name(std::string_view name) {
  if (name.empty()) return Activation::none;
  for (const auto& [kind, n] : kNames)
    if (n == name) return kind;
  return std::nullopt;
}

size_t activation_param_count(Activation a) {
  switch (a) {
    case Activation::leaky_relu: return 1;
    case Activation::clip:
    case Activation::hard_sigmoid: return 2;
    default: return 0;
  }
}

std::optional<ActivationSpec> activation_of_node(const Node& n, float clip_lo, float clip_hi) {
  if (!n.domain.empty()) return std::nullopt;
  if (n.op == "Relu") return ActivationSpec{Activation::relu};
  if (n.op == "Sigmoid") return ActivationSpec{Activation::sigmoid};
  if (n.op == "Tanh") return ActivationSpec{Activation::tanh};
  if (n.op == "HardSwish") return ActivationSpec{Activation::hard_swish};
  if (n.op == "LeakyRelu") return ActivationSpec{Activation::leaky_relu, static_cast<float>(n.attr_float("alpha", 0.01f))};
  if (n.op == "HardSigmoid")
    return ActivationSpec{Activation::hard_sigmoid, static_cast<float>(n.attr_float("alpha", 0.2f)),
                          static_cast<float>(n.attr_float("beta", 0.5f))};
  if (n.op == "Gelu")
    return ActivationSpec{n.attr_string("approximate", "none") == "tanh" ? Activation::gelu_tanh : Activation::gelu};
  if (n.op == "Clip") return ActivationSpec{Activation::clip, clip_lo, clip_hi};
  return std::nullopt;
}

Result<ActivationSpec> read_activation(const Node& node, std::string_view attr) {
  const std::string name = node.attr_string(attr, "");
  std::optional<Activation> kind = activation_from_name(name);
  if (!kind) {
    std::string known;
    for (const auto& [k, n] : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
    return user_error(node.where(), std::string(attr) + " '" + name + "' is not one of " + known);
  }
  const std::string params_attr = std::string(attr) + "_params";
  std::vector<double> params = node.attr_floats(params_attr);
  if (params.size() != activation_param_count(*kind))
    return user_error(node.where(), params_attr + " has " + std::to_string(params.size()) + " values but " +
                                        (name.empty() ? std::string("no activation") : name) + " takes " +
                                        std::to_string(activation_param_count(*kind)));
  ActivationSpec spec{*kind};
  if (params.size() > 0) spec.a = static_cast<float>(params[0]);
  if (params.size() > 1) spec.b = static_cast<float>(params[1]);
  return spec;
}

void write_activation(Node& node, std::string_view attr, const ActivationSpec& spec) {
  const std::string params_attr = std::string(attr) + "_params";
  if (spec.kind == Activation::none) {
    node.erase_attr(attr);
    node.erase_attr(params_attr);
    return;
  }
  node.set_attr(std::string(attr), std::string(activation_name(spec.kind)));
  const size_t n = activation_param_count(spec.kind);
  if (n == 0) {
    node.erase_attr(params_attr);
    return;
  }
  std::vector<double> params{spec.a};
  if (n == 2) params.push_back(spec.b);
  node.set_attr(params_attr, std::move(params));
}

}  // namespace kiln
