// lower_int8: a quantized model's DequantizeLinear -> op -> QuantizeLinear patterns (what
// `kiln quant` writes) become int8 operations, so that the values between them stay u8 / s8:
//
//   DQ(x) -> FusedConv(W = DQ(constant s8), B = f32 constant, Z = DQ(z) or none) -> Q
//        -> QFusedConv(x, W and z quantized; its output quantized as Q does)
//   DQ(a) -> FusedMatMul | MatMul | Gemm (B = DQ(constant 2-D s8), bias, Z = DQ(z)) [-> Q]
//        -> QFusedMatMul (its output quantized as Q does, or f32 when no Q reads it); `a` may be
//           DynamicQuantizeLinear's (a dynamically quantized layer: its scale each run's)
//   DQ(a) + DQ(b) [-> Relu] -> Q, a and b of the output's shape -> QAdd (a residual add)
//   DQ(a) * b -> Q, b f32 of a's shape or a channel gate ([N or 1, 1.., C] against channels-last
//        a: a squeeze-excite block's scales) -> QMul, b read as it is
//   DQ(x) -> GlobalAveragePool (channels-last) -> Q -> QGlobalAveragePool (a squeeze), so
//        that such a block's int8 tensor is never dequantized whole
//   DQ(x) -> an elementwise unary op (Sigmoid, Tanh, Exp, GELU...; the DQ's only reader) with
//        an f32 output [-> Reshape / Transpose ...]
//        -> LookupTable of x's codes: the op's 256 possible values, computed now on the
//           reference kernels, looked up after the Reshapes and Transposes that alone read its
//           output, which move the codes instead (YOLO's detection head: the Sigmoid of each
//           scale's last conv, then its boxes' transpose)
//   DQ(x) -> MaxPool -> Q with the same scale and zero point
//        -> MaxPool on x itself (a max commutes with a monotonic quantization)
//   DQ(x..) -> Split / Concat / nearest Resize -> Q, every scale and zero point the same
//        -> the op on the codes (a quantized YOLO's C2f blocks and neck)
//   DQ(x) -> LayerNormalization (constant f32 scale and B) -> Q
//        -> QLayerNormalization (a quantized transformer's norms: no f32 tensor around them)
//   DQ(q), DQ(k), DQ(v) -> Attention (a mask or none; no KV cache, rotary caches, sequence
//        lengths, softcap or scores) [-> Q]; or q, k and v split from one DQ'd projection
//        (Split([Reshape](DQ(qkv))), GPT-2's c_attn), the codes then split instead
//        -> QAttention, on targets with AMX, whose kernel takes it: the projections write
//           their codes, and the attention multiplies them (its output quantized as Q does, or
//           f32 when no Q reads it)
// (first, a Q of DQ(x) with DQ's own scale and zero point is x: a quantized model's two edges
// that share an observer, once the ops between them went); and then a QFusedMatMul whose u8
// output only a DQ reads writes the DQ's f32 output itself
// (`dequantize_output`: the projections before a transformer's attention).
//
// and, for weight-only quantized models (`kiln quant --weight-only`) and any linear layer the
// int8 rewrite did not take:
//   f32 a -> FusedMatMul | MatMul | Gemm (B = DQ(constant 2-D i8 / u8 / i4 / u4: per tensor, per
//        output channel or in blocks along K, any zero points), bias, Z)
//        -> WoqFusedMatMul, which reads the codes and dequantizes them as it loads B (on CPUs
//           with its kernel; elsewhere the DQ is folded as before)
//
// QFusedConv and QFusedMatMul are made for targets with AVX512-VNNI only: without it oneDNN's
// int8 convolutions sum pairs of u8 · s8 products in 16 bits (`vpmaddubsw`), which saturate on
// full-range weights, and kiln's int8 GEMM is VNNI's; such a target's convolutions and linear
// layers stay f32 between their Q and DQ, as the quantized model computes them.
//
// It runs after fuse_epilogues (the conv has its activation and residual already) and
// channels_last; a channels-last conv whose input or output crosses the layout boundary reads
// Transpose(DQ(x)) or writes through a Transpose to Q: the Transpose then moves the int8 tensor
// instead, a quarter of the bytes. Scales and zero points must be per-tensor constants, the
// weight's per tensor or per output channel with zero points of 0.
//
// fold_constants leaves the DequantizeLinear of a constant weight that a conv or matmul reads
// for this pass; those that no pattern took are folded here, at the end, so what stays float
// runs on f32 weights as before.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/ops/nn_util.h"
#include "runtime/cpu/attention_amx.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/gemm/woq.h"
#include "runtime/cpu/quant.h"

namespace kiln {

namespace {

double scalar_of(const Graph& g, ValueId v) { return g.value(v).constant.to_double_vector()[0]; }

// The elementwise unary ops (one f32 input, its shape out) lower_int8 tabulates on int8 codes.
const std::set<std::string, std::less<>> kTabulated = {"Sigmoid", "Tanh", "Exp", "Log", "Erf", "Relu", "LeakyRelu", "Elu", "Selu", "Celu",
                                                       "HardSigmoid", "HardSwish", "Gelu", "Softplus", "Softsign", "Mish", "Abs", "Neg",
                                                       "Sqrt", "Reciprocal", "ThresholdedRelu"};

class Lowering {
 public:
  explicit Lowering(Graph& g) : g_(g), producers_(g.producers()), uses_(g.uses()), drop_(g.nodes.size(), 0), before_(g.nodes.size()) {
    for (ValueId v : g.outputs) outputs_.insert(v);
  }

  size_t convs = 0, matmuls = 0, weight_only = 0, adds = 0, pools = 0, norms = 0, attentions = 0;
  size_t muls = 0, averages = 0, tables = 0, moves = 0;
  size_t kept_float = 0;  ///< convolutions and linear layers of int8 inputs left f32 (no `products`)

  /// `products`: the target multiplies int8 codes exactly (VNNI: QFusedConv's and
  /// QFusedMatMul's kernels); `woq`: it runs WoqFusedMatMul's kernel; `amx`: QAttention's.
  void run(bool products, bool woq, bool amx) {
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      if (drop_[i]) continue;
      const std::string& op = g_.nodes[i].op;
      if (!g_.nodes[i].domain.empty()) continue;
      const bool codes = int8_product(g_.nodes[i]);
      if (!products && codes) ++kept_float;
      if (op == "FusedConv") {
        if (products && conv(i)) ++convs;
        else if (codes) g_.nodes[i].set_attr("int8_operands", int64_t{1});  // left f32: its sums stay direct
      }
      else if (op == "FusedMatMul" || op == "MatMul" || op == "Gemm") {
        if (products && matmul(i)) ++matmuls;
        else if (woq) weight_only += woq_matmul(i);
      }
      else if (op == "MaxPool") pools += maxpool(i);
      else if (op == "LayerNormalization") norms += layer_norm(i);
      else if (op == "Attention" && amx) attentions += attention(i);
      else if (op == "Add") adds += add(i);
      else if (op == "Mul") muls += mul(i);
      else if (op == "GlobalAveragePool") averages += global_average(i);
      else if (kTabulated.count(op)) tables += lookup_table(i);
      else if (op == "Split" || op == "Concat" || op == "Resize") moves += movement(i);
    }
  }

  // The graph's nodes with the rewrites applied.
  void finish() {
    std::vector<Node> nodes;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      for (Node& n : before_[i]) nodes.push_back(std::move(n));
      if (!drop_[i]) nodes.push_back(std::move(g_.nodes[i]));
    }
    g_.nodes = std::move(nodes);
  }

 private:
  // The one node reading v through an input (not a graph output, no capture), or -1.
  int64_t single_reader(ValueId v) const {
    if (v == kNoValue || outputs_.count(v)) return -1;
    const std::vector<Use>& u = uses_[static_cast<size_t>(v)];
    if (u.size() != 1 || u[0].slot == Use::kCaptured || drop_[u[0].node]) return -1;
    return static_cast<int64_t>(u[0].node);
  }
  const Node* producer(ValueId v) const {
    if (v == kNoValue) return nullptr;
    const int32_t p = producers_[static_cast<size_t>(v)];
    return p < 0 || drop_[static_cast<size_t>(p)] ? nullptr : &g_.nodes[static_cast<size_t>(p)];
  }

  // A convolution or linear layer that the int8 rewrite would consider: a DQ'd input (or a
  // dynamically quantized one) and a DQ'd constant weight.
  bool int8_product(const Node& n) const {
    if (n.op != "FusedConv" && n.op != "FusedMatMul" && n.op != "MatMul" && n.op != "Gemm") return false;
    if (n.inputs.size() < 2) return false;
    const Node* transpose = nullptr;
    const Node* w = producer(n.inputs[1]);
    return dequantized(n.inputs[0], &transpose, true) && w && w->op == "DequantizeLinear" && w->domain.empty() &&
           g_.value(w->inputs[0]).is_constant();
  }

  // An int8 operand: v = DQ(q), or Transpose(DQ(q)) (then `transpose` is that node). Returns
  // the DQ node. With `runtime`, also a DQ of DynamicQuantizeLinear's three outputs (a
  // dynamically quantized input: its scale and zero point are each run's).
  const Node* dequantized(ValueId v, const Node** transpose, bool runtime = false) const {
    *transpose = nullptr;
    const Node* p = producer(v);
    if (p && p->op == "Transpose" && p->domain.empty()) {
      *transpose = p;
      p = producer(p->inputs[0]);
    }
    if (!p) return nullptr;
    if (runtime && !*transpose && p->op == "DequantizeLinear" && p->domain.empty() && p->inputs.size() == 3) {
      const Node* d = producer(p->inputs[0]);
      if (d && d->op == "DynamicQuantizeLinear" && d->domain.empty() && d->outputs.size() == 3 && d->outputs[0] == p->inputs[0] &&
          d->outputs[1] == p->inputs[1] && d->outputs[2] == p->inputs[2])
        return p;
    }
    if (!per_tensor(g_, *p, "DequantizeLinear") || !is_int8(g_.value(p->inputs[0]).dtype)) return nullptr;
    return p;
  }

  // A data-movement node (Transpose, Reshape, Split) that moved f32 values, moving the int8
  // `codes` instead: placed before node `at`, its other inputs as they were, each output a new
  // value of the codes' type in the f32 one's shape. Returns its outputs.
  std::vector<ValueId> move_codes(const Node& from, ValueId codes, size_t at) {
    Node n = from;
    n.name = from.name + "_int8";
    n.inputs[0] = codes;
    n.kernel = {};
    for (ValueId& o : n.outputs)
      if (o != kNoValue) o = g_.add_value(g_.unique_value_name(g_.value(o).name + "_int8"), g_.value(codes).dtype, g_.value(o).shape);
    std::vector<ValueId> outs = n.outputs;
    before_[at].push_back(std::move(n));
    return outs;
  }

  // The int8 value standing for operand v: DQ's input, or a new Transpose of it placed before
  // node `at` (the transpose of an f32 operand becomes one of its int8 source).
  ValueId int8_operand(const Node& dq, const Node* transpose, size_t at) {
    return transpose ? move_codes(*transpose, dq.inputs[0], at)[0] : dq.inputs[0];
  }

  // Where output v goes: Q(v), or Transpose(v) -> Q. Returns the Q node's index; `transpose`
  // is the Transpose's index or -1.
  int64_t quantized_by(ValueId v, int64_t* transpose) const {
    *transpose = -1;
    int64_t r = single_reader(v);
    if (r >= 0 && g_.nodes[static_cast<size_t>(r)].op == "Transpose" && g_.nodes[static_cast<size_t>(r)].domain.empty()) {
      *transpose = r;
      r = single_reader(g_.nodes[static_cast<size_t>(r)].outputs[0]);
    }
    if (r < 0 || !per_tensor(g_, g_.nodes[static_cast<size_t>(r)], "QuantizeLinear")) return -1;
    return r;
  }

  // The value the lowered node writes: Q's output, or a new int8 value the Transpose then moves
  // to Q's output.
  ValueId int8_result(ValueId f32_out, int64_t q, int64_t transpose) {
    const ValueId out = g_.nodes[static_cast<size_t>(q)].outputs[0];
    drop_[static_cast<size_t>(q)] = 1;
    if (transpose < 0) return out;
    const Value& f = g_.value(f32_out);
    const ValueId t = g_.add_value(g_.unique_value_name(f.name + "_int8"), g_.value(out).dtype, f.shape);
    Node& tr = g_.nodes[static_cast<size_t>(transpose)];
    tr.inputs = {t};
    tr.outputs = {out};
    return t;
  }

  // A weight: DQ of a constant s8 tensor, per tensor or per slice of dim `axis` (its output
  // channels), zero points 0. Returns the DQ node.
  const Node* weight(ValueId v, int64_t axis) const {
    const Node* dw = producer(v);
    if (!dw || dw->op != "DequantizeLinear" || dw->inputs.size() != 3 || dw->has_attr("block_size")) return nullptr;
    const Value& wq = g_.value(dw->inputs[0]);
    const Value& ws = g_.value(dw->inputs[1]);
    const Value& wz = g_.value(dw->inputs[2]);
    if (!wq.is_constant() || wq.dtype != DType::i8 || !ws.is_constant() || ws.dtype != DType::f32 || !wz.is_constant()) return nullptr;
    if (wq.constant.rank() <= axis) return nullptr;
    if (ws.constant.numel() != 1) {
      int64_t a = dw->attr_int("axis", 1);
      if (a < 0) a += wq.constant.rank();
      if (a != axis || ws.constant.numel() != wq.constant.dim(axis)) return nullptr;
    }
    for (double z : wz.constant.to_double_vector())
      if (z != 0) return nullptr;
    return dw;
  }

  // Whether node m is a linear layer these rewrites take (one output, A and B; a Gemm without
  // transA, alpha or beta): whether its B is [N, K], or nullopt.
  static std::optional<bool> linear_trans(const Node& m) {
    if (!m.has_input(0) || !m.has_input(1) || m.outputs.size() != 1) return std::nullopt;
    if (m.op != "Gemm") return false;
    if (m.attr_int("transA", 0) != 0 || m.attr_float("alpha", 1.0) != 1.0 || m.attr_float("beta", 1.0) != 1.0) return std::nullopt;
    return m.attr_int("transB", 0) != 0;
  }

  // m's bias (input 2, if any) as the [N] f32 constant the lowered node takes (a Gemm's [1, N]
  // reshaped) into `bias`; false when it is not such a constant.
  bool constant_bias(const Node& m, int64_t n, ValueId* bias) {
    *bias = kNoValue;
    if (!m.has_input(2)) return true;
    const Value& b = g_.value(m.inputs[2]);
    if (!b.is_constant() || b.dtype != DType::f32 || b.constant.numel() != n || (m.op == "Gemm" && b.constant.rank() > 2)) return false;
    *bias = b.constant.rank() == 1 ? m.inputs[2] : g_.add_constant(g_.unique_value_name(b.name + "_row"), b.constant.reshaped({n}));
    return true;
  }

  // The lowered node of linear layer m: its name and sources, a FusedMatMul's epilogue.
  static Node linear_node(const Node& m, std::string op, bool trans) {
    Node n = lowered(m, std::move(op));
    if (m.op == "FusedMatMul")
      for (const Attribute& a : m.attrs) n.set_attr(a.name, a.value);
    if (trans) n.set_attr("transB", int64_t{1});
    return n;
  }

  // A linear layer: DQ(a) -> FusedMatMul / MatMul / Gemm by a DQ'd constant 2-D weight (bias,
  // activations, residual DQ(z)), then Q, or float readers (then Y stays f32).
  bool matmul(size_t i) {
    const Node& m = g_.nodes[i];
    const std::optional<bool> linear = linear_trans(m);
    if (!linear) return false;
    const bool trans = *linear;
    const Node* ta = nullptr;
    const Node* da = dequantized(m.inputs[0], &ta, true);
    if (!da || ta) return false;
    if (g_.value(m.inputs[1]).shape.rank() != 2) return false;
    const Node* dw = weight(m.inputs[1], trans ? 0 : 1);
    if (!dw) return false;
    ValueId bias = kNoValue;
    if (!constant_bias(m, g_.value(dw->inputs[0]).constant.dim(trans ? 0 : 1), &bias)) return false;
    const Node* dz = nullptr;
    const Node* tz = nullptr;
    ValueId z_f32 = kNoValue;  // a float residual (a dynamically quantized layer's) is read as it is
    if (m.op == "FusedMatMul" && m.has_input(3)) {
      dz = dequantized(m.inputs[3], &tz);
      if (tz) return false;
      if (!dz) {
        if (g_.value(m.inputs[3]).dtype != DType::f32) return false;
        z_f32 = m.inputs[3];
      }
    }
    int64_t tq = -1;
    const int64_t q = quantized_by(m.outputs[0], &tq);
    if (tq >= 0 || (dz && q >= 0 && g_.value(dz->inputs[0]).dtype != g_.value(g_.nodes[static_cast<size_t>(q)].outputs[0]).dtype)) return false;
    Node n = linear_node(m, "QFusedMatMul", trans);
    n.inputs = {da->inputs[0], da->inputs[1], da->inputs[2], dw->inputs[0], dw->inputs[1], dw->inputs[2]};
    if (q >= 0) {
      const Node& qn = g_.nodes[static_cast<size_t>(q)];
      n.inputs.insert(n.inputs.end(), {qn.inputs[1], qn.inputs[2]});
      absorb(n, qn);
      n.outputs = {int8_result(m.outputs[0], q, -1)};
    } else {
      n.inputs.insert(n.inputs.end(), {kNoValue, kNoValue});
      n.outputs = {m.outputs[0]};
    }
    n.inputs.push_back(bias);
    if (dz) n.inputs.insert(n.inputs.end(), {dz->inputs[0], dz->inputs[1], dz->inputs[2]});
    if (z_f32 != kNoValue) {
      while (n.inputs.size() < 9) n.inputs.push_back(kNoValue);
      n.inputs.push_back(z_f32);
    }
    while (!n.inputs.empty() && n.inputs.back() == kNoValue) n.inputs.pop_back();
    before_[i].push_back(std::move(n));
    drop_[i] = 1;
    return true;
  }

  // A linear layer whose weight is DQ(constant 2-D int8 / int4 codes) and whose A is f32: the
  // codes stay, read by WoqFusedMatMul with the DQ's scales, zero points, axis and blocks.
  bool woq_matmul(size_t i) {
    const Node& m = g_.nodes[i];
    const std::optional<bool> linear = linear_trans(m);
    if (!linear || g_.value(m.inputs[0]).dtype != DType::f32) return false;
    const bool trans = *linear;
    const Node* dw = producer(m.inputs[1]);
    if (!dw || dw->op != "DequantizeLinear" || !dw->domain.empty() || dw->inputs.size() < 2 || dw->outputs.size() != 1) return false;
    if (!dw->attr_string("precision", "").empty() || dw->attr_string("output_dtype", "f32") != "f32") return false;
    const Value& wq = g_.value(dw->inputs[0]);
    const Value& ws = g_.value(dw->inputs[1]);
    if (!wq.is_constant() || wq.constant.rank() != 2 || !(is_int8(wq.dtype) || is_int4(wq.dtype))) return false;
    if (!ws.is_constant() || ws.dtype != DType::f32) return false;
    if (dw->has_input(2) && !g_.value(dw->inputs[2]).is_constant()) return false;
    const int64_t n_dim = trans ? 0 : 1;
    int64_t axis = dw->attr_int("axis", 1);
    if (axis < 0) axis += 2;
    const int64_t block = dw->attr_int("block_size", 0);
    if (block == 0 && ws.constant.numel() != 1 && (ws.constant.rank() != 1 || axis != n_dim)) return false;  // per channel of N only
    if (block > 0 && axis != 1 - n_dim) return false;  // blocks along K only
    ValueId bias = m.op == "FusedMatMul" && m.has_input(2) ? m.inputs[2] : kNoValue;  // FusedMatMul's is [N] already
    if (m.op != "FusedMatMul" && !constant_bias(m, wq.constant.dim(n_dim), &bias)) return false;
    Node n = linear_node(m, "WoqFusedMatMul", trans);
    n.set_attr("axis", axis);
    if (block > 0) n.set_attr("block_size", block);
    n.inputs = {m.inputs[0], dw->inputs[0], dw->inputs[1], dw->has_input(2) ? dw->inputs[2] : kNoValue, bias,
                m.op == "FusedMatMul" && m.has_input(3) ? m.inputs[3] : kNoValue};
    while (!n.inputs.empty() && n.inputs.back() == kNoValue) n.inputs.pop_back();
    n.outputs = m.outputs;
    before_[i].push_back(std::move(n));
    drop_[i] = 1;
    return true;
  }

  // A new node of `op` standing for `from`: its name, and its sources (or its name).
  static Node lowered(const Node& from, std::string op) {
    Node n;
    n.name = from.name;
    n.op = std::move(op);
    n.sources = from.sources;
    if (n.sources.empty()) n.sources.push_back(from.name);
    return n;
  }

  // Node n reads one int8 operand, DQ(x) (no Transpose), at input 0, and its output goes to a Q
  // alone: sets the DQ and the Q's index.
  bool between_qdq(const Node& n, const Node** dx, int64_t* q) const {
    const Node* t = nullptr;
    *dx = dequantized(n.inputs[0], &t);
    int64_t tq = -1;
    *q = *dx && !t ? quantized_by(n.outputs[0], &tq) : -1;
    return *q >= 0 && tq < 0;
  }

  void absorb(Node& into, const Node& from) {
    if (from.sources.empty()) into.sources.push_back(from.name);
    for (const std::string& s : from.sources)
      if (std::find(into.sources.begin(), into.sources.end(), s) == into.sources.end()) into.sources.push_back(s);
  }

  bool conv(size_t i) {
    const Node& c = g_.nodes[i];
    if (!c.has_input(0) || !c.has_input(1) || c.outputs.size() != 1 || c.has_attr("x_parts") ||
        nn::x_channels_first(c))
      return false;
    const Node *tx = nullptr, *tz = nullptr;
    const Node* dx = dequantized(c.inputs[0], &tx);
    if (!dx) return false;
    const Node* dw = weight(c.inputs[1], 0);
    if (!dw) return false;
    if (c.has_input(2) && (!g_.value(c.inputs[2]).is_constant() || g_.value(c.inputs[2]).dtype != DType::f32)) return false;
    const Node* dz = nullptr;
    if (c.has_input(3) && !(dz = dequantized(c.inputs[3], &tz))) return false;
    int64_t tq = -1;
    const int64_t q = quantized_by(c.outputs[0], &tq);
    if (q < 0 || (dz && g_.value(dz->inputs[0]).dtype != g_.value(g_.nodes[static_cast<size_t>(q)].outputs[0]).dtype)) return false;

    Node n = lowered(c, "QFusedConv");
    n.attrs = c.attrs;
    const Node& qn = g_.nodes[static_cast<size_t>(q)];
    const ValueId x = int8_operand(*dx, tx, i);
    n.inputs = {x, dx->inputs[1], dx->inputs[2], dw->inputs[0], dw->inputs[1], dw->inputs[2], qn.inputs[1], qn.inputs[2],
                c.has_input(2) ? c.inputs[2] : kNoValue};
    if (dz) n.inputs.insert(n.inputs.end(), {int8_operand(*dz, tz, i), dz->inputs[1], dz->inputs[2]});
    absorb(n, qn);
    n.outputs = {int8_result(c.outputs[0], q, tq)};
    before_[i].push_back(std::move(n));
    drop_[i] = 1;
    return true;
  }

  // DQ(a) + DQ(b) [-> Relu] -> Q, a and b of the output's shape: QAdd (the Relu its activation).
  bool add(size_t i) {
    const Node& n = g_.nodes[i];
    if (n.inputs.size() != 2 || n.outputs.size() != 1) return false;
    const Node *ta = nullptr, *tb = nullptr;
    const Node* da = dequantized(n.inputs[0], &ta);
    const Node* db = dequantized(n.inputs[1], &tb);
    if (!da || !db) return false;
    const Shape& ys = g_.value(n.outputs[0]).shape;
    if (!ys.is_concrete() || g_.value(n.inputs[0]).shape != ys || g_.value(n.inputs[1]).shape != ys) return false;
    ValueId out = n.outputs[0];
    std::optional<size_t> relu;
    if (int64_t r = single_reader(out); r >= 0 && g_.nodes[static_cast<size_t>(r)].op == "Relu" && g_.nodes[static_cast<size_t>(r)].domain.empty()) {
      relu = static_cast<size_t>(r);
      out = g_.nodes[*relu].outputs[0];
    }
    int64_t tq = -1;
    const int64_t q = quantized_by(out, &tq);
    if (q < 0) return false;
    Node a = lowered(n, "QAdd");
    if (relu) {
      a.set_attr("activation", std::string("Relu"));
      absorb(a, g_.nodes[*relu]);
      drop_[*relu] = 1;
    }
    const Node& qn = g_.nodes[static_cast<size_t>(q)];
    a.inputs = {int8_operand(*da, ta, i), da->inputs[1], da->inputs[2], int8_operand(*db, tb, i), db->inputs[1], db->inputs[2],
                qn.inputs[1], qn.inputs[2]};
    absorb(a, qn);
    a.outputs = {int8_result(out, q, tq)};
    before_[i].push_back(std::move(a));
    drop_[i] = 1;
    return true;
  }

  // DQ(a) * b -> Q (either order), b f32 as QMul's kernel takes it (a's shape, or a channel
  // gate): QMul, a's codes scaled by b and requantized in one pass.
  bool mul(size_t i) {
    const Node& n = g_.nodes[i];
    if (n.inputs.size() != 2 || n.outputs.size() != 1) return false;
    const Shape& ys = g_.value(n.outputs[0]).shape;
    for (size_t k = 0; k < 2; ++k) {
      const Node* ta = nullptr;
      const Node* da = dequantized(n.inputs[k], &ta);
      const ValueId b = n.inputs[1 - k];
      if (!da || ta || g_.value(b).dtype != DType::f32 || g_.value(n.inputs[k]).shape != ys ||
          !cpu::qmul_shape(ys, g_.value(b).shape))
        continue;
      int64_t tq = -1;
      const int64_t q = quantized_by(n.outputs[0], &tq);
      if (q < 0 || tq >= 0) return false;
      const Node& qn = g_.nodes[static_cast<size_t>(q)];
      Node m = lowered(n, "QMul");
      m.inputs = {da->inputs[0], da->inputs[1], da->inputs[2], b, qn.inputs[1], qn.inputs[2]};
      absorb(m, qn);
      m.outputs = {int8_result(n.outputs[0], q, -1)};
      before_[i].push_back(std::move(m));
      drop_[i] = 1;
      return true;
    }
    return false;
  }

  // DQ(x) -> GlobalAveragePool (channels-last, as its kernel takes it) -> Q: QGlobalAveragePool
  // on the codes.
  bool global_average(size_t i) {
    const Node& p = g_.nodes[i];
    if (p.inputs.size() != 1 || p.outputs.size() != 1 || !nn::channels_last(p)) return false;
    const Shape& xs = g_.value(p.inputs[0]).shape;
    if (!xs.is_concrete() || xs.rank() < 3) return false;
    const Node* dx = nullptr;
    int64_t q = -1;
    if (!between_qdq(p, &dx, &q)) return false;
    const Node& qn = g_.nodes[static_cast<size_t>(q)];
    Node n = lowered(p, "QGlobalAveragePool");
    n.attrs = p.attrs;
    n.inputs = {dx->inputs[0], dx->inputs[1], dx->inputs[2], qn.inputs[1], qn.inputs[2]};
    absorb(n, qn);
    n.outputs = {int8_result(p.outputs[0], q, -1)};
    before_[i].push_back(std::move(n));
    drop_[i] = 1;
    return true;
  }

  // Whether DQ or Q nodes a and b quantize alike: the same scale, zero point and type.
  bool same_params(const Node& a, const Node& b) const {
    return scalar_of(g_, a.inputs[1]) == scalar_of(g_, b.inputs[1]) && scalar_of(g_, a.inputs[2]) == scalar_of(g_, b.inputs[2]) &&
           g_.value(a.inputs[2]).dtype == g_.value(b.inputs[2]).dtype;
  }

  // A Split, Concat or nearest Resize between DQs and Qs that all quantize alike (the x86
  // quantizer shares their parameters: a YOLO C2f block's halves and joins, its neck's
  // upsampling): the op moves the codes, each output written where its Q wrote.
  bool movement(size_t i) {
    const Node& n = g_.nodes[i];
    if (n.op == "Resize" && n.attr_string("mode", "nearest") != "nearest") return false;
    const size_t data = n.op == "Concat" ? n.inputs.size() : 1;
    std::vector<const Node*> dqs;
    for (size_t k = 0; k < data; ++k) {
      const Node* t = nullptr;
      const Node* d = dequantized(n.inputs[k], &t);
      if (!d || t || (k > 0 && !same_params(*dqs[0], *d))) return false;
      dqs.push_back(d);
    }
    std::vector<int64_t> qs(n.outputs.size(), -1);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] == kNoValue) continue;
      int64_t tq = -1;
      qs[k] = quantized_by(n.outputs[k], &tq);
      if (qs[k] < 0 || tq >= 0 || !same_params(g_.nodes[static_cast<size_t>(qs[k])], *dqs[0])) return false;
    }
    Node m = n;
    if (m.sources.empty()) m.sources.push_back(n.name);
    m.kernel = {};
    for (size_t k = 0; k < data; ++k) m.inputs[k] = dqs[k]->inputs[0];
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (qs[k] >= 0) {
        absorb(m, g_.nodes[static_cast<size_t>(qs[k])]);
        m.outputs[k] = int8_result(n.outputs[k], qs[k], -1);
      }
    before_[i].push_back(std::move(m));
    drop_[i] = 1;
    return true;
  }

  // DQ(x) -> an elementwise unary op (kTabulated) with an f32 output: LookupTable of x's codes,
  // the op's values on the 256 codes dequantized computed now by the reference kernels of the
  // DQ and the op, so the table holds exactly what they would compute (a node whose kernel
  // refuses them stays).
  bool lookup_table(size_t i) {
    const Node& n = g_.nodes[i];
    if (n.inputs.size() != 1 || n.outputs.size() != 1 || g_.value(n.outputs[0]).dtype != DType::f32) return false;
    // The DQ read by the op alone: where f32 readers need it too (a SiLU's Mul), the DQ's pass
    // stays, and a linear layer writes its f32 output itself (fold_output_dequantize).
    const Node* t = nullptr;
    const Node* dq = dequantized(n.inputs[0], &t);
    if (!dq || t || single_reader(dq->outputs[0]) != static_cast<int64_t>(i)) return false;
    Graph m;
    const DType code = g_.value(dq->inputs[0]).dtype;
    Tensor every(code, {256});  // each code once
    for (int k = 0; k < 256; ++k) {
      if (code == DType::u8) every.data<uint8_t>()[k] = static_cast<uint8_t>(k);
      else every.data<int8_t>()[k] = static_cast<int8_t>(k - 128);
    }
    const Shape row = Shape::of(std::vector<int64_t>{256});
    Node d = *dq, f = n;
    d.inputs = {m.add_constant("codes", every), m.add_constant("scale", g_.value(dq->inputs[1]).constant),
                m.add_constant("zero", g_.value(dq->inputs[2]).constant)};
    d.outputs = {m.add_value("dequantized", DType::f32, row)};
    f.inputs = d.outputs;
    f.outputs = {m.add_value("values", DType::f32, row)};
    const ValueId values = f.outputs[0];
    d.kernel = f.kernel = {};
    m.nodes = {std::move(d), std::move(f)};
    Result<std::vector<Tensor>> table = evaluate_nodes(m, {0, 1}, {values});
    if (!table.ok()) return false;
    // The Reshapes and Transposes that alone read the op's output (one after the other) move
    // the codes instead, and the table is looked up after them: a quarter of the bytes moved.
    ValueId codes = dq->inputs[0], out = n.outputs[0];
    for (int64_t r = single_reader(out); r >= 0; r = single_reader(out)) {
      const Node& mv = g_.nodes[static_cast<size_t>(r)];
      if ((mv.op != "Reshape" && mv.op != "Transpose") || !mv.domain.empty() || mv.inputs[0] != out || mv.outputs.size() != 1) break;
      codes = move_codes(mv, codes, i)[0];
      out = mv.outputs[0];
      drop_[static_cast<size_t>(r)] = 1;
    }
    Node l = lowered(n, "LookupTable");
    l.inputs = {codes, g_.add_constant(g_.unique_value_name(n.name + "_table"), std::move((*table)[0]))};
    l.outputs = {out};
    before_[i].push_back(std::move(l));
    drop_[i] = 1;
    return true;
  }

  // DQ(x) -> LayerNormalization (constant f32 scale and B, no Mean / InvStdDev read) -> Q:
  // QLayerNormalization, x's rows normalized where they are read and quantized where written.
  bool layer_norm(size_t i) {
    const Node& n = g_.nodes[i];
    if (!n.has_input(0) || !n.has_input(1)) return false;
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (n.outputs[o] != kNoValue && (outputs_.count(n.outputs[o]) || !uses_[static_cast<size_t>(n.outputs[o])].empty())) return false;
    if (n.attr_int("stash_type", 1) != 1 || !g_.value(n.inputs[0]).shape.rank_known) return false;
    for (size_t k : {size_t{1}, size_t{2}})
      if (n.has_input(k) && (!g_.value(n.inputs[k]).is_constant() || g_.value(n.inputs[k]).dtype != DType::f32)) return false;
    const Node* dx = nullptr;
    int64_t q = -1;
    if (!between_qdq(n, &dx, &q)) return false;
    const Node& qn = g_.nodes[static_cast<size_t>(q)];
    Node l = lowered(n, "QLayerNormalization");
    for (const char* a : {"axis", "epsilon"})
      if (const Attribute* at = n.find_attr(a)) l.set_attr(a, at->value);
    l.inputs = {dx->inputs[0], dx->inputs[1], dx->inputs[2], n.inputs[1], qn.inputs[1], qn.inputs[2]};
    if (n.has_input(2)) l.inputs.push_back(n.inputs[2]);
    absorb(l, qn);
    l.outputs = {int8_result(n.outputs[0], q, -1)};
    before_[i].push_back(std::move(l));
    drop_[i] = 1;
    return true;
  }

  // The head size of Q, K or V (value v; `heads` for a 3-D one), or 0 when not known.
  int64_t head_size(ValueId v, int64_t heads) const {
    const Shape& s = g_.value(v).shape;
    if (!s.rank_known || (s.rank() != 3 && s.rank() != 4) || !s.dims.back().is_known()) return 0;
    if (s.rank() == 4) return s.dims.back().value;
    return heads > 0 && s.dims.back().value % heads == 0 ? s.dims.back().value / heads : 0;
  }

  // Q, K and V split from one projection's output, as GPT-2's fused c_attn writes them:
  // v = Split([Reshape](DQ(x)))[j], every output of the Split read by attention node `at`
  // alone (as Q, K or V). Returns the DQ node and sets `split` (and `reshape`, or null); nothing
  // is changed.
  const Node* split_dequantized(ValueId v, size_t at, const Node** split, const Node** reshape) const {
    *split = *reshape = nullptr;
    const Node* s = producer(v);
    if (!s || s->op != "Split" || !s->domain.empty() || !s->has_input(0)) return nullptr;
    for (ValueId o : s->outputs) {
      if (o == kNoValue) continue;
      if (outputs_.count(o)) return nullptr;
      for (const Use& u : uses_[static_cast<size_t>(o)])
        if (u.node != at || u.slot > 2) return nullptr;
    }
    const int64_t si = producers_[static_cast<size_t>(v)];
    const Node* r = producer(s->inputs[0]);
    int64_t reader = si;
    if (r && r->op == "Reshape" && r->domain.empty() && single_reader(r->outputs[0]) == si) {
      *reshape = r;
      reader = producers_[static_cast<size_t>(s->inputs[0])];
      r = producer(r->inputs[0]);
    }
    if (!r || !per_tensor(g_, *r, "DequantizeLinear") || !is_int8(g_.value(r->inputs[0]).dtype) || single_reader(r->outputs[0]) != reader)
      return nullptr;
    *split = s;
    return r;
  }

  // The codes' piece standing for split operand v (split_dequantized's): the first call for a
  // Split places a Reshape (when it had one) and a Split of the codes before node `at`.
  ValueId split_codes(ValueId v, const Node& dq, const Node& split, const Node* reshape, size_t at) {
    const size_t j = static_cast<size_t>(std::find(split.outputs.begin(), split.outputs.end(), v) - split.outputs.begin());
    auto [it, fresh] = split_codes_.try_emplace(&split);
    if (fresh) {
      const ValueId x = reshape ? move_codes(*reshape, dq.inputs[0], at)[0] : dq.inputs[0];
      it->second = move_codes(split, x, at);
    }
    return it->second[j];
  }

  // DQ(q), DQ(k), DQ(v) -> Attention -> [Q]: QAttention, when its AMX kernel takes the heads
  // (at most 256 steps, V's a multiple of 16) and the node is plain attention with f32
  // products: a mask or none, no KV cache, rotary caches or sequence lengths (inputs 4-8), no
  // softcap, only Y read.
  bool attention(size_t i) {
    const Node& n = g_.nodes[i];
    for (size_t k = 4; k < n.inputs.size(); ++k)
      if (n.has_input(k)) return false;
    if (!n.has_input(0) || !n.has_input(1) || !n.has_input(2) || n.outputs.empty()) return false;
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (n.outputs[o] != kNoValue && (outputs_.count(n.outputs[o]) || !uses_[static_cast<size_t>(n.outputs[o])].empty())) return false;
    const std::string precision = n.attr_string("softmax_precision", "f32");
    if (n.attr_string("product_type", "f32") != "f32" || n.attr_float("softcap", 0.0) != 0.0 ||
        (precision != "f32" && precision != "f16" && precision != "bf16"))
      return false;
    const int64_t d = head_size(n.inputs[0], n.attr_int("q_num_heads", 0)), dv = head_size(n.inputs[2], n.attr_int("kv_num_heads", 0));
    if (d <= 0 || d > cpu::amx::kQuantizedHeadMax || dv <= 0 || dv % 16 != 0) return false;
    // Each operand: DQ(codes), Transpose(DQ(codes)), or a piece of a Split of DQ(codes).
    const Node* t[3] = {};
    const Node* dqs[3] = {};
    const Node* split[3] = {};
    const Node* reshape[3] = {};
    for (size_t k = 0; k < 3; ++k) {
      dqs[k] = dequantized(n.inputs[k], &t[k]);
      if (!dqs[k]) dqs[k] = split_dequantized(n.inputs[k], i, &split[k], &reshape[k]);
      if (!dqs[k]) return false;
    }
    ValueId codes[3];
    for (size_t k = 0; k < 3; ++k)
      codes[k] = split[k] ? split_codes(n.inputs[k], *dqs[k], *split[k], reshape[k], i) : int8_operand(*dqs[k], t[k], i);
    int64_t ty = -1;
    const int64_t q = quantized_by(n.outputs[0], &ty);
    Node a = lowered(n, "QAttention");
    for (const char* name : {"is_causal", "kv_num_heads", "q_num_heads", "scale"})
      if (const Attribute* at = n.find_attr(name)) a.set_attr(name, at->value);
    a.inputs = {codes[0], dqs[0]->inputs[1], dqs[0]->inputs[2], codes[1], dqs[1]->inputs[1], dqs[1]->inputs[2],
                codes[2], dqs[2]->inputs[1], dqs[2]->inputs[2], n.has_input(3) ? n.inputs[3] : kNoValue};
    if (q >= 0) {
      const Node& qn = g_.nodes[static_cast<size_t>(q)];
      a.inputs.insert(a.inputs.end(), {qn.inputs[1], qn.inputs[2]});
      absorb(a, qn);
      a.outputs = {int8_result(n.outputs[0], q, ty)};
    } else {
      a.outputs = {n.outputs[0]};
    }
    while (!a.inputs.empty() && a.inputs.back() == kNoValue) a.inputs.pop_back();
    before_[i].push_back(std::move(a));
    drop_[i] = 1;
    return true;
  }

  bool maxpool(size_t i) {
    const Node& p = g_.nodes[i];
    if (p.outputs.size() != 1 && (p.outputs.size() != 2 || p.outputs[1] != kNoValue)) return false;
    const Node* tx = nullptr;
    const Node* dx = dequantized(p.inputs[0], &tx);
    if (!dx) return false;
    int64_t tq = -1;
    const int64_t q = quantized_by(p.outputs[0], &tq);
    if (q < 0) return false;
    const Node& qn = g_.nodes[static_cast<size_t>(q)];
    if (!same_params(qn, *dx)) return false;
    Node n = p;
    n.inputs = {int8_operand(*dx, tx, i)};
    absorb(n, qn);
    n.outputs = {int8_result(p.outputs[0], q, tq)};
    n.kernel = {};
    before_[i].push_back(std::move(n));
    drop_[i] = 1;
    return true;
  }

  Graph& g_;
  std::vector<int32_t> producers_;
  std::vector<std::vector<Use>> uses_;
  std::set<ValueId> outputs_;
  std::vector<char> drop_;
  std::vector<std::vector<Node>> before_;  ///< per node: what replaces it, in order, before it
  std::map<const Node*, std::vector<ValueId>> split_codes_;  ///< per Split of Q, K and V: its pieces of the codes
};

// After the rewrites: a QFusedMatMul whose u8 output only a DequantizeLinear of the same scale
// and zero point reads (whose readers are then float ops: a transformer's Q, K and V before
// its attention) writes that f32 output itself, quantized and dequantized in its store
// (`dequantize_output`): the DQ's pass over the tensor is gone, and the values are the same.
size_t fold_output_dequantize(Graph& g) {
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  std::vector<char> drop(g.nodes.size(), 0);
  size_t folded = 0;
  for (Node& n : g.nodes) {
    if (n.op != "QFusedMatMul" || !n.domain.empty() || n.outputs.size() != 1 || !n.has_input(6) || !n.has_input(7) ||
        n.attr_int("dequantize_output", 0) != 0)
      continue;
    const ValueId y = n.outputs[0];
    const std::vector<Use>& u = uses[static_cast<size_t>(y)];
    if (g.value(y).dtype != DType::u8 || outputs.count(y) || u.size() != 1 || u[0].slot != 0) continue;
    const Node& d = g.nodes[u[0].node];
    if (!per_tensor(g, d, "DequantizeLinear") || d.outputs.size() != 1 || !is_scalar_constant(g, n, 6) || !is_scalar_constant(g, n, 7) ||
        scalar_of(g, d.inputs[1]) != scalar_of(g, n.inputs[6]) || scalar_of(g, d.inputs[2]) != scalar_of(g, n.inputs[7]) ||
        g.value(d.inputs[2]).dtype != DType::u8)
      continue;
    n.set_attr("dequantize_output", int64_t{1});
    n.outputs[0] = d.outputs[0];
    if (d.sources.empty()) n.sources.push_back(d.name);
    for (const std::string& src : d.sources)
      if (std::find(n.sources.begin(), n.sources.end(), src) == n.sources.end()) n.sources.push_back(src);
    drop[u[0].node] = 1;
    ++folded;
  }
  if (folded) {
    erase_nodes(g, drop);
    g.remove_dead();
  }
  return folded;
}

// Before the rewrites: a QuantizeLinear of DQ(x) with DQ's own scale and zero point (a quantized
// model's two edges sharing one observer, once the ops between them went) is x itself, exactly:
// (x - zero) · scale / scale rounds back to x - zero. Its readers read x.
size_t drop_requantization(Graph& g) {
  const std::vector<int32_t> producer = g.producers();
  const std::set<ValueId> outputs(g.outputs.begin(), g.outputs.end());
  size_t dropped = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& q = g.nodes[i];
    if (!per_tensor(g, q, "QuantizeLinear") || q.outputs.size() != 1 || outputs.count(q.outputs[0])) continue;
    const int32_t p = producer[static_cast<size_t>(q.inputs[0])];
    if (p < 0) continue;
    const Node& d = g.nodes[static_cast<size_t>(p)];
    if (!per_tensor(g, d, "DequantizeLinear") || !is_int8(g.value(d.inputs[0]).dtype) ||
        g.value(d.inputs[0]).dtype != g.value(q.outputs[0]).dtype || scalar_of(g, q.inputs[1]) != scalar_of(g, d.inputs[1]) ||
        scalar_of(g, q.inputs[2]) != scalar_of(g, d.inputs[2]))
      continue;
    g.replace_all_uses(q.outputs[0], d.inputs[0]);
    ++dropped;
  }
  if (dropped) g.remove_dead();
  return dropped;
}

}  // namespace

Result<PassResult> lower_int8(Model& model, PassContext& ctx) {
  Graph& g = model.graph;
  g.remove_dead();  // the Transposes back that channels_last left unread would hide single readers
  const size_t requantized = drop_requantization(g);
  Lowering l(g);
  const bool products = !cpu::gemm::lowp_lacks(ctx.target.cpu, cpu::gemm::Lowp::u8s8);
  l.run(products, !cpu::gemm::woq_lacks(ctx.target.cpu), ctx.target.cpu.amx);
  l.finish();
  g.remove_dead();  // the DQs and Qs the int8 nodes replaced
  const size_t dequantized = fold_output_dequantize(g);
  KILN_ASSIGN_OR_RETURN(size_t folded, fold_constant_dequantize(g));
  const size_t lowered = l.convs + l.matmuls + l.weight_only + l.adds + l.pools + l.norms + l.attentions + l.muls + l.averages + l.tables + l.moves;
  if (lowered + dequantized + requantized + l.kept_float == 0 && folded == 0) return PassResult{};
  std::string s;
  if (l.convs + l.matmuls + l.adds + l.pools > 0)
    s = "lowered " + count_of(l.convs, "convolution", "convolutions") + " to QFusedConv, " +
        count_of(l.matmuls, "linear layer", "linear layers") + " to QFusedMatMul, " + count_of(l.adds, "add", "adds") +
        " to QAdd and " + count_of(l.pools, "max pool", "max pools") + " to int8";
  if (l.norms)
    s += (s.empty() ? "lowered " : "; ") + count_of(l.norms, "layer normalization", "layer normalizations") + " to QLayerNormalization";
  if (l.attentions)
    s += (s.empty() ? "lowered " : "; ") + count_of(l.attentions, "attention", "attentions") + " to QAttention";
  if (l.muls)
    s += (s.empty() ? "lowered " : "; ") + count_of(l.muls, "multiplication", "multiplications") + " by f32 factors to QMul";
  if (l.averages)
    s += (s.empty() ? "lowered " : "; ") + count_of(l.averages, "global average pool", "global average pools") + " to QGlobalAveragePool";
  if (l.tables)
    s += (s.empty() ? "lowered " : "; ") + count_of(l.tables, "elementwise op", "elementwise ops") + " of int8 codes to LookupTable";
  if (l.moves)
    s += (s.empty() ? "" : "; ") + count_of(l.moves, "Split, Concat or Resize", "Splits, Concats and Resizes") + " moved int8 codes";
  if (dequantized) s += (s.empty() ? "" : "; ") + count_of(dequantized, "linear layer's output", "linear layers' outputs") + " dequantized in the layer's store";
  if (l.weight_only)
    s += (s.empty() ? "lowered " : "; ") + count_of(l.weight_only, "weight-only linear layer", "weight-only linear layers") +
         " to WoqFusedMatMul";
  if (requantized) s += (s.empty() ? "" : "; ") + count_of(requantized, "requantization", "requantizations") + " with the same scale dropped";
  if (s.empty()) s = "nothing lowered";
  if (folded) s += "; folded " + count_of(folded, "weight DequantizeLinear", "weight DequantizeLinears") + " left float";
  if (l.kept_float)
    s += "; kept " + count_of(l.kept_float, "convolution or linear layer", "convolutions and linear layers") +
         " f32 (int8 products need avx512-vnni, which the target lacks)";
  return PassResult{true, s};
}

}  // namespace kiln
