// eliminate_dead: dead code elimination. Graph::remove_dead keeps what the graph outputs need
// (nodes, the values they read, the values their subgraphs capture) and the
// graph inputs, and drops everything else: nodes nothing reads, and values nothing refers to,
// unused constants included. Every core op is a pure function of its inputs, so a node no
// output needs has no effect to keep.
#include "compile/graph_util.h"
#include "compile/pass.h"

namespace kiln {

Result<PassResult> eliminate_dead(Model& model, PassContext&) {
  Graph& g = model.graph;
  const size_t nodes = g.nodes.size(), values = g.values.size();
  size_t constants = 0;
  for (const Value& v : g.values) constants += v.is_constant();
  g.remove_dead();
  for (const Value& v : g.values) constants -= v.is_constant();
  const size_t dropped_nodes = nodes - g.nodes.size(), dropped_values = values - g.values.size();
  if (dropped_nodes == 0 && dropped_values == 0) return PassResult{};
  return PassResult{true, "dropped " + count_of(dropped_nodes, "node", "nodes") + " and " +
                              count_of(dropped_values, "value", "values") + " (" + std::to_string(constants) +
                              (constants == 1 ? " constant)" : " constants)")};
}

}  // namespace kiln
