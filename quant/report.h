// The accuracy report of `kiln quant --report`: how far each quantized layer's output, as the
// next layer reads it (quantized and dequantized), and each graph output are from the float
// model's on the same evaluation inputs, as SQNR = 10 · log10(Σ f² / Σ (q − f)²) in dB, summed
// over every sample (PT2E's numeric debugger compares per node the same way).
#pragma once

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "formats/ir.h"
#include "runtime/session.h"

namespace kiln::quant {

/// Signal and noise of one compared tensor, summed over the samples.
struct Sqnr {
  double signal = 0, noise = 0;
  int64_t elements = 0;
  /// In dB; +inf when the quantized values are exact, -inf when the float ones are all zero.
  double db() const {
    if (noise == 0) return std::numeric_limits<double>::infinity();
    if (signal == 0) return -std::numeric_limits<double>::infinity();
    return 10 * std::log10(signal / noise);
  }
  void add(const float* f, const float* q, int64_t n);
};

/// What the quantizer made of a node: its pattern and the nodes of that pattern's instance.
struct PatternOf {
  std::string pattern;             ///< "conv_add_relu"
  std::vector<std::string> nodes;  ///< every node of the instance (a conv, its add and relu)
};

/// One quantized layer: the float model's node whose output the quantized model quantizes.
struct LayerSqnr {
  std::string node;     ///< its name (in the float model, as the user's model names it)
  std::string value;    ///< the output's name
  std::string pattern;  ///< the quantizer's pattern ("conv_add_relu")
  std::vector<std::string> nodes;  ///< the pattern instance's nodes (what keeping it float takes)
  Sqnr sqnr;
  /// The noise this layer adds itself: its noise-to-signal ratio less the largest of the layers
  /// it reads from (ranking_by_own_error).
  double own_noise = 0;
};

class AccuracyReport {
 public:
  /// The layers to follow: every QuantizeLinear of `quantized` that quantizes the output of a
  /// node of `float_graph` (matched by value name), per tensor. `patterns` names each float
  /// node's pattern (by node name). Both graphs must outlive the report.
  AccuracyReport(const Graph& float_graph, const Graph& quantized, const std::map<std::string, PatternOf>& patterns);

  /// Runs one sample (in graph.inputs order) through both sessions (on the graphs given above)
  /// and adds its errors.
  Status add_sample(Session& float_session, Session& quantized_session, const std::vector<Tensor>& inputs);

  /// The layers, worst SQNR first.
  std::vector<LayerSqnr> layers() const;
  /// The layers by the noise each adds itself, most first (--min-sqnr's sensitivity order): a
  /// layer's SQNR counts the noise of everything before it, so each one's noise-to-signal
  /// ratio is taken less the largest among the quantized layers it reads from.
  std::vector<LayerSqnr> ranking_by_own_error() const;
  /// The lowest SQNR among the graph outputs (the end-to-end figure).
  double end_to_end_db() const;
  /// Each graph output's SQNR, in graph order, with its name.
  const std::vector<std::pair<std::string, Sqnr>>& outputs() const { return outputs_; }
  int64_t samples() const { return samples_; }

 private:
  class FloatCapture;
  class QuantizedCompare;
  const Graph& quantized_;
  std::vector<LayerSqnr> layers_;
  std::vector<std::vector<size_t>> upstream_;  ///< per layer: the layers it reads from
  std::map<ValueId, size_t> float_value_layer_;  ///< float graph value -> layer
  std::map<size_t, size_t> q_node_layer_;        ///< quantized graph QuantizeLinear node index -> layer
  std::vector<std::pair<std::string, Sqnr>> outputs_;
  int64_t samples_ = 0;
};

}  // namespace kiln::quant
