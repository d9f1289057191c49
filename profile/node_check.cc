#include "profile/node_check.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "formats/npy.h"
#include "profile/profiler.h"
#include "runtime/compare.h"

namespace kiln::profile {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

bool has_subgraph(const Node& n) {
  if (!n.captures.empty()) return true;
  for (const Attribute& a : n.attrs)
    if (std::holds_alternative<std::shared_ptr<Graph>>(a.value)) return true;
  return false;
}

// The int8 ops compile's lower_int8 makes that requantize their result. Their kernels multiply
// by 1/scale where the reference divides, and sum in their own order, so a code at a rounding
// boundary may land one step off: their 8-bit outputs may differ by one step, within the
// relative L2 of low-precision kernels.
bool requantizes(const Node& n) {
  static const std::set<std::string_view> ops = {"QFusedConv", "QFusedMatMul", "QAdd", "QMul", "QGlobalAveragePool", "QLayerNormalization", "QAttention"};
  return n.domain.empty() && ops.count(n.op) > 0;
}

// Runs the node's reference kernel right after its own, on the same inputs, and compares.
class Checker final : public ExecutionObserver {
 public:
  Checker(const Model& model, std::span<const NodeKernel> kernels, const CheckOptions& options)
      : model_(model), kernels_(kernels), options_(options) {}

  // An input whose memory the node's output takes (Kernel::overwrites_input) is gone by the
  // node's end: a copy of it first, for the reference kernel.
  void on_node_begin(const NodeEvent& e) override {
    overwritten_.clear();
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      const Tensor* t = e.inputs[i];
      if (!t || !t->defined() || t->nbytes() == 0) continue;
      const bool shared = std::any_of(e.outputs.begin(), e.outputs.end(), [&](const Tensor* o) { return o && o->defined() && o->raw() == t->raw(); });
      if (!shared) continue;
      Tensor copy(t->dtype(), t->shape());
      std::memcpy(copy.raw(), t->raw(), t->nbytes());
      overwritten_.emplace(i, std::move(copy));
    }
  }

  void on_node_end(const NodeEvent& e) override {
    if (!failure_.ok()) return;
    const Node& node = e.node;
    NodeCheck c;
    c.index = e.index;
    c.name = node.name;
    c.op = node.qualified_op();
    c.kernel = e.index < kernels_.size() ? kernels_[e.index].name : std::string(e.kernel);
    if (has_subgraph(node)) {
      c.why = "has subgraphs: their nodes run inside it, on the kernels the whole model's run checks";
      checks_.push_back(std::move(c));
      return;
    }
    if (c.kernel == "ref") {
      c.why = "runs on its reference kernel already";
      checks_.push_back(std::move(c));
      return;
    }
    std::vector<std::vector<int64_t>> shapes;
    std::vector<DType> dtypes;
    NamedTensors named;  // the non-constant inputs, in the one-node model's input order
    std::vector<Tensor> feed;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId id = node.inputs[i];
      const Tensor* t = i < e.inputs.size() ? e.inputs[i] : nullptr;
      if (auto it = overwritten_.find(i); it != overwritten_.end()) t = &it->second;
      shapes.push_back(t && t->defined() ? t->shape() : std::vector<int64_t>{});
      dtypes.push_back(t && t->defined() ? t->dtype() : DType::undefined);
      if (id == kNoValue || model_.graph.value(id).is_constant()) continue;
      const std::string& name = model_.graph.value(id).name;
      if (std::any_of(named.begin(), named.end(), [&](const auto& n) { return n.first == name; })) continue;
      named.emplace_back(name, t ? *t : Tensor());
      feed.push_back(named.back().second);
    }
    auto sub = single_node_model(model_, e.index, &shapes);
    if (!sub.ok()) {
      failure_ = sub.status();
      return;
    }
    SessionOptions so;
    so.reference = true;
    auto ref_session = Session::create(*sub, so);
    if (!ref_session.ok()) {
      failure_ = ref_session.status();
      return;
    }
    auto ref = (*ref_session)->run(feed);
    if (!ref.ok()) {
      failure_ = ref.status();
      return;
    }
    c.checked = true;
    c.tolerance = kernel_precision(c.kernel, dtypes) != "f32" ? options_.low_precision_tolerance : options_.tolerance;
    kiln::CompareOptions exact;  // runtime/compare.h's, not profile::CompareOptions (the --compare gate's)
    exact.atol = 0;
    exact.rtol = 0;
    for (size_t o = 0, r = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o] == kNoValue) continue;
      const Tensor* fast = o < e.outputs.size() ? e.outputs[o] : nullptr;
      if (!fast || r >= ref->size()) break;
      const Tensor& expected = (*ref)[r++];
      CompareResult cr = compare_tensors(*fast, expected, exact);
      const bool structural = cr.kind == CompareResult::Kind::dtype_mismatch || cr.kind == CompareResult::Kind::shape_mismatch;
      const bool one_step = requantizes(node) && (expected.dtype() == DType::u8 || expected.dtype() == DType::i8);
      const bool bad = structural || (is_float(expected.dtype()) ? !(cr.rel_l2_error <= c.tolerance)
                                      : one_step              ? !(cr.max_abs_error <= 1 && cr.rel_l2_error <= c.tolerance)
                                                              : !cr.pass);
      if (bad && one_step && !structural) {
        std::ostringstream what;
        what << cr.mismatches << " of " << cr.numel << " codes differ, by up to " << cr.max_abs_error << " steps (one allowed), relative l2 error "
             << cr.rel_l2_error << "; worst at " << index_str(cr.worst_index) << ": got " << cr.worst_actual << ", expected " << cr.worst_expected;
        cr.summary = what.str();
      }
      if (!structural) {
        c.rel_l2 = std::max(c.rel_l2, cr.rel_l2_error);
        c.max_abs = std::max(c.max_abs, cr.max_abs_error);
      }
      if (bad && c.pass) {
        c.pass = false;
        c.detail = "output '" + model_.graph.value(node.outputs[o]).name + "': " + cr.summary;
      }
    }
    if (!c.pass) {
      Status saved = save_repro(c, node, named);
      if (!saved.ok()) failure_ = saved;
    }
    checks_.push_back(std::move(c));
  }

  Status failure() const { return failure_; }
  std::vector<NodeCheck> take() { return std::move(checks_); }

 private:
  Status save_repro(NodeCheck& c, const Node& node, const NamedTensors& named) {
    std::error_code ec;
    fs::create_directories(options_.repro_dir, ec);
    if (ec) return Error{ErrorKind::user, options_.repro_dir, "", "cannot create folder: " + ec.message()};
    const std::string file = (fs::path(options_.repro_dir) / (percent_encode_file_name(node.name) + ".npz")).string();
    KILN_RETURN_IF_ERROR(write_npz_file(file, named));
    c.repro = "kiln run " + options_.model_file + " --node '" + node.name + "' --inputs " + file;
    return {};
  }

  const Model& model_;
  std::span<const NodeKernel> kernels_;
  const CheckOptions& options_;
  std::vector<NodeCheck> checks_;
  std::map<size_t, Tensor> overwritten_;  ///< input index → its copy, this node's
  Status failure_;
};

// Hashes every node's outputs, one vector per run.
class Hasher final : public ExecutionObserver {
 public:
  void on_node_end(const NodeEvent& e) override {
    size_t h = e.index;
    for (const Tensor* t : e.outputs) {
      if (!t || !t->defined()) continue;
      const std::string_view bytes(static_cast<const char*>(t->raw()), t->nbytes());
      h = h * 1099511628211ull ^ std::hash<std::string_view>{}(bytes);
    }
    hashes.emplace_back(e.index, h);
  }
  std::vector<std::pair<size_t, size_t>> hashes;
};

}  // namespace

Result<size_t> find_node(const Model& model, const std::string& name, const std::string& file) {
  for (size_t i = 0; i < model.graph.nodes.size(); ++i)
    if (model.graph.nodes[i].name == name) return i;
  return Error{ErrorKind::user, file, "node '" + name + "'", "the model has no node of this name (kiln inspect --text lists them)"};
}

Result<Model> single_node_model(const Model& model, size_t index, const std::vector<std::vector<int64_t>>* shapes) {
  const Node& node = model.graph.nodes.at(index);
  if (has_subgraph(node))
    return user_error(node.where(), "has subgraphs (If, Loop, Scan): run the whole model to reproduce it");
  Model out;
  out.stage = model.stage;
  out.provenance = model.provenance;
  out.metadata = model.metadata;
  out.target = model.target;
  Graph& g = out.graph;
  std::map<ValueId, ValueId> remap;
  Node copy = node;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId id = node.inputs[i];
    if (id == kNoValue) continue;
    if (auto it = remap.find(id); it != remap.end()) {
      copy.inputs[i] = it->second;
      continue;
    }
    Value v = model.graph.value(id);
    if (!v.is_constant() && shapes && i < shapes->size()) v.shape = Shape::of((*shapes)[i]);
    const bool constant = v.is_constant();
    const ValueId nid = g.add_value(std::move(v));
    if (!constant) g.inputs.push_back(nid);
    remap[id] = nid;
    copy.inputs[i] = nid;
  }
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const ValueId id = node.outputs[o];
    if (id == kNoValue) continue;
    const Value& v = model.graph.value(id);
    const ValueId nid = g.add_value(Value{v.name, v.dtype, Shape(), {}, v.quant});
    g.outputs.push_back(nid);
    copy.outputs[o] = nid;
  }
  g.add_node(std::move(copy));
  return out;
}

Result<std::vector<NodeCheck>> check_nodes(Session& session, const Model& model, const std::vector<Tensor>& inputs,
                                           const CheckOptions& options) {
  auto warm = session.run(inputs);  // plans the shapes, so that the kernels are known
  if (!warm.ok()) return warm.error();
  Checker checker(model, session.kernels(), options);
  session.set_observer(&checker);
  auto r = session.run(inputs);
  session.set_observer(nullptr);
  if (!r.ok()) return r.error();
  KILN_RETURN_IF_ERROR(checker.failure());
  return checker.take();
}

Result<BitwiseCheck> check_bitwise(Session& session, const std::vector<Tensor>& inputs) {
  Hasher first, second;
  session.set_observer(&first);
  auto a = session.run(inputs);
  session.set_observer(&second);
  auto b = a.ok() ? session.run(inputs) : a;
  session.set_observer(nullptr);
  if (!a.ok()) return a.error();
  if (!b.ok()) return b.error();
  BitwiseCheck out;
  const auto kernels = session.kernels();
  for (size_t i = 0; i < first.hashes.size() && i < second.hashes.size(); ++i)
    if (first.hashes[i] != second.hashes[i]) {
      const size_t n = first.hashes[i].first;
      out.identical = false;
      out.first_node = session.graph().nodes[n].name;
      out.first_kernel = n < kernels.size() ? kernels[n].name : "";
      break;
    }
  const Graph& g = session.graph();
  for (size_t o = 0; o < a->size() && o < b->size(); ++o) {
    const Tensor &x = (*a)[o], &y = (*b)[o];
    const bool same = x.dtype() == y.dtype() && x.shape() == y.shape() && x.nbytes() == y.nbytes() &&
                      std::string_view(static_cast<const char*>(x.raw()), x.nbytes()) ==
                          std::string_view(static_cast<const char*>(y.raw()), y.nbytes());
    if (!same) {
      out.identical = false;
      out.outputs_differ.push_back(g.value(g.outputs[o]).name);
    }
  }
  return out;
}

json to_json(const std::vector<NodeCheck>& checks, const CheckOptions& options) {
  json nodes = json::array();
  bool failed = false;
  for (const NodeCheck& c : checks) {
    json j = {{"index", c.index}, {"name", c.name}, {"op", c.op}, {"kernel", c.kernel}, {"checked", c.checked}};
    if (!c.checked) {
      j["why"] = c.why;
    } else {
      j["rel_l2"] = c.rel_l2;
      j["max_abs"] = c.max_abs;
      j["tolerance"] = c.tolerance;
      j["pass"] = c.pass;
      if (!c.pass) {
        j["detail"] = c.detail;
        j["repro"] = c.repro;
      }
    }
    failed = failed || !c.pass;
    nodes.push_back(j);
  }
  return {{"tolerance", options.tolerance}, {"low_precision_tolerance", options.low_precision_tolerance}, {"nodes", nodes},
          {"failed", failed}};
}

json to_json(const BitwiseCheck& b) {
  json j = {{"identical", b.identical}, {"outputs_differ", b.outputs_differ}};
  if (!b.first_node.empty()) j["first_node"] = {{"name", b.first_node}, {"kernel", b.first_kernel}};
  return j;
}

}  // namespace kiln::profile
