// Execution planning: shapes, liveness, the arena layout and each node's kernel (plan.h).
#include "runtime/plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "formats/infer.h"
#include "formats/memory.h"
#include "formats/op_schema.h"
#include "formats/ops/flops.h"
#include "formats/serialize.h"
#include "formats/summary.h"

namespace kiln {

std::string output_name(const Graph& g, const Node& n, size_t i) {
  std::string s = "output " + std::to_string(i);
  if (i < n.outputs.size() && n.outputs[i] != kNoValue) s += " '" + g.value(n.outputs[i]).name + "'";
  return s;
}

namespace {

// Lifetimes [begin, end] (node indices) of the values placed in an arena so far, to find those
// that overlap a new one. A value overlaps [b, e] when it is alive at b or begins within
// (b, e]: a segment tree over node indices answers the first (a value is stored at the
// O(log n) tree nodes that tile its lifetime, so those alive at b lie on b's root-to-leaf
// path), an ordered map of beginnings the second. Memory is O(values x log nodes).
class Lifetimes {
 public:
  explicit Lifetimes(size_t nodes) : n_(std::max<size_t>(nodes, 1)), tree_(4 * n_) {}

  void add(uint32_t id, int32_t begin, int32_t end) {
    insert(1, 0, n_ - 1, static_cast<size_t>(begin), static_cast<size_t>(end), id);
    begins_.emplace(begin, id);
  }

  /// Calls f(id) once for each value whose lifetime overlaps [begin, end].
  template <class F>
  void overlapping(int32_t begin, int32_t end, F&& f) const {
    const size_t b = static_cast<size_t>(begin);
    for (size_t node = 1, lo = 0, hi = n_ - 1;;) {
      for (uint32_t id : tree_[node]) f(id);
      if (lo == hi) break;
      const size_t mid = (lo + hi) / 2;
      if (b <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
    for (auto it = begins_.upper_bound(begin); it != begins_.end() && it->first <= end; ++it) f(it->second);
  }

 private:
  void insert(size_t node, size_t lo, size_t hi, size_t b, size_t e, uint32_t id) {
    if (e < lo || hi < b) return;
    if (b <= lo && hi <= e) {
      tree_[node].push_back(id);
      return;
    }
    const size_t mid = (lo + hi) / 2;
    insert(2 * node, lo, mid, b, e, id);
    insert(2 * node + 1, mid + 1, hi, b, e, id);
  }

  size_t n_;
  std::vector<std::vector<uint32_t>> tree_;
  std::multimap<int32_t, uint32_t> begins_;
};

// Packed constants (a compiled model's weights) stay packed only where every reader may read
// the layout: at one of its op's prepack inputs, when the kernel recorded for it takes packed
// inputs, or (a model compiled without its input shapes records none) some implementation of
// the op does; build_plan unpacks them later for a chosen kernel that does not. Everything else
// (the reference kernels, other readers and slots, subgraph captures, graph outputs) gets the
// plain tensor, unpacked once here, before inference or any kernel sees it.
void unpack_for_readers(Graph& g, const PlanOptions& options) {
  std::vector<char> plain(g.values.size(), 0);
  bool any = false;
  for (const Value& v : g.values) any |= v.constant.is_packed();
  if (!any) return;
  for (const Node& node : g.nodes) {
    const OpSchema* schema = core_ops().find(node.domain, node.op);
    bool reads_packed = false;
    if (!options.reference && schema)
      for (const KernelImpl& impl : options.kernels.find(node.op, options.target.device))
        if (node.kernel.name.empty() || impl.name == node.kernel.name) reads_packed = reads_packed || impl.reads_packed;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (node.inputs[i] == kNoValue) continue;
      const bool slot = reads_packed && std::count(schema->traits.prepack_inputs.begin(), schema->traits.prepack_inputs.end(),
                                                   static_cast<int>(i)) > 0;
      if (!slot) plain[static_cast<size_t>(node.inputs[i])] = 1;
    }
    for (ValueId v : node.captures) plain[static_cast<size_t>(v)] = 1;
  }
  for (ValueId o : g.outputs) plain[static_cast<size_t>(o)] = 1;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (plain[v] && g.values[v].constant.is_packed()) g.values[v].constant = unpack(g.values[v].constant);
}

}  // namespace

void node_query_operands(const ExecutionPlan& plan, size_t n, std::vector<InferInput>& inputs, std::vector<InferOutput>& outputs) {
  const Node& node = plan.bound.nodes[n];
  inputs.assign(node.inputs.size(), InferInput{});
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == kNoValue) continue;
    const size_t v = static_cast<size_t>(node.inputs[i]);
    const Value& val = plan.bound.values[v];
    const Tensor* data = val.is_constant() ? &val.constant : plan.known[v].defined() ? &plan.known[v] : nullptr;
    inputs[i] = InferInput{val.dtype, val.shape, data};
  }
  outputs.assign(node.outputs.size(), InferOutput{});
  for (size_t i = 0; i < node.outputs.size(); ++i)
    if (node.outputs[i] != kNoValue) outputs[i] = InferOutput{plan.bound.value(node.outputs[i]).dtype, plan.bound.value(node.outputs[i]).shape, Tensor()};
}

Result<ExecutionPlan> build_plan(const Graph& graph, std::span<const std::vector<int64_t>> input_shapes,
                                 const PlanOptions& options) {
  if (input_shapes.size() != graph.inputs.size())
    return internal_error("", "planning for " + std::to_string(input_shapes.size()) + " input shapes, the graph has " +
                                  std::to_string(graph.inputs.size()) + " inputs");
  ExecutionPlan plan;
  // Infer every shape with the bound input shapes on a copy of the graph.
  Graph& bound = plan.bound;
  bound = graph;
  for (size_t i = 0; i < input_shapes.size(); ++i) bound.value(bound.inputs[i]).shape = Shape::of(input_shapes[i]);
  unpack_for_readers(bound, options);
  std::vector<char> needs_data;
  KILN_ASSIGN_OR_RETURN(plan.known, infer_graph(bound, InferOptions{.overwrite = true, .needs_data = &needs_data}));
  needs_data.resize(bound.nodes.size());
  plan.known.resize(bound.values.size());

  const size_t nv = bound.values.size(), nn = bound.nodes.size();
  std::vector<int32_t>& first = plan.first_use;
  std::vector<int32_t>& last = plan.last_use;
  first.assign(nv, -1);
  last.assign(nv, -1);
  for (size_t n = 0; n < nn; ++n) {
    const auto ni = static_cast<int32_t>(n);
    for (ValueId o : bound.nodes[n].outputs)
      if (o >= 0 && first[static_cast<size_t>(o)] < 0) first[static_cast<size_t>(o)] = ni;
    for (ValueId in : bound.nodes[n].inputs)
      if (in >= 0) last[static_cast<size_t>(in)] = ni;
    // Values a subgraph captures live until the node that owns the subgraph ran.
    for (ValueId v : bound.nodes[n].captures) last[static_cast<size_t>(v)] = std::max(last[static_cast<size_t>(v)], ni);
  }
  std::vector<char> is_output(nv, 0), is_input(nv, 0);
  for (ValueId o : bound.outputs) is_output[static_cast<size_t>(o)] = 1;
  for (ValueId i : bound.inputs) is_input[static_cast<size_t>(i)] = 1;

  // A node infers again on each run when the plan cannot know an output's type and shape, or
  // cannot trust them: its inference wanted data it did not have (shape operands computed from
  // data, NonZero, checks of data against shapes), or the op has no inference (custom domains).
  plan.reinfer.assign(nn, 0);
  for (size_t n = 0; n < nn; ++n) {
    const Node& node = bound.nodes[n];
    bool known = core_ops().find(node.domain, node.op) != nullptr && !needs_data[n];
    for (ValueId o : node.outputs)
      if (o >= 0) known = known && bound.value(o).shape.is_concrete() && bound.value(o).dtype != DType::undefined;
    plan.reinfer[n] = !known;
  }

  // Each node's kernel, chosen and prepared on the shapes and constant data the plan knows.
  std::vector<InferInput> q_in;
  std::vector<InferOutput> q_out;
  plan.kernels.reserve(nn);
  for (size_t n = 0; n < nn && options.choose_kernels; ++n) {
    const Node& node = bound.nodes[n];
    node_query_operands(plan, n, q_in, q_out);
    // The caller's node: kernels may keep a reference to it, and `bound` is the plan's copy.
    KernelQuery q{graph.nodes[n], graph, options.target, q_in, q_out, options.packed_weights};
    KILN_ASSIGN_OR_RETURN(KernelSelection sel, options.kernels.select(q, options.reference));
    // A weight stored packed for whichever kernel a shape picks, where the one picked reads it
    // plain: plain from here on, for it and for the runs.
    if (!sel.reads_packed) {
      bool unpacked = false;
      for (ValueId in : node.inputs)
        if (in >= 0 && bound.value(in).constant.is_packed()) {
          const Tensor& packed = bound.value(in).constant;
          bound.value(in).constant = options.packed_weights ? options.packed_weights->unpacked(packed) : unpack(packed);
          unpacked = true;
        }
      if (unpacked) node_query_operands(plan, n, q_in, q_out);
    }
    KernelNeeds needs;
    KILN_RETURN_IF_ERROR(sel.kernel->prepare(q, needs));
    // Plain weights the kernel packed into memory of its own: their file pages go back to the
    // page cache now, so that a process holds each weight once (a later read faults them back
    // in). Packed weights are read where they are mapped.
    if (const OpSchema* schema = core_ops().find(node.domain, node.op); schema && sel.name != kReferenceKernel)
      for (int slot : schema->traits.prepack_inputs) {
        const auto i = static_cast<size_t>(slot);
        const Tensor* w = i < q_in.size() ? q_in[i].value : nullptr;
        if (w && bound.value(node.inputs[i]).is_constant() && !w->is_packed() && w->nbytes() >= (1u << 20)) release_file_pages(*w);
      }
    plan.workspace_bytes = std::max(plan.workspace_bytes, needs.workspace_bytes);
    plan.kernels.push_back(
        PlannedKernel{std::move(sel.kernel), std::move(sel.name), std::move(sel.declined), needs.workspace_bytes, sel.needs_isa});
  }

  // The arena: every intermediate of known shape that is not a graph output.
  MemoryLayout& mem = plan.memory;
  mem.offset.assign(nv, -1);
  mem.bytes.assign(nv, 0);
  auto placed_in_arena = [&](size_t v) {
    return !bound.values[v].is_constant() && first[v] >= 0 && !is_output[v] && !plan.reinfer[static_cast<size_t>(first[v])];
  };
  // Views share their input's place, and so does an output its kernel may write over an input
  // that dies there (Kernel::overwrites_input), and the inputs of a Concat computed in place
  // (below) are parts of its output: `root` is the value whose memory a value is, `delta` where
  // in it (bytes), and a root lives from the first write of any value that is its memory
  // (`begin`) until the last read of any (`end`, grown node by node: a value read after node n
  // is alive after n whichever value's memory it shares).
  std::vector<size_t> root(nv), delta(nv, 0);
  std::vector<int32_t> begin(first), end(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    root[v] = v;
    if (first[v] >= 0) end[v] = std::max(last[v], first[v]);
  }
  auto share = [&](size_t out, size_t in) {
    root[out] = root[in];
    delta[out] = delta[in];
    end[root[in]] = std::max(end[root[in]], end[out]);
  };
  auto plain_bytes = [&](size_t v) { return storage_bytes(bound.values[v].dtype, shape_numel(bound.values[v].shape.concrete())); };
  // What a value of `nbytes` takes in the arena: whole kTensorAlignment units, at least one.
  auto reserved = [](size_t nbytes) { return std::max<size_t>(1, (nbytes + kTensorAlignment - 1) / kTensorAlignment) * kTensorAlignment; };
  // A Concat whose output is its inputs one after the other (every dim before the axis 1), each
  // input whole in the memory its root gives it, no two inputs one memory, each part starting
  // on kTensorAlignment, the output an arena intermediate or a graph output of known shape:
  // every input's memory (with every value sharing it) moves into its part of the output, so
  // its producer writes it there and running the Concat is nothing. A graph output gets its
  // buffer when its first part is written (ExecutionPlan::output_parts) and lives past the
  // run, so nothing writes over a part after it. Not in a reference plan (the oracle).
  std::vector<size_t> parted_outputs;  // graph outputs that in-place Concats made
  auto concat_in_place = [&](size_t n) {
    const Node& node = bound.nodes[n];
    if (options.reference || !node.domain.empty() || node.op != "Concat" || node.outputs.size() != 1 || node.outputs[0] < 0 ||
        plan.reinfer[n])
      return false;
    const auto out = static_cast<size_t>(node.outputs[0]);
    if (!placed_in_arena(out) && !is_output[out]) return false;
    const std::vector<int64_t>& shape = bound.values[out].shape.concrete();
    const auto rank = static_cast<int64_t>(shape.size());
    int64_t axis = node.attr_int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || std::any_of(shape.begin(), shape.begin() + axis, [](int64_t d) { return d != 1; })) return false;
    std::vector<size_t> roots;
    size_t at = 0;
    for (ValueId in : node.inputs) {
      if (in < 0) return false;
      const auto v = static_cast<size_t>(in);
      if (!placed_in_arena(v) || bound.values[v].dtype != bound.values[out].dtype || delta[v] != 0 || at % kTensorAlignment) return false;
      const std::optional<size_t> bytes = plain_bytes(v);
      if (!bytes || plain_bytes(root[v]) != bytes || std::count(roots.begin(), roots.end(), root[v])) return false;
      roots.push_back(root[v]);
      at += *bytes;
    }
    if (plain_bytes(out) != at) return false;
    at = 0;
    for (size_t i = 0; i < roots.size(); ++i) {
      const size_t r = roots[i];
      begin[out] = std::min(begin[out], begin[r]);
      end[out] = std::max(end[out], end[r]);
      for (size_t u = 0; u < nv; ++u)
        if (root[u] == r) root[u] = out, delta[u] += at;
      at += *plain_bytes(r);
    }
    if (is_output[out]) {
      end[out] = static_cast<int32_t>(nn);
      parted_outputs.push_back(out);
    }
    return true;
  };
  plan.views.assign(nn, 0);
  plan.overwrites.assign(nn, 0);
  plan.in_place.assign(nn, 0);
  for (size_t n = 0; n < nn; ++n) {
    const Node& node = bound.nodes[n];
    static const std::set<std::string, std::less<>> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
    const int over = n < plan.kernels.size() && plan.kernels[n].kernel ? plan.kernels[n].kernel->overwrites_input() : -1;
    if (over >= 0 && static_cast<size_t>(over) < node.inputs.size() && !node.outputs.empty()) {
      const ValueId in = node.inputs[static_cast<size_t>(over)], out = node.outputs[0];
      if (in >= 0 && out >= 0 && placed_in_arena(static_cast<size_t>(in)) && placed_in_arena(static_cast<size_t>(out)) &&
          end[root[static_cast<size_t>(in)]] == static_cast<int32_t>(n) && bound.value(in).dtype == bound.value(out).dtype &&
          bound.value(in).shape == bound.value(out).shape &&
          std::count_if(node.inputs.begin(), node.inputs.end(), [&](ValueId v) {  // no other input is its memory
            return v >= 0 && root[static_cast<size_t>(v)] == root[static_cast<size_t>(in)];
          }) == 1) {
        plan.overwrites[n] = 1;
        share(static_cast<size_t>(out), static_cast<size_t>(in));
      }
      continue;
    }
    if (concat_in_place(n)) {
      plan.in_place[n] = 1;
      continue;
    }
    if (!node.domain.empty() || !kViews.count(node.op) || node.inputs.empty() || node.outputs.size() != 1) continue;
    const ValueId in = node.inputs[0], out = node.outputs[0];
    if (in < 0 || out < 0 || !placed_in_arena(static_cast<size_t>(in)) || !placed_in_arena(static_cast<size_t>(out))) continue;
    if (bound.value(in).dtype != bound.value(out).dtype) continue;
    plan.views[n] = 1;
    share(static_cast<size_t>(out), static_cast<size_t>(in));
  }
  struct Item { size_t v; size_t bytes; int32_t begin, end; };
  std::vector<Item> items;
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = bound.values[v];
    if (val.is_constant() || first[v] < 0) continue;
    if (!placed_in_arena(v)) {
      ++mem.dynamic_values;
      continue;
    }
    if (root[v] != v) continue;  // a view, or an output over its input: placed with its root
    const std::optional<size_t> nbytes = plain_bytes(v);
    if (!nbytes) {
      const Node& node = bound.nodes[static_cast<size_t>(first[v])];
      size_t i = static_cast<size_t>(std::find(node.outputs.begin(), node.outputs.end(), static_cast<ValueId>(v)) - node.outputs.begin());
      return user_error(node.where(), output_name(bound, node, i) + " of shape " + val.shape.str() + " is too large");
    }
    items.push_back({v, reserved(*nbytes), begin[v], end[v]});
  }
  // Greedy by size: each value takes the lowest offset that no value alive at the same time
  // uses; Lifetimes finds those without visiting every value placed before.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  Lifetimes placed(nn);
  std::vector<std::pair<size_t, size_t>> busy;
  for (uint32_t k = 0; k < items.size(); ++k) {
    const Item& it = items[k];
    busy.clear();
    placed.overlapping(it.begin, it.end, [&](uint32_t p) {
      const size_t b = static_cast<size_t>(mem.offset[items[p].v]);
      busy.emplace_back(b, b + items[p].bytes);
    });
    std::sort(busy.begin(), busy.end());
    size_t off = 0;
    for (auto [b, e] : busy) {
      if (off + it.bytes <= b) break;
      off = std::max(off, e);
    }
    mem.offset[it.v] = static_cast<int64_t>(off);
    mem.bytes[it.v] = it.bytes;
    mem.arena_bytes = std::max(mem.arena_bytes, off + it.bytes);
    mem.unshared_bytes += it.bytes;
    placed.add(k, it.begin, it.end);
  }
  mem.planned_values = items.size();
  for (size_t v = 0; v < nv; ++v)
    if (root[v] != v && mem.offset[root[v]] >= 0) {  // not a part of a graph output
      mem.offset[v] = mem.offset[root[v]] + static_cast<int64_t>(delta[v]);
      mem.bytes[v] = reserved(plain_bytes(v).value_or(0));
    }
  for (size_t out : parted_outputs) {
    ExecutionPlan::OutputParts parts{static_cast<ValueId>(out), begin[out], {}};
    for (size_t v = 0; v < nv; ++v)
      if (v != out && root[v] == out) parts.parts.emplace_back(static_cast<ValueId>(v), delta[v]);
    plan.output_parts.push_back(std::move(parts));
  }

  int64_t flops = 0;
  for (const Node& node : plan.bound.nodes) flops = flops::saturate(CheckedInt(flops) + node_flops(node, plan.bound));
  const bool tiny = flops < kSerialFlops && plan.memory.unshared_bytes < kSerialBytes;
  plan.threads = tiny ? 1 : std::max(1, options.target.threads);
  return plan;
}

}  // namespace kiln
