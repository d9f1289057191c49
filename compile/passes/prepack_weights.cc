// prepack_weights: freezing's last step. Plans the graph as the runtime will, on the kernels
// select_kernels recorded, and stores each constant weight those kernels packed (a oneDNN
// convolution's or matmul's blocked layout) packed in the model, so that loading it is a
// memory map and planning uses the mapped bytes with no reorder. A weight every reader packs
// the same way is replaced where it is, dropping the plain copy; a weight some node reads
// plain (a tied embedding that a Gather reads too) keeps its plain value, and each packed
// form becomes a value of its own. Value indices do not move, so the recorded memory plan
// stays valid.
#include <algorithm>
#include <map>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "runtime/plan.h"

namespace kiln {

Result<PassResult> prepack_weights(Model& model, PassContext& ctx) {
  Graph& g = model.graph;
  std::vector<std::vector<int64_t>> shapes;
  if (auto symbolic = concrete_input_shapes(g, shapes)) return PassResult{false, *symbolic + ": no kernels to pack for"};
  KILN_ASSIGN_OR_RETURN(ExecutionPlan plan, build_plan(g, shapes, PlanOptions{ctx.target, default_kernels()}));

  // Per constant: the packed forms its readers asked for, each with the (node, slot) pairs that
  // read it. A constant with more readers than that is also read plain.
  struct Form {
    Tensor packed;
    std::vector<std::pair<size_t, size_t>> readers;
  };
  std::map<ValueId, std::vector<Form>> forms;
  const std::vector<size_t> readers = reader_counts(g);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    const OpSchema* schema = core_ops().find(node.domain, node.op);
    if (!schema || node.kernel.name.empty() || node.kernel.name != plan.kernels[n].name) continue;
    for (int slot : schema->traits.prepack_inputs) {
      const auto i = static_cast<size_t>(slot);
      if (i >= node.inputs.size() || node.inputs[i] == kNoValue || !g.value(node.inputs[i]).is_constant()) continue;
      Tensor packed = plan.kernels[n].kernel->packed_input(i);
      if (!packed.defined()) continue;
      std::vector<Form>& fs = forms[node.inputs[i]];
      auto same = std::find_if(fs.begin(), fs.end(), [&](const Form& f) { return f.packed.layout()->same_placement(*packed.layout()); });
      if (same == fs.end()) same = fs.insert(fs.end(), Form{packed, {}});
      same->readers.emplace_back(n, i);
    }
  }
  if (forms.empty()) return PassResult{false, "no kernel packs a constant weight"};

  size_t packed_weights = 0, kept_plain = 0;
  int64_t plain_bytes = 0, stored_bytes = 0;
  for (auto& [v, fs] : forms) {
    size_t packed_reads = 0;
    for (const Form& f : fs) packed_reads += f.readers.size();
    const bool plain_read = readers[static_cast<size_t>(v)] > packed_reads;
    kept_plain += plain_read;
    // A copy: add_constant may reallocate the values. (The packed tensors own their memory and
    // outlive the plan.)
    const std::string name = g.value(v).name;
    for (size_t k = 0; k < fs.size(); ++k) {
      stored_bytes += static_cast<int64_t>(fs[k].packed.nbytes());
      ++packed_weights;
      if (k == 0 && !plain_read) {
        plain_bytes += static_cast<int64_t>(g.value(v).constant.nbytes());
        g.value(v).constant = fs[k].packed;
        continue;
      }
      std::string packed_name = name + ".packed";
      for (int suffix = 1; g.find_value(packed_name) != kNoValue; ++suffix) packed_name = name + ".packed" + std::to_string(suffix);
      const ValueId id = g.add_constant(packed_name, fs[k].packed);
      for (auto [n, slot] : fs[k].readers) g.nodes[n].inputs[slot] = id;
    }
  }
  std::string summary = "stored " + count_of(packed_weights, "weight", "weights") + " packed (" + std::to_string(stored_bytes) +
                        " bytes, " + std::to_string(plain_bytes) + " bytes of plain weights dropped)";
  if (kept_plain) summary += "; " + count_of(kept_plain, "weight keeps", "weights keep") + " a plain copy for other readers";
  return PassResult{true, summary};
}

}  // namespace kiln
