// specialize_shapes: --input-shape NAME=1x3x224x224 replaces the symbolic (or unknown) dims of
// graph inputs by numbers. A symbol bound by one input is bound wherever it appears, in every
// value of the graph, and the graph is inferred again so that each shape downstream becomes
// concrete where the inputs decide it.
#include <algorithm>
#include <map>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/infer.h"

namespace kiln {

namespace {

std::string input_list(const Graph& g) {
  std::string s;
  for (ValueId id : g.inputs) s += (s.empty() ? "'" : ", '") + g.value(id).name + "'";
  return s.empty() ? "none" : s;
}

}  // namespace

Result<PassResult> specialize_shapes(Model& model, PassContext& ctx) {
  if (ctx.input_shapes.empty()) return PassResult{};
  Graph& g = model.graph;
  // symbol -> (size, the input that bound it), for the conflict message.
  std::map<std::string, std::pair<int64_t, std::string>> bound;
  std::map<ValueId, Shape> fixed;
  for (const auto& [name, shape] : ctx.input_shapes) {
    ValueId id = g.find_value(name);
    if (id == kNoValue || std::find(g.inputs.begin(), g.inputs.end(), id) == g.inputs.end())
      return user_error("input '" + name + "'", "the model has no input of this name (--input-shape; inputs: " + input_list(g) + ")");
    const Value& v = g.value(id);
    if (!shape.is_concrete())
      return user_error("input '" + name + "'", "--input-shape " + shape.str() + ": compile needs a number for every dim");
    if (v.shape.rank_known && v.shape.rank() != shape.rank())
      return user_error("input '" + name + "'", "--input-shape " + shape.str() + " has rank " + std::to_string(shape.rank()) +
                                                    " but the input is " + v.shape.str());
    for (size_t d = 0; v.shape.rank_known && d < v.shape.dims.size(); ++d) {
      const Dim& have = v.shape.dims[d];
      const int64_t want = shape.dims[d].value;
      if (have.is_known() && have.value != want)
        return user_error("input '" + name + "'", "--input-shape " + shape.str() + " does not fit the input's shape " + v.shape.str());
      if (!have.is_symbolic()) continue;
      auto [it, fresh] = bound.emplace(have.symbol, std::make_pair(want, name));
      if (!fresh && it->second.first != want)
        return user_error("input '" + name + "'", "--input-shape binds '" + have.symbol + "' to " + std::to_string(want) +
                                                      " but input '" + it->second.second + "' binds it to " +
                                                      std::to_string(it->second.first));
    }
    fixed[id] = shape;
  }

  std::vector<Shape> before;
  size_t concrete_before = 0;
  for (const Value& v : g.values) {
    before.push_back(v.shape);
    concrete_before += v.shape.is_concrete();
  }
  // Every value that carries a bound symbol gets its number: inputs not named on the command
  // line included, so that two inputs sharing `batch` agree.
  for (Value& v : g.values)
    for (Dim& d : v.shape.dims)
      if (d.is_symbolic())
        if (auto it = bound.find(d.symbol); it != bound.end()) d = Dim::known(it->second.first);
  for (auto& [id, shape] : fixed) g.value(id).shape = shape;
  // Overwrite, not merge: the stored intermediate shapes were inferred (or declared) for the
  // symbolic inputs, and the bound inputs now decide them.
  InferOptions infer;
  infer.overwrite = true;
  KILN_RETURN_IF_ERROR(infer_graph(g, infer).status());

  size_t concrete_after = 0;
  bool changed = false;
  for (size_t i = 0; i < g.values.size(); ++i) {
    concrete_after += g.values[i].shape.is_concrete();
    changed = changed || !(g.values[i].shape == before[i]);
  }
  if (!changed) return PassResult{};
  std::string symbols;
  for (const auto& [sym, size] : bound) symbols += (symbols.empty() ? "" : ", ") + sym + "=" + std::to_string(size.first);
  PassResult r;
  r.changed = true;
  r.summary = "fixed " + count_of(fixed.size(), "input", "inputs") + (symbols.empty() ? "" : " (" + symbols + ")") + "; " +
              std::to_string(concrete_after) + " of " + count_of(g.values.size(), "value", "values") +
              " have concrete shapes (" + std::to_string(concrete_before) + " before)";
  return r;
}

}  // namespace kiln
