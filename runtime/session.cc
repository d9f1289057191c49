// Executor and memory planner.
#include "runtime/session.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "formats/huge_pages.h"
#include "formats/infer.h"
#include "formats/memory.h"
#include "formats/op_schema.h"
#include "formats/serialize.h"
#include "runtime/plan.h"
#include "runtime/threads.h"

namespace kiln {

namespace {
// Sanitizer builds (KILN_POISON_BUFFERS) fill the arena and each graph output's buffer used again
// with 0xff bytes (NaN as floats, -1 as integers) before kernels write them: a kernel that
// leaves part of an output unwritten then fails the tests instead of passing on zeroed pages.
#ifdef KILN_POISON_BUFFERS
constexpr bool kPoisonBuffers = true;
#else
constexpr bool kPoisonBuffers = false;
#endif
}  // namespace

/// Scratch memory shared by kernels that run one after another: the largest size any of them
/// asked for in prepare.
struct Session::Workspace {
  std::shared_ptr<void> data;
  size_t bytes = 0;
  MemoryCharge charge;

  std::span<std::byte> span() { return {static_cast<std::byte*>(data.get()), bytes}; }
  Status allocate(size_t size, const std::string& what) {
    if (size == 0) return {};
    size = (size + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    if (std::shared_ptr<HugePages> region = huge_pages_if_quick(size)) {  // read and written on every run, as the arena
      data = std::shared_ptr<void>(region, region->data());
      charge = MemoryCharge();  // the region's own
      bytes = size;
      return {};
    }
    if (!try_charge_memory(size))
      return user_error("", what + " needs " + format_bytes(size) + " of kernel workspace with " +
                                format_bytes(memory_in_use()) + " already in use, past the memory limit of " +
                                format_bytes(memory_limit()) + " (--max-memory)");
    charge = MemoryCharge::adopt(size);
    void* p = std::aligned_alloc(kTensorAlignment, size);
    if (!p) return user_error("", "cannot allocate " + format_bytes(size) + " of kernel workspace");
    data = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    bytes = size;
    return {};
  }
};

/// One node of a plan: where its tensors are, and what is left to decide at run time.
struct Session::Step {
  size_t index = 0;                   ///< position in graph.nodes
  Kernel* kernel = nullptr;           ///< owned by the plan
  bool reinfer = false;               ///< output shapes depend on data: infer them on each run
  bool skip = false;                  ///< every output is empty: nothing to compute
  std::vector<const Tensor*> inputs;  ///< into Plan::values; null for omitted optional inputs
  std::vector<Tensor*> outputs;       ///< into Plan::values; omitted ones point into `omitted`
  std::vector<Tensor> omitted;        ///< stand-ins for omitted outputs
  struct Fresh {
    size_t node, output;  ///< whose output it is (messages): graph.nodes[node]'s output `output`
    Tensor* value;        ///< into Plan::values
    DType dtype;
    std::vector<int64_t> shape;
    /// Values that are parts of it (an in-place Concat's inputs, ExecutionPlan::output_parts):
    /// views of the new buffer, made with it at the step that writes the first part.
    struct Part {
      Tensor* value;
      size_t offset;
      DType dtype;
      std::vector<int64_t> shape;
    };
    std::vector<Part> parts;
    /// The buffers the last two runs returned: one is used again once the caller has let go
    /// of it (a caller may hold the previous result while it runs the next), so that a loop
    /// of runs does not allocate, and page-fault in, a new output every time.
    mutable std::array<Tensor, 2> kept;
    mutable size_t next = 0;
  };
  std::vector<Fresh> fresh;           ///< graph outputs of known shape: a buffer each run, made here
  std::vector<ValueId> release;       ///< data-dependent values whose last reader this node is
};

/// The plan of one input-shape signature: every value's tensor (constants, views into the
/// arena, and slots filled on each run for inputs, outputs and data-dependent values) and
/// every node's step.
struct Session::Plan {
  std::shared_ptr<void> arena;  ///< laid out by build_plan (runtime/plan.h)
  MemoryCharge charge;          ///< the arena's share of the memory budget
  std::vector<Tensor> values;
  std::vector<Step> steps;
  std::vector<ValueId> per_run;  ///< values emptied after each run (inputs, outputs, dynamic)
  std::vector<std::unique_ptr<Kernel>> kernels;  ///< per node, chosen on this plan's shapes
  std::vector<NodeKernel> choices;               ///< per node: the kernel's name, who declined
  Workspace workspace;
  int threads = 1;         ///< ExecutionPlan::threads
  uint64_t last_used = 0;  ///< the run that last used it, for evicting the least recent
};

/// The tensors of one graph while it runs. A subgraph's frame starts with its inputs and the
/// enclosing values it captures bound to its stand-ins.
struct Session::Frame {
  const Graph* graph = nullptr;
  std::vector<Tensor>* values = nullptr;  ///< the plan's values, or `own`
  std::vector<Tensor> own;

  Tensor& at(ValueId id) { return (*values)[static_cast<size_t>(id)]; }
  /// The value's tensor, or null when it has not been computed.
  const Tensor* get(ValueId id) { return at(id).defined() ? &at(id) : nullptr; }
};

class Session::Context final : public KernelContext {
 public:
  Context(Session& s, Frame& f, const Node& n, std::span<const Tensor* const> in, std::span<Tensor* const> out,
          std::span<std::byte> workspace)
      : session_(s), frame_(f), node_(n), inputs_(in), outputs_(out), workspace_(workspace) {}
  const Node& node() const override { return node_; }
  size_t num_inputs() const override { return inputs_.size(); }
  bool has_input(size_t i) const override { return i < inputs_.size() && inputs_[i] != nullptr; }
  const Tensor& input(size_t i) const override { return *inputs_[i]; }
  size_t num_outputs() const override { return outputs_.size(); }
  Tensor& output(size_t i) override {
    if (!outputs_[i]->defined() && i < node_.outputs.size() && node_.outputs[i] != kNoValue) throw OutputNotAllocated(i);
    return *outputs_[i];
  }
  bool output_allocated(size_t i) const override { return i < outputs_.size() && outputs_[i]->defined(); }
  Tensor& allocate_output(size_t i, DType dtype, std::vector<int64_t> shape) override {
    *outputs_[i] = Tensor(dtype, std::move(shape));
    return *outputs_[i];
  }
  Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs) override {
    if (session_.options_.max_subgraph_runs > 0 && ++session_.subgraph_runs_ > session_.options_.max_subgraph_runs)
      return error("more than " + std::to_string(session_.options_.max_subgraph_runs) +
                   " subgraph executions in one run (the caller's limit)");
    return session_.run_subgraph(g, std::move(inputs), frame_, node_);
  }
  std::span<std::byte> workspace() override { return workspace_; }

 private:
  Session& session_;
  Frame& frame_;
  const Node& node_;
  std::span<const Tensor* const> inputs_;
  std::span<Tensor* const> outputs_;
  std::span<std::byte> workspace_;
};

namespace {

// "1x3x224x224, 1x128" for messages.
std::string signature_str(const std::vector<std::vector<int64_t>>& shapes) {
  std::string s;
  for (const auto& shape : shapes) s += (s.empty() ? "" : ", ") + shape_str(shape);
  return s;
}

// What the graph itself records of a node's inputs and outputs, for kernels chosen without a
// plan (subgraph bodies): stored types and shapes, constants' data.
void stored_query_parts(const Graph& g, const Node& n, std::vector<InferInput>& in, std::vector<InferOutput>& out) {
  in.assign(n.inputs.size(), InferInput{});
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] == kNoValue) continue;
    const Value& v = g.value(n.inputs[i]);
    in[i] = InferInput{v.dtype, v.shape, v.is_constant() ? &v.constant : nullptr};
  }
  out.assign(n.outputs.size(), InferOutput{});
  for (size_t i = 0; i < n.outputs.size(); ++i)
    if (n.outputs[i] != kNoValue) out[i] = InferOutput{g.value(n.outputs[i]).dtype, g.value(n.outputs[i]).shape, Tensor()};
}

// Kernels for every node of the subgraphs of `g`'s nodes, recursively, chosen and prepared
// once on the shapes the subgraphs record; `workspace` grows to the largest they ask for. The
// top-level graph's nodes only must have an implementation here: their kernels are chosen per
// plan, on concrete shapes.
Status create_subgraph_kernels(const Graph& g, const SessionOptions& opt, const KernelRegistry& reg, bool top,
                               std::map<const Graph*, std::vector<std::unique_ptr<Kernel>>>& sub, size_t& workspace) {
  std::vector<InferInput> in;
  std::vector<InferOutput> out;
  std::vector<std::unique_ptr<Kernel>>* kernels = top ? nullptr : &sub[&g];
  for (const Node& n : g.nodes) {
    if (top) {
      if (reg.find(n.qualified_op(), opt.target.device).empty())
        return user_error(n.where(), "no kernel for op '" + n.qualified_op() + "' on " + opt.target.device);
    } else {
      stored_query_parts(g, n, in, out);
      KernelQuery q{n, g, opt.target, in, out};
      KILN_ASSIGN_OR_RETURN(KernelSelection sel, reg.select(q, opt.reference));
      KernelNeeds needs;
      KILN_RETURN_IF_ERROR(sel.kernel->prepare(q, needs));
      workspace = std::max(workspace, needs.workspace_bytes);
      kernels->push_back(std::move(sel.kernel));
    }
    for (const Attribute& a : n.attrs)
      if (const auto* sg = std::get_if<std::shared_ptr<Graph>>(&a.value))
        if (!sub.count(sg->get())) KILN_RETURN_IF_ERROR(create_subgraph_kernels(**sg, opt, reg, false, sub, workspace));
  }
  return {};
}

// A new buffer for output i of node n; sizes past int64, the memory budget or the machine are
// user errors about the node.
Status allocate_output(const Graph& g, const Node& n, size_t i, DType dtype, std::vector<int64_t> shape, Tensor& out) {
  if (!storage_bytes(dtype, shape_numel(shape)))
    return user_error(n.where(), output_name(g, n, i) + " of shape " + shape_str(shape) + " is too large");
  try {
    out = Tensor(dtype, shape);
  } catch (const MemoryLimitExceeded& ex) {
    return user_error(n.where(), output_name(g, n, i) + " of shape " + shape_str(shape) + " (" +
                                     std::string(dtype_name(dtype)) + ") " + ex.what());
  } catch (const std::bad_alloc&) {
    return user_error(n.where(), output_name(g, n, i) + " of shape " + shape_str(shape) + ": " + std::string(kMachineOutOfMemory));
  }
  return {};
}

// Runs a kernel; what it throws becomes an error about the node (`inferred` describes output
// i's inferred shape for the message when the kernel asks for an output it must size itself).
template <class Inferred>
Status run_kernel(Kernel& kernel, KernelContext& ctx, const Graph& g, const Node& n, Inferred inferred) {
  try {
    return kernel.run(ctx);
  } catch (const OutputNotAllocated& ex) {
    return user_error(n.where(), "cannot compute the shape of " + output_name(g, n, ex.index()) +
                                     " from its inputs (inferred " + inferred(ex.index()) + ")");
  } catch (const MemoryLimitExceeded& ex) {
    return user_error(n.where(), std::string("a buffer ") + ex.what());
  } catch (const std::bad_alloc&) {
    return user_error(n.where(), kMachineOutOfMemory);
  } catch (const std::length_error&) {
    // A buffer sized by the data past what the address space can hold.
    return user_error(n.where(), "a buffer sized by the input data is too large to allocate");
  } catch (const std::exception& ex) {
    return internal_error(n.where(), std::string("the kernel threw: ") + ex.what());
  }
}

}  // namespace

Session::Session(const Model& model, SessionOptions options, HugePageWeights placed)
    : placed_(std::move(placed)),
      graph_(placed_.graph ? *placed_.graph : model.graph),
      options_(std::move(options)),
      subgraph_workspace_(std::make_unique<Workspace>()) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::create(const Model& model, SessionOptions options) {
  // The kernels' low-precision packed weights (not the reference kernels', which read them
  // unpacked) move out of the mapped file onto huge pages, in a copy of the graph.
  HugePageWeights placed = options.reference ? HugePageWeights{} : weights_on_huge_pages(model.graph, transparent_huge_pages());
  std::unique_ptr<Session> s(new Session(model, std::move(options), std::move(placed)));
  if (s->options_.target.threads < 1 || s->options_.target.threads > kMaxThreads)
    return user_error("", "the thread count must be from 1 to " + std::to_string(kMaxThreads) + ", not " +
                              std::to_string(s->options_.target.threads));
  // A compiled model's kernels may use every ISA feature it was compiled for; the oracle's
  // reference kernels use none.
  if (model.target && !s->options_.reference) {
    if (model.target->device != s->options_.target.device)
      return user_error("", "the model was compiled for device '" + model.target->device + "', not '" +
                                s->options_.target.device + "'");
    std::vector<std::string> missing = s->options_.target.cpu.missing(model.target->isa);
    if (!missing.empty()) {
      std::string list;
      for (const std::string& f : missing) list += (list.empty() ? "" : ", ") + f;
      return user_error("", "the model was compiled for a CPU with " + list +
                                ", which this CPU lacks (compile it again with --target host, or run it with --reference)");
    }
  }
  use_threads(s->options_.target.threads);
  const KernelRegistry& reg = s->options_.kernels ? *s->options_.kernels : default_kernels();
  size_t workspace = 0;
  KILN_RETURN_IF_ERROR(create_subgraph_kernels(s->graph_, s->options_, reg, true, s->subgraph_kernels_, workspace));
  KILN_RETURN_IF_ERROR(s->subgraph_workspace_->allocate(workspace, "the model's subgraphs"));
  // A compiled model names the input shapes it was planned for: plan them now, as ONNX Runtime
  // prepares at session creation, so that the first run costs what every run does.
  if (model.memory_plan && model.memory_plan->input_shapes.size() == s->graph_.inputs.size())
    KILN_RETURN_IF_ERROR(s->plan_for(model.memory_plan->input_shapes).status());
  return s;
}

std::span<const NodeKernel> Session::kernels() const {
  if (!last_plan_) return {};
  return last_plan_->choices;
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

Result<Session::Plan*> Session::plan_for(std::vector<std::vector<int64_t>> key) {
  ++runs_;
  if (auto it = plans_.find(key); it != plans_.end()) {
    it->second->last_used = runs_;
    return it->second.get();
  }

  const KernelRegistry& reg = options_.kernels ? *options_.kernels : default_kernels();
  use_threads(options_.target.threads);  // kernels are created for the target's threads
  PlanOptions plan_options{options_.target, reg, options_.reference};
  plan_options.packed_weights = &packed_weights_;
  KILN_ASSIGN_OR_RETURN(ExecutionPlan ep, build_plan(graph_, key, plan_options));
  const Graph& bound = ep.bound;
  const size_t nv = bound.values.size(), nn = bound.nodes.size();
  const std::vector<int32_t>& first = ep.first_use;
  const std::vector<int32_t>& last = ep.last_use;
  const std::vector<char>& reinfer = ep.reinfer;
  const MemoryLayout& mem = ep.memory;
  std::vector<char> is_output(nv, 0), is_input(nv, 0);
  for (ValueId o : bound.outputs) is_output[static_cast<size_t>(o)] = 1;
  for (ValueId i : bound.inputs) is_input[static_cast<size_t>(i)] = 1;

  // Every value's tensor: constants, views into the arena, or a slot filled on each run.
  auto plan = std::make_unique<Plan>();
  plan->threads = ep.threads;
  plan->values.resize(nv);
  // The arena on 2 MiB pages where the machine gives them quickly (formats/huge_pages.h): its
  // activations are written and read on every run, and from 4 KiB pages YOLO took 1.03x its time
  // at one thread, ViT-S/16 and EfficientNet-B0 1.02x, ResNet-50 1.01x, and ResNet-50 1.02x at
  // two (eight alternated rounds; the rest within 0.5 %).
  const size_t arena = mem.arena_bytes;
  if (std::shared_ptr<HugePages> region = huge_pages_if_quick(arena)) {
    if (kPoisonBuffers) std::memset(region->data(), 0xff, arena);
    plan->arena = std::shared_ptr<void>(region, region->data());  // charged by the region
  } else if (arena) {
    if (!try_charge_memory(arena))
      return user_error("", "the memory arena for input shapes " + signature_str(key) + " needs " + format_bytes(arena) +
                                " with " + format_bytes(memory_in_use()) + " already in use, past the memory limit of " +
                                format_bytes(memory_limit()) + " (--max-memory)");
    plan->charge = MemoryCharge::adopt(arena);
    void* p = std::aligned_alloc(kTensorAlignment, arena);
    if (!p) return user_error("", "cannot allocate the " + format_bytes(arena) + " memory arena");
    if (kPoisonBuffers) std::memset(p, 0xff, arena);
    plan->arena = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = bound.values[v];
    if (val.is_constant()) plan->values[v] = val.constant;  // the plan's: unpacked where a reader needs it
    else if (mem.offset[v] >= 0)
      plan->values[v] = Tensor::view(val.dtype, val.shape.concrete(), static_cast<char*>(plan->arena.get()) + mem.offset[v], plan->arena);
    else if (is_input[v] || first[v] >= 0) plan->per_run.push_back(static_cast<ValueId>(v));
  }
  for (size_t n = 0; n < ep.kernels.size(); ++n) {
    PlannedKernel& k = ep.kernels[n];
    std::string label = ep.views[n]      ? "a view of its input's memory: nothing to run"
                        : ep.in_place[n] ? "its inputs were computed in their parts of its output: nothing to run"
                        : k.kernel       ? k.kernel->label()
                                         : std::string();
    plan->kernels.push_back(std::move(k.kernel));
    plan->choices.push_back(NodeKernel{std::move(k.name), std::move(label), std::move(k.declined), ep.views[n] || ep.in_place[n]});
  }
  KILN_RETURN_IF_ERROR(plan->workspace.allocate(ep.workspace_bytes, "input shapes " + signature_str(key)));

  // The steps: pointers into the values, buffers to make on each run, values to let go.
  plan->steps.resize(nn);
  size_t reinferred = 0;
  for (size_t n = 0; n < nn; ++n) {
    const Node& node = bound.nodes[n];
    Step& st = plan->steps[n];
    st.index = n;
    st.kernel = plan->kernels[n].get();
    st.reinfer = reinfer[n];
    reinferred += st.reinfer;
    for (ValueId in : node.inputs) {
      if (in < 0) {
        st.inputs.push_back(nullptr);
        continue;
      }
      const size_t v = static_cast<size_t>(in);
      if (!is_input[v] && !bound.values[v].is_constant() && !(first[v] >= 0 && static_cast<size_t>(first[v]) < n))
        return internal_error(node.where(), "input '" + bound.values[v].name + "' is computed by no earlier node");
      st.inputs.push_back(&plan->values[v]);
    }
    st.omitted.resize(node.outputs.size());
    bool all_empty = !node.outputs.empty();
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      ValueId o = node.outputs[i];
      st.outputs.push_back(o >= 0 ? &plan->values[static_cast<size_t>(o)] : &st.omitted[i]);
      if (o < 0 || st.reinfer) continue;
      const Value& val = bound.value(o);
      all_empty = all_empty && shape_numel(val.shape.concrete()) == 0;
      if (is_output[static_cast<size_t>(o)] && !ep.in_place[n]) st.fresh.push_back({n, i, st.outputs[i], val.dtype, val.shape.concrete(), {}});
    }
    // A node whose outputs are all empty has nothing to compute; skipping it also keeps kernels
    // from sizing per-axis tables by a huge dim of an empty tensor (0 x 2^62).
    st.skip = (!st.reinfer && all_empty) || ep.views[n] || ep.in_place[n];
  }
  for (const ExecutionPlan::OutputParts& op : ep.output_parts) {
    const auto out = static_cast<size_t>(op.output);
    const Node& node = bound.nodes[static_cast<size_t>(first[out])];
    const auto i = static_cast<size_t>(std::find(node.outputs.begin(), node.outputs.end(), op.output) - node.outputs.begin());
    Step::Fresh f{static_cast<size_t>(first[out]), i, &plan->values[out], bound.values[out].dtype, bound.values[out].shape.concrete(), {}};
    for (auto [v, offset] : op.parts) {
      const Value& val = bound.values[static_cast<size_t>(v)];
      f.parts.push_back({&plan->values[static_cast<size_t>(v)], offset, val.dtype, val.shape.concrete()});
    }
    plan->steps[static_cast<size_t>(op.step)].fresh.push_back(std::move(f));
  }
  for (size_t v = 0; v < nv; ++v)
    if (first[v] >= 0 && !is_output[v] && reinfer[static_cast<size_t>(first[v])])
      plan->steps[static_cast<size_t>(std::max(last[v], first[v]))].release.push_back(static_cast<ValueId>(v));

  // Keep the most recently used plans only: each holds an arena and prepared kernels.
  if (plans_.size() >= kMaxCachedPlans) {
    auto oldest = std::min_element(plans_.begin(), plans_.end(),
                                   [](const auto& a, const auto& b) { return a.second->last_used < b.second->last_used; });
    if (oldest->second.get() == last_plan_) last_plan_ = nullptr;
    plans_.erase(oldest);
    packed_weights_.drop_unused();
  }
  plan->last_used = runs_;
  ++planned_;
  stats_ = MemoryPlanStats{arena,   mem.unshared_bytes, ep.workspace_bytes, mem.planned_values, mem.dynamic_values,
                           reinferred, planned_, plans_.size() + 1};
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

int Session::run_threads() const { return last_plan_ ? last_plan_->threads : options_.target.threads; }

Result<std::vector<Tensor>> Session::run(const std::vector<Tensor>& inputs) {
  FlushDenormals ftz(!options_.reference);
  KILN_RETURN_IF_ERROR(bind_symbols(inputs).status());
  subgraph_runs_ = 0;
  std::vector<std::vector<int64_t>> key;
  key.reserve(inputs.size());
  for (const Tensor& t : inputs) key.push_back(t.shape());
  KILN_ASSIGN_OR_RETURN(Plan* plan, plan_for(std::move(key)));
  last_plan_ = plan;
  use_threads(plan->threads);  // created for the target's threads, run on the plan's (the same, or 1)
  for (size_t i = 0; i < inputs.size(); ++i) plan->values[static_cast<size_t>(graph_.inputs[i])] = inputs[i];
  Status status = run_planned(*plan);
  std::vector<Tensor> out;
  // Outputs are never in the arena, so the caller may keep them across runs.
  if (status.ok())
    for (ValueId id : graph_.outputs) out.push_back(plan->values[static_cast<size_t>(id)]);
  for (ValueId v : plan->per_run) plan->values[static_cast<size_t>(v)] = Tensor();
  if (!status.ok()) return status.error();
  return out;
}

Status Session::run_planned(Plan& plan) {
  Frame frame;
  frame.graph = &graph_;
  frame.values = &plan.values;
  for (const Step& st : plan.steps) KILN_RETURN_IF_ERROR(run_step(st, frame, plan));
  return {};
}

Status Session::run_step(const Step& st, Frame& frame, Plan& plan) {
  const Node& node = graph_.nodes[st.index];
  Kernel& kernel = *st.kernel;
  const NodeEvent event{st.index, node, plan.choices[st.index].name, st.inputs, st.outputs};
  Status status;
  if (st.reinfer) {
    if (observer_) observer_->on_node_begin(event);
    status = infer_and_run(graph_, st.index, frame, kernel, st.inputs, st.outputs, plan.workspace.span());
  } else {
    for (const Step::Fresh& f : st.fresh) {
      Tensor& out = *f.value;
      auto free = std::find_if(f.kept.begin(), f.kept.end(), [](const Tensor& t) { return t.sole_owner(); });
      if (free != f.kept.end()) {  // as it is: a kernel writes all of its outputs, arena or not
        if (kPoisonBuffers) std::memset(free->raw(), 0xff, free->nbytes());
        out = *free;
      } else {
        KILN_RETURN_IF_ERROR(allocate_output(graph_, graph_.nodes[f.node], f.output, f.dtype, f.shape, out));
        f.kept[f.next] = out;
        f.next ^= 1;
      }
      for (const Step::Fresh::Part& p : f.parts) *p.value = out.part(p.offset, p.dtype, p.shape);
    }
    if (observer_) observer_->on_node_begin(event);
    if (!st.skip) {
      Context ctx(*this, frame, node, st.inputs, st.outputs, plan.workspace.span());
      status = run_kernel(kernel, ctx, graph_, node, [&](size_t i) { return shape_str(st.outputs[i]->shape()); });
    }
  }
  if (observer_) observer_->on_node_end(event);
  for (ValueId v : st.release) plan.values[static_cast<size_t>(v)] = Tensor();
  return status;
}

Status Session::infer_and_run(const Graph& graph, size_t index, Frame& frame, Kernel& kernel,
                              std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs,
                              std::span<std::byte> workspace) {
  const Node& node = graph.nodes[index];
  const OpSchema* schema = core_ops().find(node.domain, node.op);
  std::vector<InferOutput> expected;
  if (schema) {
    std::vector<InferInput> infer_in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i]) infer_in[i] = InferInput{inputs[i]->dtype(), Shape::of(inputs[i]->shape()), inputs[i]};
    InferContext ictx(node, std::move(infer_in));
    // The same checks as infer_node's: types the op does not take never reach its kernel.
    KILN_RETURN_IF_ERROR(check_input_types(*schema, ictx));
    KILN_RETURN_IF_ERROR(schema->infer(ictx));
    expected = std::move(ictx.outputs());
    for (size_t i = 0; i < outputs.size() && i < expected.size(); ++i) {
      const InferOutput& e = expected[i];
      if (node.outputs[i] == kNoValue || e.dtype == DType::undefined || !e.shape.is_concrete()) continue;
      KILN_RETURN_IF_ERROR(allocate_output(graph, node, i, e.dtype, e.shape.concrete(), *outputs[i]));
    }
  }
  // A node whose outputs are all empty has nothing to compute (see plan_for).
  bool all_empty = !outputs.empty();
  for (size_t i = 0; i < outputs.size() && all_empty; ++i)
    all_empty = node.outputs[i] == kNoValue || (outputs[i]->defined() && outputs[i]->numel() == 0);
  if (!all_empty) {
    Context ctx(*this, frame, node, inputs, outputs, workspace);
    KILN_RETURN_IF_ERROR(run_kernel(kernel, ctx, graph, node, [&](size_t i) {
      return i < expected.size() ? expected[i].shape.str() : std::string("?");
    }));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (node.outputs[i] == kNoValue) continue;
    if (!outputs[i]->defined()) return internal_error(node.where(), "kernel did not produce output " + std::to_string(i));
    if (i < expected.size() && expected[i].dtype != DType::undefined && outputs[i]->dtype() != expected[i].dtype)
      return internal_error(node.where(), "kernel produced " + std::string(dtype_name(outputs[i]->dtype())) +
                                              " for output " + std::to_string(i) + " but inference said " +
                                              std::string(dtype_name(expected[i].dtype)));
  }
  return {};
}

Result<std::vector<Tensor>> Session::run_subgraph(const Graph& g, std::vector<Tensor> inputs, Frame& parent,
                                                  const Node& owner) {
  if (inputs.size() != g.inputs.size())
    return internal_error(owner.where(), "subgraph takes " + std::to_string(g.inputs.size()) + " inputs, got " +
                                             std::to_string(inputs.size()));
  if (g.captures.size() != owner.captures.size())
    return internal_error(owner.where(), "subgraph binds " + std::to_string(g.captures.size()) +
                                             " captured values but its node captures " +
                                             std::to_string(owner.captures.size()));
  Frame frame;
  frame.graph = &g;
  frame.own.resize(g.values.size());
  frame.values = &frame.own;
  for (size_t i = 0; i < inputs.size(); ++i) frame.own[static_cast<size_t>(g.inputs[i])] = std::move(inputs[i]);
  for (size_t i = 0; i < g.captures.size(); ++i) {
    if (g.captures[i] == kNoValue) continue;
    const Tensor* t = parent.get(owner.captures[i]);
    if (!t)
      return internal_error(owner.where(), "captured value '" + parent.graph->value(owner.captures[i]).name +
                                               "' has not been computed");
    frame.own[static_cast<size_t>(g.captures[i])] = *t;
  }
  auto it = subgraph_kernels_.find(&g);
  if (it == subgraph_kernels_.end()) return internal_error("", "subgraph has no prepared kernels");
  KILN_RETURN_IF_ERROR(execute(g, frame, it->second));
  std::vector<Tensor> out;
  for (ValueId id : g.outputs) {
    const Tensor* t = frame.get(id);
    if (!t) return user_error("value '" + g.value(id).name + "'", "subgraph output was not computed");
    out.push_back(*t);
  }
  return out;
}

// Subgraph bodies run unplanned: each node infers its outputs from the tensors at hand.
Status Session::execute(const Graph& graph, Frame& frame, const std::vector<std::unique_ptr<Kernel>>& kernels) {
  for (size_t v = 0; v < graph.values.size(); ++v)
    if (graph.values[v].is_constant()) frame.own[v] = graph.values[v].constant;
  std::vector<const Tensor*> in;
  std::vector<Tensor> out;
  std::vector<Tensor*> out_ptr;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    in.assign(node.inputs.size(), nullptr);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId id = node.inputs[i];
      if (id == kNoValue) continue;
      in[i] = frame.get(id);
      if (!in[i]) return internal_error(node.where(), "input '" + graph.value(id).name + "' has not been computed");
    }
    out.assign(node.outputs.size(), Tensor());
    out_ptr.clear();
    for (Tensor& t : out) out_ptr.push_back(&t);
    KILN_RETURN_IF_ERROR(infer_and_run(graph, n, frame, *kernels[n], in, out_ptr, subgraph_workspace_->span()));
    for (size_t i = 0; i < out.size(); ++i)
      if (node.outputs[i] != kNoValue) frame.own[static_cast<size_t>(node.outputs[i])] = std::move(out[i]);
  }
  return {};
}

}  // namespace kiln
