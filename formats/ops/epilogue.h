// The epilogues of kiln's fused ops (FusedConv, FusedMatMul): what `kiln compile` folds into a
// convolution or matrix product that used to follow it as separate nodes. One place names the
// activations and their parameters, so the schemas, the fusion pass and every kernel agree.
//
//   y = post_activation(activation(conv_or_matmul(x) + bias) + Z)
//
// Each stage is optional: no activation, no residual input Z, no post-activation.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"
#include "formats/status.h"

namespace kiln {

enum class Activation : uint8_t {
  none,
  relu,
  leaky_relu,    ///< alpha
  clip,          ///< min, max (Relu6 is Clip 0, 6)
  sigmoid,
  tanh,
  hard_sigmoid,  ///< alpha, beta
  hard_swish,
  gelu,          ///< erf form
  gelu_tanh,     ///< tanh approximation
  silu,          ///< x * sigmoid(x) (Swish with alpha 1)
};

/// An activation with its parameters (a, b: alpha / min and beta / max, as the kind says).
struct ActivationSpec {
  Activation kind = Activation::none;
  float a = 0, b = 0;
  bool operator==(const ActivationSpec&) const = default;
};

/// The attribute value that names an activation ("Relu", "LeakyRelu", "Clip", "Sigmoid",
/// "Tanh", "HardSigmoid", "HardSwish", "Gelu", "GeluTanh", "Silu"); "" for none.
std::string_view activation_name(Activation a);
std::optional<Activation> activation_from_name(std::string_view name);
/// How many parameters the activation takes (0, 1 or 2).
size_t activation_param_count(Activation a);

/// The activation a unary node computes: Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish,
/// Gelu (either form), and Clip with the bounds given (its optional inputs, which the caller
/// reads); nullopt for any other op. The fusion pass and the activation kernels both use it.
std::optional<ActivationSpec> activation_of_node(const Node& node, float clip_lo, float clip_hi);

/// Reads the activation a fused node names in attribute `attr` ("activation" or
/// "post_activation") and its parameters in `attr`_params; a user error about the node when the
/// name is unknown or the parameter count is wrong.
Result<ActivationSpec> read_activation(const Node& node, std::string_view attr);
/// Writes `spec` into the node's attributes `attr` and `attr`_params (removes them for none).
void write_activation(Node& node, std::string_view attr, const ActivationSpec& spec);

/// The attributes that hold a fused node's activations and their parameters.
inline constexpr const char* kActivationAttrs[] = {"activation", "activation_params", "post_activation", "post_activation_params"};

/// A gated FusedMatMul's (`gate_block` g) product column that holds output column j's value;
/// its gate is g columns on.
inline int64_t gated_value_column(int64_t j, int64_t g) { return j / g * 2 * g + j % g; }

}  // namespace kiln
