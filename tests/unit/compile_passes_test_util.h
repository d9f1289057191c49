// The compile passes' tests' shared helpers (compile_passes_test.cc, compile_channels_last_test.cc):
// building small graphs by name, running one pass, the compact text form, and comparing a
// graph's outputs before and after a pass on the reference kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "compile/pass.h"
#include "formats/infer.h"
#include "formats/text.h"
#include "formats/verify.h"
#include "tests/unit/compile_test_util.h"

namespace kiln::passes_test {

using testing::attr;
using testing::make;
using testing::relative_l2;
using testing::run_reference;
using testing::to_bf16;
using testing::to_f16;

// ---- building graphs --------------------------------------------------------------------

/// A small model under construction: inputs, constants and nodes by name.
class Builder {
 public:
  ValueId input(const std::string& name, Shape shape, DType dtype = DType::f32) {
    ValueId v = g().add_value(name, dtype, std::move(shape));
    g().inputs.push_back(v);
    return v;
  }
  ValueId input(const std::string& name, std::vector<int64_t> shape) { return input(name, Shape::of(shape)); }
  ValueId constant(const std::string& name, Tensor t) { return g().add_constant(name, std::move(t)); }
  /// Adds a node with one output named `out`; returns the output.
  ValueId op(const std::string& name, const std::string& op, std::vector<ValueId> in, const std::string& out,
             std::vector<Attribute> attrs = {}) {
    ValueId o = g().add_value(out, DType::undefined);
    Node n = testing::node(name, op, std::move(in), {o});
    for (Attribute& a : attrs) n.set_attr(a.name, std::move(a.value));
    n.sources = {name};
    g().add_node(std::move(n));
    return o;
  }
  /// Adds a Split with one output per name; returns the outputs.
  std::vector<ValueId> split(const std::string& name, std::vector<ValueId> in, const std::vector<std::string>& outs,
                             std::vector<Attribute> attrs) {
    std::vector<ValueId> o;
    for (const std::string& out : outs) o.push_back(g().add_value(out, DType::undefined));
    Node n = testing::node(name, "Split", std::move(in), o);
    for (Attribute& a : attrs) n.set_attr(a.name, std::move(a.value));
    n.sources = {name};
    g().add_node(std::move(n));
    return o;
  }
  void output(ValueId v) { g().outputs.push_back(v); }
  /// The model with every type and shape inferred; the test fails if it does not verify.
  Model done() {
    auto r = infer_graph(g());
    EXPECT_TRUE(r.ok()) << r.error().message();
    Status v = verify_model(m_);
    EXPECT_TRUE(v.ok()) << v.error().message();
    return m_;
  }
  Graph& g() { return m_.graph; }

 private:
  Model m_;
};

inline Shape sym_shape(std::vector<Dim> dims) { return Shape(std::move(dims)); }

/// Uniform random f32 in [lo, hi): never all zeros, odd sizes welcome.
inline Tensor uniform_f32(std::vector<int64_t> shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(DType::f32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// ---- running passes and comparing ----------------------------------------------------------

/// Runs one pass by its table name; the model must still verify afterwards.
inline PassResult run_pass(const std::string& name, Model& m, std::map<std::string, Shape> shapes = {}) {
  const PassInfo* pass = find_pass(name);
  EXPECT_NE(pass, nullptr) << name;
  if (!pass) return {};
  Target target;
  PassContext ctx{target, std::move(shapes)};
  Result<PassResult> r = pass->run(m, ctx);
  EXPECT_TRUE(r.ok()) << r.error().message();
  if (!r.ok()) return {};
  Status v = verify_model(m);
  EXPECT_TRUE(v.ok()) << name << " left an invalid graph: " << v.error().message();
  return *r;
}

/// The graph's text form with constants shown by name, dtype and shape only: folded weights'
/// bytes are checked numerically, not by their CRC.
inline std::string compact(const Graph& g) {
  std::istringstream in(graph_to_text(g));
  std::string line, out;
  while (std::getline(in, line)) {
    if (size_t crc = line.find(" crc32="); line.rfind("  const ", 0) == 0 && crc != std::string::npos) line.resize(crc);
    // A kernel's parameters (a GEMM template's blocking) follow the machine's caches: elided.
    if (size_t k = line.find(" kernel="); k != std::string::npos)
      if (size_t open = line.find('{', k), close = line.find('}', k); open != std::string::npos && close > open + 1)
        line.replace(open + 1, close - open - 1, "...");
    out += line + "\n";
  }
  return out;
}

/// Runs `before` and `after` on the same inputs; tol 0 asks for bit-equal outputs.
inline void expect_same_outputs(const Model& before, const Model& after, const std::vector<Tensor>& inputs, double tol) {
  std::vector<Tensor> want = run_reference(before, inputs), got = run_reference(after, inputs);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].dtype(), want[i].dtype()) << "output " << i;
    ASSERT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
    if (tol == 0) {
      EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()), 0) << "output " << i << " differs";
    } else {
      EXPECT_LE(relative_l2(got[i], want[i]), tol) << "output " << i;
    }
  }
}

inline size_t count_ops(const Graph& g, const std::string& op) {
  return static_cast<size_t>(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op == op; }));
}

}  // namespace kiln::passes_test
