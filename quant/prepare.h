// prepare and calibrate (PT2E's prepare_pt2e and the calibration loop): the annotations become
// observer groups — one observer for every set of edges that must share scale and zero point —
// and a session's runs feed the values on those edges to them.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "quant/observer.h"
#include "quant/quantizer.h"
#include "runtime/session.h"

namespace kiln::quant {

/// One observer and the edges whose quantization parameters it sets.
struct ObserverGroup {
  QuantSpec spec;
  std::vector<Edge> edges;
  std::unique_ptr<Observer> observer;  ///< null for fixed, derived and dynamic specs
  std::optional<FixedSpec> fixed;
  std::optional<DerivedSpec> derived;
};

struct Prepared {
  std::vector<ObserverGroup> groups;
  std::map<Edge, size_t> group_of;  ///< every annotated edge
  /// The non-constant values calibration observes, each with the groups it feeds (graph inputs
  /// and node outputs). Constant ones (weights) were observed by prepare.
  std::map<ValueId, std::vector<size_t>> watch;
};

/// The value an edge carries: node `node`'s input `input`, or its output 0.
ValueId edge_value(const Graph& g, const Edge& e);

/// Groups the annotated edges: an edge with a SharedSpec joins the group of the edge it names;
/// a consumer's input and its producer's output share a group when their specs are equal and
/// both annotations allow it (PT2E's implicit sharing), transitively. Constant values (weights)
/// are observed here. A SharedSpec naming an edge without annotation, or edges of different
/// specs forced into one group, are internal errors (a quantizer's bug).
Result<Prepared> prepare(const Graph& graph, const Annotations& annotations);

/// Calibration: attached to a session of the same graph (the exported one, as annotated), it
/// feeds every watched value a run produces to its groups' observers. Call observe_inputs with
/// each run's inputs first (graph inputs are produced by no node).
class Calibrator final : public ExecutionObserver {
 public:
  Calibrator(const Graph& graph, Prepared& prepared) : graph_(graph), prepared_(prepared) {}
  Status observe_inputs(const std::vector<Tensor>& inputs);
  void on_node_end(const NodeEvent& e) override;
  /// The first error an observer reported during the runs (observers cannot fail a run).
  Status status() const { return status_; }

 private:
  void feed(ValueId v, const Tensor& t);
  const Graph& graph_;
  Prepared& prepared_;
  Status status_;
};

}  // namespace kiln::quant
