// Helpers for the compile passes' tests: building small graphs, running them on the reference
// kernels, and checking that a pass keeps the graph valid and its outputs the same.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "formats/infer.h"
#include "formats/text.h"
#include "formats/verify.h"
#include "runtime/session.h"
#include "tests/unit/op_test_util.h"

namespace kiln::testing {

/// Builds graphs of named values: inputs and constants given, the other types and shapes inferred.
struct GraphBuilder {
  Model m;
  Graph& g = m.graph;
  ValueId input(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::f32) {
    ValueId v = g.add_value(name, dtype, Shape::of(shape));
    g.inputs.push_back(v);
    return v;
  }
  ValueId input(const std::string& name, Shape shape, DType dtype = DType::f32) {
    ValueId v = g.add_value(name, dtype, std::move(shape));
    g.inputs.push_back(v);
    return v;
  }
  ValueId constant(const std::string& name, Tensor t) { return g.add_constant(name, std::move(t)); }
  ValueId scalar(const std::string& name, float v) { return constant(name, make<float>({}, {v})); }
  ValueId op(const std::string& name, const std::string& op, std::vector<ValueId> in, std::vector<Attribute> attrs = {}) {
    ValueId out = g.add_value(name, DType::undefined);
    Node n = testing::node(name, op, std::move(in), {out});
    for (Attribute& a : attrs) n.set_attr(a.name, a.value);
    g.add_node(std::move(n));
    return out;
  }
  /// A node of `count` outputs (name_0, name_1, ...).
  std::vector<ValueId> ops(const std::string& name, const std::string& op, std::vector<ValueId> in, size_t count,
                           std::vector<Attribute> attrs = {}) {
    std::vector<ValueId> out;
    for (size_t k = 0; k < count; ++k) out.push_back(g.add_value(name + "_" + std::to_string(k), DType::undefined));
    Node n = testing::node(name, op, std::move(in), out);
    for (Attribute& a : attrs) n.set_attr(a.name, a.value);
    g.add_node(std::move(n));
    return out;
  }
  Model done(std::vector<ValueId> outputs) {
    g.outputs = std::move(outputs);
    auto known = infer_graph(g);
    EXPECT_TRUE(known.ok()) << known.error().message();
    Status v = verify_model(m);
    EXPECT_TRUE(v.ok()) << v.error().message();
    return m;
  }
};

/// A CPU whose int8 products lower_int8 lowers (VNNI): this one where it has VNNI, otherwise the
/// `--target avx512-vnni` preset, whose compiled models a session here refuses (runs_here).
inline CpuFeatures int8_target() {
  const CpuFeatures& host = CpuFeatures::host();
  return host.avx512_vnni ? host : *CpuFeatures::named("avx512-vnni");
}

/// Whether this CPU runs a model compiled for the CPU its target record names.
inline bool runs_here(const Model& m) { return !m.target || CpuFeatures::host().missing(m.target->isa).empty(); }

/// Runs on the reference kernels.
inline std::vector<Tensor> run_reference(const Model& m, const std::vector<Tensor>& inputs) {
  auto s = Session::create(m, SessionOptions{.reference = true});
  EXPECT_TRUE(s.ok()) << s.error().message();
  if (!s.ok()) return {};
  auto r = (*s)->run(inputs);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return r.ok() ? *r : std::vector<Tensor>{};
}

/// ‖a − b‖₂ / ‖b‖₂, where NaN matches NaN (and nothing else).
inline double relative_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t k = 0; k < a.numel(); ++k) {
    if (std::isnan(a.as_double(k)) && std::isnan(b.as_double(k))) continue;
    const double d = a.as_double(k) - b.as_double(k);
    num += d * d;
    den += b.as_double(k) * b.as_double(k);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

/// Applies `pass` to the model, checks that it still verifies and computes what it did on these
/// inputs (relative L2 per output within `tol`).
inline void expect_same_outputs(Model& m, const std::function<void(Graph&)>& pass, const std::vector<Tensor>& inputs,
                                double tol) {
  const Model before = m;
  pass(m.graph);
  Status v = verify_model(m);
  EXPECT_TRUE(v.ok()) << v.error().message() << "\n" << graph_to_text(m.graph);
  std::vector<Tensor> want = run_reference(before, inputs), got = run_reference(m, inputs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
    EXPECT_LE(relative_l2(got[i], want[i]), tol) << "output " << i;
  }
}

/// The node lines of the graph's text form, unindented.
inline std::string nodes_text(const Graph& g) {
  std::string text = graph_to_text(g), out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  node ", 0) == 0) out += line.substr(2) + "\n";
  return out;
}

}  // namespace kiln::testing
