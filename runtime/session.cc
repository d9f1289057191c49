// Executor and memory planner.
#include "runtime/session.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "formats/infer.h"
#include "formats/memory.h"
#include "formats/op_schema.h"

namespace kiln {

/// Arena placement of the intermediate values for one input-shape signature.
struct Session::Plan {
  std::vector<int64_t> offset;  ///< per value: byte offset in the arena, or -1 when not planned
  std::vector<size_t> bytes;    ///< per value: planned size
  std::shared_ptr<void> arena;
  size_t arena_bytes = 0;
  MemoryCharge charge;          ///< the arena's share of the memory budget
};

/// The tensors of one graph while it runs; subgraph frames point to their enclosing frame.
struct Session::Frame {
  const Graph* graph = nullptr;
  std::vector<Tensor> values;
  Frame* parent = nullptr;
  std::unordered_map<std::string, ValueId> by_name;  // filled lazily for outer-scope lookups

  const Tensor* lookup(ValueId id) {
    if (values[static_cast<size_t>(id)].defined()) return &values[static_cast<size_t>(id)];
    const std::string& name = graph->value(id).name;
    for (Frame* f = parent; f; f = f->parent) {
      if (f->by_name.empty())
        for (size_t i = 0; i < f->graph->values.size(); ++i) f->by_name.emplace(f->graph->values[i].name, static_cast<ValueId>(i));
      auto it = f->by_name.find(name);
      if (it != f->by_name.end() && f->values[static_cast<size_t>(it->second)].defined())
        return &f->values[static_cast<size_t>(it->second)];
    }
    return nullptr;
  }
};

class Session::Context final : public KernelContext {
 public:
  Context(Session& s, Frame& f, const Node& n, std::vector<const Tensor*> in, std::vector<Tensor>& out)
      : session_(s), frame_(f), node_(n), inputs_(std::move(in)), outputs_(out) {}
  const Node& node() const override { return node_; }
  size_t num_inputs() const override { return inputs_.size(); }
  bool has_input(size_t i) const override { return i < inputs_.size() && inputs_[i] != nullptr; }
  const Tensor& input(size_t i) const override { return *inputs_[i]; }
  size_t num_outputs() const override { return outputs_.size(); }
  Tensor& output(size_t i) override {
    if (!outputs_[i].defined() && i < node_.outputs.size() && node_.outputs[i] != kNoValue) throw OutputNotAllocated(i);
    return outputs_[i];
  }
  bool output_allocated(size_t i) const override { return i < outputs_.size() && outputs_[i].defined(); }
  Tensor& allocate_output(size_t i, DType dtype, std::vector<int64_t> shape) override {
    outputs_[i] = Tensor(dtype, std::move(shape));
    return outputs_[i];
  }
  Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs) override {
    if (session_.options_.max_subgraph_runs > 0 && ++session_.subgraph_runs_ > session_.options_.max_subgraph_runs)
      return error("more than " + std::to_string(session_.options_.max_subgraph_runs) +
                   " subgraph executions in one run (the caller's limit)");
    return session_.run_subgraph(g, std::move(inputs), &frame_);
  }

 private:
  Session& session_;
  Frame& frame_;
  const Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor>& outputs_;
};

namespace {

// "1x3x224x224, 1x128" for messages.
std::string signature_str(const std::vector<std::vector<int64_t>>& shapes) {
  std::string s;
  for (const auto& shape : shapes) s += (s.empty() ? "" : ", ") + shape_str(shape);
  return s;
}

// "output 0 'y'" for messages.
std::string output_name(const Graph& g, const Node& n, size_t i) {
  std::string s = "output " + std::to_string(i);
  if (i < n.outputs.size() && n.outputs[i] != kNoValue) s += " '" + g.value(n.outputs[i]).name + "'";
  return s;
}

// Kernels for every node of a graph and, recursively, of its subgraphs.
Status create_kernels(const Graph& g, const SessionOptions& opt, std::vector<std::unique_ptr<Kernel>>& out,
                      std::vector<std::string>* names,
                      std::map<const Graph*, std::vector<std::unique_ptr<Kernel>>>& sub) {
  const KernelRegistry& reg = opt.kernels ? *opt.kernels : default_kernels();
  for (const Node& n : g.nodes) {
    std::string chosen;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> k, reg.select(n, g, opt.target, &chosen));
    out.push_back(std::move(k));
    if (names) names->push_back(chosen);
    for (const Attribute& a : n.attrs)
      if (const auto* sg = std::get_if<std::shared_ptr<Graph>>(&a.value)) {
        auto& v = sub[sg->get()];
        if (v.empty()) KILN_RETURN_IF_ERROR(create_kernels(**sg, opt, v, nullptr, sub));
      }
  }
  return {};
}

}  // namespace

Session::Session(const Model& model, SessionOptions options) : graph_(model.graph), options_(std::move(options)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::create(const Model& model, SessionOptions options) {
  std::unique_ptr<Session> s(new Session(model, std::move(options)));
  KILN_RETURN_IF_ERROR(create_kernels(s->graph_, s->options_, s->kernels_, &s->kernel_names_, s->subgraph_kernels_));
  return s;
}

Result<std::map<std::string, int64_t>> Session::bind_symbols(const std::vector<Tensor>& inputs) const {
  std::map<std::string, int64_t> bound;
  std::map<std::string, std::string> bound_by;
  if (inputs.size() != graph_.inputs.size())
    return user_error("", "the model has " + std::to_string(graph_.inputs.size()) + " inputs but " +
                              std::to_string(inputs.size()) + " were given");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = graph_.value(graph_.inputs[i]);
    const Tensor& t = inputs[i];
    std::string where = "input '" + v.name + "'";
    if (!t.defined()) return user_error(where, "no data was given");
    if (t.dtype() != v.dtype)
      return user_error(where, "expected " + std::string(dtype_name(v.dtype)) + " but got " +
                                   std::string(dtype_name(t.dtype())));
    if (!v.shape.rank_known) continue;
    if (t.rank() != v.shape.rank())
      return user_error(where, "expected shape " + v.shape.str() + " (rank " + std::to_string(v.shape.rank()) +
                                   ") but got " + shape_str(t.shape()));
    for (size_t d = 0; d < v.shape.dims.size(); ++d) {
      const Dim& dim = v.shape.dims[d];
      int64_t got = t.shape()[d];
      if (dim.is_known() && dim.value != got)
        return user_error(where, "expected shape " + v.shape.str() + " but got " + shape_str(t.shape()));
      if (dim.is_symbolic()) {
        auto [it, fresh] = bound.emplace(dim.symbol, got);
        if (!fresh && it->second != got)
          return user_error(where, "dim '" + dim.symbol + "' is " + std::to_string(got) + " here but " +
                                       std::to_string(it->second) + " in " + bound_by[dim.symbol]);
        if (fresh) bound_by[dim.symbol] = where;
      }
    }
  }
  return bound;
}

Result<const Session::Plan*> Session::plan_for(const std::vector<Tensor>& inputs) {
  std::vector<std::vector<int64_t>> key;
  for (const Tensor& t : inputs) key.push_back(t.shape());
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  // Infer every shape with the bound input shapes on a copy of the graph.
  Graph bound = graph_;
  for (size_t i = 0; i < inputs.size(); ++i) bound.value(bound.inputs[i]).shape = Shape::of(inputs[i].shape());
  KILN_RETURN_IF_ERROR(infer_graph(bound, InferOptions{.overwrite = true}).status());

  const size_t nv = bound.values.size();
  std::vector<int32_t> first(nv, -1), last(nv, -1);
  for (size_t n = 0; n < bound.nodes.size(); ++n) {
    for (ValueId o : bound.nodes[n].outputs) if (o >= 0 && first[static_cast<size_t>(o)] < 0) first[static_cast<size_t>(o)] = static_cast<int32_t>(n);
    for (ValueId in : bound.nodes[n].inputs) if (in >= 0) last[static_cast<size_t>(in)] = static_cast<int32_t>(n);
    // Values a subgraph reads from this scope live until the node that owns the subgraph ran.
    for (const Attribute& a : bound.nodes[n].attrs)
      if (std::holds_alternative<std::shared_ptr<Graph>>(a.value))
        for (size_t v = 0; v < nv; ++v) if (first[v] >= 0 || bound.values[v].constant.defined()) last[v] = std::max<int32_t>(last[v], static_cast<int32_t>(n));
  }
  std::vector<char> is_output(nv, 0);
  for (ValueId o : bound.outputs) is_output[static_cast<size_t>(o)] = 1;

  auto plan = std::make_unique<Plan>();
  plan->offset.assign(nv, -1);
  plan->bytes.assign(nv, 0);
  struct Item { size_t v; size_t bytes; int32_t begin, end; };
  std::vector<Item> items;
  size_t dynamic = 0;
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = bound.values[v];
    if (first[v] < 0 || val.is_constant()) continue;
    if (is_output[v] || !val.shape.is_concrete() || val.dtype == DType::undefined) { ++dynamic; continue; }
    int64_t numel = shape_numel(val.shape.concrete());
    if (numel < 0) { ++dynamic; continue; }
    size_t bytes = (static_cast<size_t>(numel) * dtype_size(val.dtype) + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    if (bytes == 0) bytes = kTensorAlignment;
    items.push_back({v, bytes, first[v], std::max(last[v], first[v])});
  }
  // Greedy by size: each value takes the lowest offset that no value alive at the same time uses.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  std::vector<const Item*> placed;
  size_t arena = 0, unshared = 0;
  for (const Item& it : items) {
    std::vector<std::pair<size_t, size_t>> busy;
    for (const Item* p : placed)
      if (!(p->end < it.begin || it.end < p->begin))
        busy.emplace_back(static_cast<size_t>(plan->offset[p->v]), static_cast<size_t>(plan->offset[p->v]) + p->bytes);
    std::sort(busy.begin(), busy.end());
    size_t off = 0;
    for (auto [b, e] : busy) {
      if (off + it.bytes <= b) break;
      off = std::max(off, e);
    }
    plan->offset[it.v] = static_cast<int64_t>(off);
    plan->bytes[it.v] = it.bytes;
    arena = std::max(arena, off + it.bytes);
    unshared += it.bytes;
    placed.push_back(&it);
  }
  plan->arena_bytes = arena;
  if (arena) {
    if (!try_charge_memory(arena))
      return user_error("", "the memory arena for input shapes " + signature_str(key) + " needs " + format_bytes(arena) +
                                " with " + format_bytes(memory_in_use()) + " already in use, past the memory limit of " +
                                format_bytes(memory_limit()) + " (--max-memory)");
    plan->charge = MemoryCharge::adopt(arena);
    void* p = std::aligned_alloc(kTensorAlignment, arena);
    if (!p) return user_error("", "cannot allocate the " + format_bytes(arena) + " memory arena");
    plan->arena = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  stats_ = MemoryPlanStats{arena, unshared, items.size(), dynamic, plans_.size() + 1};
  return plans_.emplace(std::move(key), std::move(plan)).first->second.get();
}

Result<std::vector<Tensor>> Session::run(const std::map<std::string, Tensor>& named) {
  std::vector<Tensor> inputs;
  for (ValueId id : graph_.inputs) {
    const std::string& name = graph_.value(id).name;
    auto it = named.find(name);
    if (it == named.end()) return user_error("input '" + name + "'", "no data was given");
    inputs.push_back(it->second);
  }
  for (const auto& entry : named) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture those
    bool known = std::any_of(graph_.inputs.begin(), graph_.inputs.end(),
                             [&](ValueId id) { return graph_.value(id).name == name; });
    if (!known) return user_error("input '" + name + "'", "the model has no input of this name");
  }
  return run(inputs);
}

Result<std::vector<Tensor>> Session::run(const std::vector<Tensor>& inputs) {
  KILN_RETURN_IF_ERROR(bind_symbols(inputs).status());
  subgraph_runs_ = 0;
  KILN_ASSIGN_OR_RETURN(const Plan* plan, plan_for(inputs));
  Frame frame;
  frame.graph = &graph_;
  frame.values.resize(graph_.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) frame.values[static_cast<size_t>(graph_.inputs[i])] = inputs[i];
  KILN_RETURN_IF_ERROR(execute(graph_, frame, kernels_, plan));
  std::vector<Tensor> out;
  // Outputs are never in the arena, so the caller may keep them across runs.
  for (ValueId id : graph_.outputs) out.push_back(frame.values[static_cast<size_t>(id)]);
  return out;
}

Result<std::vector<Tensor>> Session::run_subgraph(const Graph& g, std::vector<Tensor> inputs, Frame* parent) {
  if (inputs.size() != g.inputs.size())
    return internal_error("", "subgraph takes " + std::to_string(g.inputs.size()) + " inputs, got " +
                                  std::to_string(inputs.size()));
  Frame frame;
  frame.graph = &g;
  frame.parent = parent;
  frame.values.resize(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) frame.values[static_cast<size_t>(g.inputs[i])] = std::move(inputs[i]);
  auto it = subgraph_kernels_.find(&g);
  if (it == subgraph_kernels_.end()) return internal_error("", "subgraph has no prepared kernels");
  KILN_RETURN_IF_ERROR(execute(g, frame, it->second, nullptr));
  std::vector<Tensor> out;
  for (ValueId id : g.outputs) {
    const Tensor* t = frame.lookup(id);
    if (!t) return user_error("value '" + g.value(id).name + "'", "subgraph output was not computed");
    out.push_back(*t);
  }
  return out;
}

Status Session::execute(const Graph& graph, Frame& frame, const std::vector<std::unique_ptr<Kernel>>& kernels,
                        const Plan* plan) {
  for (size_t v = 0; v < graph.values.size(); ++v)
    if (graph.values[v].is_constant()) frame.values[v] = graph.values[v].constant;

  // Last use of each value, so intermediates are released (or their arena space reused).
  std::vector<int32_t> last(graph.values.size(), INT32_MAX);
  if (plan) {
    std::fill(last.begin(), last.end(), -1);
    for (size_t n = 0; n < graph.nodes.size(); ++n)
      for (ValueId in : graph.nodes[n].inputs) if (in >= 0) last[static_cast<size_t>(in)] = static_cast<int32_t>(n);
    for (size_t n = 0; n < graph.nodes.size(); ++n)
      for (const Attribute& a : graph.nodes[n].attrs)
        if (std::holds_alternative<std::shared_ptr<Graph>>(a.value))
          for (int32_t& l : last) l = std::max(l, static_cast<int32_t>(n));
    for (ValueId o : graph.outputs) last[static_cast<size_t>(o)] = INT32_MAX;
    for (ValueId i : graph.inputs) last[static_cast<size_t>(i)] = INT32_MAX;
  }

  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const OpSchema* schema = core_ops().find(node.domain, node.op);
    std::vector<const Tensor*> in(node.inputs.size(), nullptr);
    std::vector<InferInput> infer_in(node.inputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId id = node.inputs[i];
      if (id == kNoValue) continue;
      const Tensor* t = frame.lookup(id);
      if (!t) return internal_error(node.where(), "input '" + graph.value(id).name + "' has not been computed");
      in[i] = t;
      infer_in[i] = InferInput{t->dtype(), Shape::of(t->shape()), t};
    }
    std::vector<Tensor> out(node.outputs.size());
    std::vector<InferOutput> expected;
    if (schema) {
      InferContext ictx(node, std::move(infer_in));
      KILN_RETURN_IF_ERROR(schema->infer(ictx));
      expected = std::move(ictx.outputs());
      for (size_t i = 0; i < out.size() && i < expected.size(); ++i) {
        const InferOutput& e = expected[i];
        if (node.outputs[i] == kNoValue || e.dtype == DType::undefined || !e.shape.is_concrete()) continue;
        std::vector<int64_t> shape = e.shape.concrete();
        size_t v = static_cast<size_t>(node.outputs[i]);
        std::optional<size_t> bytes = checked_bytes(shape_numel(shape), dtype_size(e.dtype));
        if (!bytes)
          return user_error(node.where(), output_name(graph, node, i) + " of shape " + e.shape.str() + " is too large");
        if (plan && plan->offset[v] >= 0 && *bytes <= plan->bytes[v]) {
          out[i] = Tensor::view(e.dtype, std::move(shape), static_cast<char*>(plan->arena.get()) + plan->offset[v], plan->arena);
        } else {
          try {
            out[i] = Tensor(e.dtype, std::move(shape));
          } catch (const MemoryLimitExceeded& ex) {
            return user_error(node.where(), output_name(graph, node, i) + " of shape " + e.shape.str() + " (" +
                                                std::string(dtype_name(e.dtype)) + ") " + ex.what());
          } catch (const std::bad_alloc&) {
            return user_error(node.where(), output_name(graph, node, i) + " of shape " + e.shape.str() +
                                                ": " + std::string(kMachineOutOfMemory));
          }
        }
      }
    }
    // A node whose outputs are all empty has nothing to compute; skipping it also keeps kernels
    // from sizing per-axis tables by a huge dim of an empty tensor (0 x 2^62).
    bool all_empty = !out.empty();
    for (size_t i = 0; i < out.size() && all_empty; ++i)
      all_empty = node.outputs[i] == kNoValue || (out[i].defined() && out[i].numel() == 0);
    Context ctx(*this, frame, node, std::move(in), out);
    if (!all_empty) {
      try {
        KILN_RETURN_IF_ERROR(kernels[n]->run(ctx));
      } catch (const OutputNotAllocated& ex) {
        std::string inferred = ex.index() < expected.size() ? expected[ex.index()].shape.str() : "?";
        return user_error(node.where(), "cannot compute the shape of " + output_name(graph, node, ex.index()) +
                                            " from its inputs (inferred " + inferred + ")");
      } catch (const MemoryLimitExceeded& ex) {
        return user_error(node.where(), std::string("a buffer ") + ex.what());
      } catch (const std::bad_alloc&) {
        return user_error(node.where(), kMachineOutOfMemory);
      } catch (const std::length_error&) {
        // A buffer sized by the data past what the address space can hold.
        return user_error(node.where(), "a buffer sized by the input data is too large to allocate");
      } catch (const std::exception& ex) {
        return internal_error(node.where(), std::string("the kernel threw: ") + ex.what());
      }
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (node.outputs[i] == kNoValue) continue;
      if (!out[i].defined()) return internal_error(node.where(), "kernel did not produce output " + std::to_string(i));
      if (i < expected.size() && expected[i].dtype != DType::undefined && out[i].dtype() != expected[i].dtype)
        return internal_error(node.where(), "kernel produced " + std::string(dtype_name(out[i].dtype())) +
                                                " for output " + std::to_string(i) + " but inference said " +
                                                std::string(dtype_name(expected[i].dtype)));
      frame.values[static_cast<size_t>(node.outputs[i])] = std::move(out[i]);
    }
    if (plan)
      for (ValueId id : node.inputs)
        if (id >= 0 && last[static_cast<size_t>(id)] == static_cast<int32_t>(n) && !graph.value(id).is_constant())
          frame.values[static_cast<size_t>(id)] = Tensor();
  }
  return {};
}

}  // namespace kiln
