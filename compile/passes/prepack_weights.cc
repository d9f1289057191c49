// prepack_weights: freezing's last step. Plans the graph as the runtime will, on the kernels
// select_kernels recorded, and stores each constant weight those kernels packed (a oneDNN
// convolution's or matmul's blocked layout) packed in the model, so that loading it is a
// memory map and planning uses the mapped bytes with no reorder. A weight every reader packs
// the same way is replaced where it is, dropping the plain copy; a weight some node reads
// plain (a tied embedding that a Gather reads too) keeps its plain value, and each packed
// form becomes a value of its own. Value indices do not move, so the recorded memory plan
// stays valid. A model of symbolic input shapes records no kernels (each shape's plan chooses
// its own): its weights are stored packed where the kernels planned with the symbolic dims at
// 1, 8 and 32 all pack them the same way, as the lower-precision GEMMs do (their panels follow
// K and N alone), and plain otherwise.
#include <algorithm>
#include <map>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "runtime/plan.h"

namespace kiln {

namespace {

// The packed forms of a constant its readers' kernels asked for, each with the (node, slot)
// pairs that read it so.
struct Form {
  Tensor packed;
  std::vector<std::pair<size_t, size_t>> readers;
};
using Forms = std::map<ValueId, std::vector<Form>>;

// Plans `g` on `shapes` and collects the forms the kernels packed: the kernel each node recorded
// (select_kernels), or where none is recorded, the one the plan chose. Plans given the same
// `shared` pack a weight once per layout.
Result<Forms> packed_forms(const Graph& g, std::span<const std::vector<int64_t>> shapes, const Target& target,
                           PackedWeights* shared = nullptr) {
  PlanOptions options{target, default_kernels()};
  options.packed_weights = shared;
  KILN_ASSIGN_OR_RETURN(ExecutionPlan plan, build_plan(g, shapes, options));
  Forms forms;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    const OpSchema* schema = core_ops().find(node.domain, node.op);
    if (!schema || !plan.kernels[n].kernel || (!node.kernel.name.empty() && node.kernel.name != plan.kernels[n].name)) continue;
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
  return forms;
}

// The graph's input shapes with each symbolic or unknown dim at `size`; nullopt for an input of
// unknown rank.
std::optional<std::vector<std::vector<int64_t>>> shapes_at(const Graph& g, int64_t size) {
  std::vector<std::vector<int64_t>> shapes;
  for (ValueId in : g.inputs) {
    const Shape& s = g.value(in).shape;
    if (!s.rank_known) return std::nullopt;
    std::vector<int64_t>& dims = shapes.emplace_back();
    for (const Dim& d : s.dims) dims.push_back(d.is_known() ? d.value : size);
  }
  return shapes;
}

// The forms of `a` that `b` has too: the same layouts (and element types), read by the same
// nodes' slots.
Forms agreeing(Forms a, const Forms& b) {
  std::erase_if(a, [&](const auto& entry) {
    auto it = b.find(entry.first);
    if (it == b.end() || it->second.size() != entry.second.size()) return true;
    for (size_t k = 0; k < entry.second.size(); ++k) {
      const Form &x = entry.second[k], &y = it->second[k];
      if (x.readers != y.readers || x.packed.dtype() != y.packed.dtype() || !x.packed.layout()->same_placement(*y.packed.layout()))
        return true;
    }
    return false;
  });
  return a;
}

}  // namespace

Result<PassResult> prepack_weights(Model& model, PassContext& ctx) {
  Graph& g = model.graph;
  std::vector<std::vector<int64_t>> shapes;
  Forms forms;
  std::string note;
  if (auto symbolic = concrete_input_shapes(g, shapes)) {
    // No kernels recorded: each input shape's plan chooses its own. The weights their kernels
    // pack the same way with the symbolic dims at 1, 8 and 32 (the lower-precision GEMMs' panels
    // follow K and N alone) are stored so; a shape whose kernel wants another layout repacks.
    constexpr int64_t kSizes[] = {1, 8, 32};
    std::optional<Forms> every;
    bool any = false;
    PackedWeights shared;
    for (int64_t size : kSizes) {
      std::optional<std::vector<std::vector<int64_t>>> at = shapes_at(g, size);
      if (!at) return PassResult{false, *symbolic + ": no kernels to pack for"};
      Result<Forms> f = packed_forms(g, *at, ctx.target, &shared);
      if (!f.ok())
        return PassResult{false, *symbolic + ": no kernels to pack for (with its symbolic dims at " + std::to_string(size) + ": " +
                                     f.error().message() + ")"};
      any = any || !f->empty();
      every = every ? agreeing(std::move(*every), *f) : std::move(*f);
    }
    forms = std::move(*every);
    if (!any) return PassResult{false, *symbolic + ": no kernel packs a constant weight"};
    if (forms.empty()) return PassResult{false, *symbolic + ": no weight packed the same way with its symbolic dims at 1, 8 and 32"};
    note = " for the kernels of every input shape (packed the same way with its symbolic dims at 1, 8 and 32)";
  } else {
    KILN_ASSIGN_OR_RETURN(forms, packed_forms(g, shapes, ctx.target));
    if (forms.empty()) return PassResult{false, "no kernel packs a constant weight"};
  }

  const std::vector<size_t> readers = reader_counts(g);
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
                        " bytes, " + std::to_string(plain_bytes) + " bytes of plain weights dropped)" + note;
  if (kept_plain) summary += "; " + count_of(kept_plain, "weight keeps", "weights keep") + " a plain copy for other readers";
  return PassResult{true, summary};
}

}  // namespace kiln
