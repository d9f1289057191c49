// Helpers for testing kernels against the reference kernels: one-node models run both ways.
#pragma once

#include <gtest/gtest.h>

#include <cstring>

#include "compile/pass.h"
#include "formats/layout.h"
#include "runtime/cpu/rows.h"
#include "runtime/plan.h"
#include "tests/unit/compile_test_util.h"

namespace kiln::testing {

/// Deterministic values of both signs with no pattern a wrong index could reproduce.
inline Tensor noise(std::vector<int64_t> shape, uint32_t seed, float scale = 1.f) {
  Tensor t(DType::f32, std::move(shape));
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.data<float>()[i] = scale * (static_cast<float>(s >> 8) / 16777216.f - 0.5f);
  }
  return t;
}

/// The ISA paths this CPU can run, each as the CPU a test pretends to have.
inline std::vector<std::pair<std::string, CpuFeatures>> isa_paths() {
  std::vector<std::pair<std::string, CpuFeatures>> out;
  const CpuFeatures& host = CpuFeatures::host();
  if (cpu::best_isa(host) == cpu::Isa::avx512) out.emplace_back("avx512", host);
  if (cpu::best_isa(host)) out.emplace_back("avx2", *CpuFeatures::named("avx2"));
  return out;
}

/// The name of kiln's kernel `base` ("kiln.quantize") in the build this CPU runs: base_avx512 or
/// base_avx2.
inline std::string host_kernel(const std::string& base) {
  return base + "_" + cpu::isa_name(cpu::best_isa(CpuFeatures::host()).value_or(cpu::Isa::avx2));
}

/// One node of `op`: its inputs, which of them are constants, its attributes.
struct Case {
  std::string op;
  std::vector<Tensor> inputs;          // graph inputs (undefined: omitted)
  std::vector<bool> constant;          // per input: a constant rather than a graph input
  std::vector<Attribute> attrs;
  std::vector<bool> outputs = {true};  // per output: requested (false: omitted)
  std::string kernel;                  // an implementation the node pins (as a compiled model does), or ""
  KernelParams kernel_params = {};     // the parameters it pins with it
  int threads = 1;                     // the target's threads
};

/// The one-node model's outputs on the default kernels (for this CPU, when given; or on
/// `kernels`) and on the reference kernels, with the kernel that ran it and its label
/// (Kernel::label). Empty outputs when either failed (the test has failed then).
struct BothRuns {
  std::vector<Tensor> fast, ref;
  std::string kernel, label;
  std::vector<std::pair<std::string, std::string>> declined;  ///< the implementations tried first, with why
  std::string graph_text;
};

/// The case as a one-node model (node "n"), and the tensors its graph inputs take.
inline Model case_model(const Case& c, std::vector<Tensor>& feed) {
  Model m;
  Graph& g = m.graph;
  Node n;
  n.name = "n";
  n.op = c.op;
  feed.clear();
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (!t.defined()) {
      n.inputs.push_back(kNoValue);
      continue;
    }
    if (i < c.constant.size() && c.constant[i]) {
      n.inputs.push_back(g.add_constant("c" + std::to_string(i), t));
      continue;
    }
    ValueId v = g.add_value("in" + std::to_string(i), t.dtype(), Shape::of(t.shape()));
    g.inputs.push_back(v);
    n.inputs.push_back(v);
    feed.push_back(t);
  }
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    const ValueId y = c.outputs[i] ? g.add_value(i == 0 ? "y" : "y" + std::to_string(i), DType::undefined) : kNoValue;
    n.outputs.push_back(y);
    if (y != kNoValue) g.outputs.push_back(y);
  }
  for (const Attribute& a : c.attrs) n.set_attr(a.name, a.value);
  if (!c.kernel.empty()) n.kernel = KernelChoice{c.kernel, c.kernel_params};
  g.add_node(std::move(n));
  EXPECT_TRUE(infer_graph(g).ok());
  return m;
}

/// A model's outputs on `options`' kernels and on the reference kernels, with the kernels the
/// first session chose (per node) and the threads its run used. Empty outputs when either
/// failed (the test has failed then).
struct ModelRuns {
  std::vector<Tensor> fast, ref;
  std::vector<NodeKernel> kernels;
  int threads = 0;
};
inline ModelRuns run_model_both(const Model& m, const std::vector<Tensor>& feed, const SessionOptions& options) {
  ModelRuns out;
  auto fast = Session::create(m, options);
  auto ref = Session::create(m, SessionOptions{.reference = true});
  EXPECT_TRUE(fast.ok() && ref.ok());
  if (!fast.ok() || !ref.ok()) return out;
  auto got = (*fast)->run(feed);
  auto want = (*ref)->run(feed);
  EXPECT_TRUE(got.ok()) << got.error().message();
  EXPECT_TRUE(want.ok()) << want.error().message();
  if (!got.ok() || !want.ok()) return out;
  EXPECT_EQ(got->size(), want->size());
  out.fast = std::move(*got);
  out.ref = std::move(*want);
  out.kernels.assign((*fast)->kernels().begin(), (*fast)->kernels().end());
  out.threads = (*fast)->run_threads();
  return out;
}

/// `c`'s one-node model on its pinned kernel, its constant input `slot` stored as compile's
/// prepack_weights stores it: where the kernel stores it packed, the plan of the stored model
/// uses those bytes where they lie (no reorder while planning) and they unpack to the plain
/// weight; either way the stored model's outputs are the plain one's bit for bit (and within
/// `tol` relative L2 of the reference kernels' where `tol` ≥ 0). Returns the stored constant.
inline Tensor expect_stored_weight_used_in_place(const Case& c, size_t slot, double tol = -1) {
  std::vector<Tensor> feed;
  const Model plain = case_model(c, feed);
  Model stored = plain;
  Target target;
  PassContext ctx{target, {}};
  auto r = find_pass("prepack_weights")->run(stored, ctx);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
  const ValueId wid = stored.graph.nodes[0].inputs[slot];
  const Tensor w = stored.graph.value(wid).constant;
  std::vector<std::vector<int64_t>> shapes;
  for (const Tensor& t : feed) shapes.push_back(t.shape());
  auto plan = build_plan(stored.graph, shapes, PlanOptions{target, default_kernels()});
  EXPECT_TRUE(plan.ok()) << (plan.ok() ? "" : plan.error().message());
  if (!r.ok() || !plan.ok()) return w;
  const Tensor offered = plan->kernels[0].kernel->packed_input(slot);
  if (w.is_packed()) {
    const Tensor& given = plain.graph.value(wid).constant;
    EXPECT_EQ(std::memcmp(unpack(w).raw(), given.raw(), given.nbytes()), 0);
    EXPECT_EQ(offered.raw(), w.raw());
  } else {
    EXPECT_FALSE(offered.defined()) << "offered a packed weight that prepack_weights did not store";
  }
  const ModelRuns before = run_model_both(plain, feed, SessionOptions{}), after = run_model_both(stored, feed, SessionOptions{});
  EXPECT_FALSE(before.fast.empty() || after.fast.empty());
  if (before.fast.empty() || after.fast.empty()) return w;
  EXPECT_EQ(after.kernels[0].name, c.kernel);
  EXPECT_EQ(std::memcmp(after.fast[0].raw(), before.fast[0].raw(), before.fast[0].nbytes()), 0);
  if (tol >= 0) {
    EXPECT_LE(relative_l2(after.fast[0], after.ref[0]), tol);
  }
  return w;
}

inline BothRuns run_both(const Case& c, const CpuFeatures* cpu = nullptr, const KernelRegistry* kernels = nullptr) {
  BothRuns out;
  std::vector<Tensor> feed;
  const Model m = case_model(c, feed);
  out.graph_text = graph_to_text(m.graph);
  SessionOptions options;
  if (cpu) options.target.cpu = *cpu;
  options.target.threads = c.threads;
  options.kernels = kernels;
  ModelRuns r = run_model_both(m, feed, options);
  if (r.fast.empty()) return out;
  out.fast = std::move(r.fast);
  out.ref = std::move(r.ref);
  out.kernel = r.kernels[0].name;
  out.label = r.kernels[0].label;
  out.declined = r.kernels[0].declined;
  return out;
}

/// Runs the one-node model both ways (run_both), compares the outputs (relative L2 <= tol) and
/// returns the kernel that ran it (and its label into `label` when given).
inline std::string check(const Case& c, double tol = 1e-5, const CpuFeatures* cpu = nullptr,
                         const KernelRegistry* kernels = nullptr, std::string* label = nullptr) {
  BothRuns r = run_both(c, cpu, kernels);
  for (size_t i = 0; i < r.fast.size() && i < r.ref.size(); ++i) {
    EXPECT_EQ(r.fast[i].dtype(), r.ref[i].dtype()) << "output " << i;
    EXPECT_EQ(r.fast[i].shape(), r.ref[i].shape()) << "output " << i;
    EXPECT_LE(relative_l2(r.fast[i], r.ref[i]), tol) << c.op << " output " << i << " " << r.graph_text;
  }
  if (label) *label = r.label;
  return r.kernel;
}

}  // namespace kiln::testing
