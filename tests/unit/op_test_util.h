// Helpers for the per-op tests: run one node through a Session, build small tensors and nodes,
// and check values and user errors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace kiln::testing {

/// Builds a one-node model of `op` whose inputs are graph inputs (undefined tensors stand for
/// omitted optional inputs) and runs it with the reference kernels.
inline Result<std::vector<Tensor>> run_op(const std::string& op, const std::vector<Tensor>& inputs,
                                          std::vector<Attribute> attrs = {}, size_t num_outputs = 1) {
  Model m;
  Graph& g = m.graph;
  Node n;  // assigned, not designated: GCC's -Wextra flags the fields a designated initializer omits
  n.name = "n";
  n.op = op;
  std::vector<Tensor> given;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      n.inputs.push_back(kNoValue);
      continue;
    }
    ValueId v = g.add_value("in" + std::to_string(i), inputs[i].dtype(), Shape::of(inputs[i].shape()));
    g.inputs.push_back(v);
    n.inputs.push_back(v);
    given.push_back(inputs[i]);
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    ValueId v = g.add_value("out" + std::to_string(i), DType::undefined);
    n.outputs.push_back(v);
    g.outputs.push_back(v);
  }
  for (auto& a : attrs) n.set_attr(a.name, a.value);
  g.add_node(std::move(n));
  KILN_ASSIGN_OR_RETURN(auto s, Session::create(m));
  return s->run(given);
}

/// A node for hand-built graphs and subgraphs.
inline Node node(std::string name, std::string op, std::vector<ValueId> in, std::vector<ValueId> out) {
  Node n;
  n.name = std::move(name);
  n.op = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

/// One attribute for run_op's list.
inline Attribute attr(std::string name, AttrValue v) { return Attribute{std::move(name), std::move(v)}; }

/// A tensor of dtype T from row-major values. The test fails when the number of values is not
/// the shape's element count (a typo in a test would otherwise read or write out of bounds).
template <class T>
Tensor make(std::vector<int64_t> shape, std::vector<T> v) {
  Tensor t(dtype_of<T>::value, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel()) << "make: values do not match the shape";
  const int64_t n = std::min(t.numel(), static_cast<int64_t>(v.size()));
  for (int64_t i = 0; i < n; ++i) t.data<T>()[i] = v[static_cast<size_t>(i)];
  return t;
}

template <class T>
Tensor scalar(T v) {
  return make<T>({}, {v});
}

/// A 1-D i64 tensor (axes, pads, shapes given as inputs).
inline Tensor ints(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return make<int64_t>({n}, std::move(v));
}

/// Deterministic non-zero f32 values of both signs.
inline Tensor ramp(std::vector<int64_t> shape, float scale = 0.37f) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * static_cast<float>((i * 7) % 11 - 5) + 0.1f;
  return t;
}

/// An f32 tensor's values rounded to f16 or bf16 (to nearest even): an `--precision` weight.
inline Tensor to_f16(const Tensor& f32) {
  Tensor h(DType::f16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) h.data<half>()[i] = half(f32.data<float>()[i]);
  return h;
}
inline Tensor to_bf16(const Tensor& f32) {
  Tensor h(DType::bf16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) h.data<bfloat16>()[i] = bfloat16(f32.data<float>()[i]);
  return h;
}

/// The tensor's elements converted to T (through double, so any dtype reads as any T).
template <class T>
std::vector<T> values(const Tensor& t) {
  std::vector<T> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = static_cast<T>(t.as_double(i));
  return out;
}

/// The tensor's elements exactly as stored, for comparing integer results bit for bit (no
/// detour through double). The test fails, and the result is empty, when the dtype is not T.
template <class T>
std::vector<T> stored_values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), dtype_of<T>::value);
  if (t.dtype() != dtype_of<T>::value) return {};
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

/// Every element of `got` is within `tol` of `want` (tol 0: exactly equal).
inline void expect_all(const Tensor& got, const std::vector<double>& want, double tol = 0) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.numel(); ++i)
    EXPECT_NEAR(got.as_double(i), want[static_cast<size_t>(i)], tol) << "element " << i;
}

/// The run failed with a user error whose message contains `fragment`.
inline void expect_user_error(const Result<std::vector<Tensor>>& r, const std::string& fragment) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_NE(r.error().what.find(fragment), std::string::npos) << r.error().what;
}

/// y = If(cond) then {x + x} else {constant [7, 8]}: the then branch captures x ([2], f32) of
/// the outer graph (written by name, as ONNX does, then resolved).
inline Model if_model() {
  Model m;
  Graph& g = m.graph;
  ValueId cond = g.add_value("cond", DType::boolean, Shape::of(std::vector<int64_t>{}));
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId y = g.add_value("y", DType::f32, Shape::of(std::vector<int64_t>{2}));
  g.inputs = {cond, x};
  g.outputs = {y};
  auto then_g = std::make_shared<Graph>();
  ValueId tx = then_g->add_value("x", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId ty = then_g->add_value("then_y", DType::f32, Shape::of(std::vector<int64_t>{2}));
  then_g->add_node(node("double", "Add", {tx, tx}, {ty}));
  then_g->outputs = {ty};
  auto else_g = std::make_shared<Graph>();
  else_g->outputs = {else_g->add_constant("else_y", make<float>({2}, {7, 8}))};
  Node n = node("if", "If", {cond}, {y});
  n.set_attr("then_branch", then_g);
  n.set_attr("else_branch", else_g);
  g.add_node(std::move(n));
  if (!resolve_captures(g).ok()) std::abort();
  return m;
}

}  // namespace kiln::testing
