// fuse_gelu: GELU as exporters write it -> one Gelu node.
//
//   erf form:  e = Add(Erf(Div(x, √2) | Mul(x, 1/√2)), 1), then x·e·0.5 as
//              Mul(Mul(x, e), 0.5) | Mul(Mul(e, 0.5), x) | Mul(Mul(x, 0.5), e)
//   tanh form: t = Add(Tanh(Mul(√(2/π), Add(x, Mul(0.044715, Pow(x, 3))))), 1), then x·t·0.5 in
//              the same orders (GPT-2 writes Mul(Mul(0.5, x), t))
//
// Operands of Add and Mul may come in either order; every intermediate must be read by the
// pattern only.
#include <algorithm>

#include "compile/passes/match.h"
#include "compile/passes/patterns.h"

namespace kiln {

namespace {

constexpr double kSqrt2 = 1.4142135623730951, kInvSqrt2 = 0.7071067811865476;
constexpr double kSqrt2OverPi = 0.7978845608028654, kCubic = 0.044715;

// The other operand when `n` is op(v, c) or op(c, v) with c the scalar `want`.
bool with_scalar(const Matcher& m, const Node* n, std::string_view op, ValueId v, double want) {
  return n && n->op == op && m.is_scalar(Matcher::other(*n, v), want);
}

// x·u·0.5 from u (the 1 + erf / 1 + tanh value) in the orders above; fills `chain` and returns
// the result, or kNoValue.
ValueId times_half_x(const Matcher& m, ValueId u, ValueId x, std::vector<const Node*>& chain) {
  const Node* m1 = m.single_reader(u);
  if (!m1 || m1->op != "Mul") return kNoValue;
  const ValueId o = Matcher::other(*m1, u);
  if (o == x || m.is_scalar(o, 0.5)) {
    const Node* m2 = m.single_reader(m1->outputs[0]);
    const bool ok = m2 && m2->op == "Mul" &&
                    (o == x ? m.is_scalar(Matcher::other(*m2, m1->outputs[0]), 0.5) : Matcher::other(*m2, m1->outputs[0]) == x);
    if (!ok) return kNoValue;
    chain.insert(chain.end(), {m1, m2});
    return m2->outputs[0];
  }
  // u · (x · 0.5): the half made first.
  const Node* half = m.def(o, "Mul");
  if (!half || Matcher::other(*half, x) == kNoValue || !m.is_scalar(Matcher::other(*half, x), 0.5) || !m.only_read_by(o, {m1}))
    return kNoValue;
  chain.insert(chain.end(), {half, m1});
  return m1->outputs[0];
}

// 1 + f: the Add reading `f` with the scalar 1.
const Node* plus_one(const Matcher& m, ValueId f) {
  const Node* add = m.single_reader(f);
  return with_scalar(m, add, "Add", f, 1.0) ? add : nullptr;
}

}  // namespace

std::vector<GeluChain> find_gelus(const Graph& g) {
  Matcher m(g);
  std::vector<GeluChain> found;
  for (const Node& n : g.nodes) {
    if (!n.domain.empty() || (n.op != "Erf" && n.op != "Tanh")) continue;
    std::vector<const Node*> chain;
    ValueId x = kNoValue;
    const bool tanh = n.op == "Tanh";
    if (!tanh) {
      const Node* scale = m.def(n.inputs[0]);
      if (!scale || !m.only_read_by(n.inputs[0], {&n})) continue;
      for (ValueId cand : scale->inputs)
        if ((scale->op == "Div" && scale->inputs[0] == cand && m.is_scalar(scale->inputs[1], kSqrt2)) ||
            (scale->op == "Mul" && m.is_scalar(Matcher::other(*scale, cand), kInvSqrt2)))
          x = cand;
      chain = {scale, &n};
    } else {
      // √(2/π) · (x + 0.044715 · x³)
      const Node* outer = m.def(n.inputs[0], "Mul");
      if (!outer || !m.only_read_by(n.inputs[0], {&n})) continue;
      ValueId inner = kNoValue;
      for (ValueId cand : outer->inputs)
        if (m.is_scalar(Matcher::other(*outer, cand), kSqrt2OverPi)) inner = cand;
      const Node* sum = m.def(inner, "Add");
      if (!sum || !m.only_read_by(inner, {outer})) continue;
      for (ValueId cand : sum->inputs) {
        const Node* cubic = m.def(Matcher::other(*sum, cand), "Mul");
        if (!cubic || !m.only_read_by(cubic->outputs[0], {sum})) continue;
        for (ValueId p : cubic->inputs) {
          const Node* pow = m.def(p, "Pow");
          if (pow && pow->inputs[0] == cand && m.is_scalar(pow->inputs[1], 3.0) && m.is_scalar(Matcher::other(*cubic, p), kCubic) &&
              m.only_read_by(p, {cubic})) {
            x = cand;
            chain = {pow, cubic, sum, outer, &n};
          }
        }
      }
    }
    if (x == kNoValue || g.value(x).dtype != DType::f32) continue;
    const Node* one = plus_one(m, n.outputs[0]);
    if (!one) continue;
    chain.push_back(one);
    const ValueId y = times_half_x(m, one->outputs[0], x, chain);
    if (y == kNoValue) continue;
    found.push_back(GeluChain{x, y, m.indices(chain), m.index(n), tanh});
  }
  return found;
}

Result<size_t> fuse_gelu(Graph& g) {
  const std::vector<GeluChain> gelus = find_gelus(g);
  Rewrite rw(g);
  for (const GeluChain& c : gelus) {
    if (!rw.free(c.nodes)) continue;
    Node gelu;
    gelu.name = g.nodes[c.core].name;
    gelu.op = "Gelu";
    gelu.inputs = {c.x};
    gelu.outputs = {c.y};
    if (c.tanh) gelu.set_attr("approximate", std::string("tanh"));
    rw.replace(c.nodes, std::move(gelu));
  }
  const size_t made = rw.count();
  KILN_RETURN_IF_ERROR(rw.commit());
  return made;
}

}  // namespace kiln
