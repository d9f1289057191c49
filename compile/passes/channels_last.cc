// channels_last: 2-D convolutions and pools run on [N, H, W, C] activations, the layout
// oneDNN's fastest kernels here take (brgemm convolutions, depthwise ones included), with
// transposes only where the graph enters and leaves the channels-last region.
//
// Walking the nodes in order, each f32 rank-4 Conv / FusedConv / MaxPool (without Indices) /
// AveragePool / GlobalAveragePool / GlobalMaxPool becomes a channels_last = 1 node (a Conv
// becomes a FusedConv), and so does every layout-agnostic node all of whose activations are
// already channels-last: elementwise ops (rank-4 output; constant operands permuted to match),
// Concat and Split (the axis renumbered), Resize by constant scales or sizes (permuted),
// per-tensor QuantizeLinear and DequantizeLinear (a quantized model's int8 activations). Each
// value such a node writes gets a channels-last twin; the original value is then computed by a
// Transpose back, which eliminate_dead drops when nothing channels-first reads it. A
// channels-first value that a converted node reads is transposed once and shared, but for a
// graph input that a convolution kiln.direct_conv takes reads (an image model's first layer
// over RGB): that one reads the image as it comes (FusedConv's x_channels_first), and the
// Transpose's copy of the image, 50-150 µs at one thread, is not made (but for --precision bf16
// on AMX with a long window, where the first layer runs on bf16 tiles after the Transpose:
// kTileWindowSteps).
#include <algorithm>
#include <cstring>
#include <set>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/ops/nn_util.h"
#include "runtime/kernel.h"
#include "runtime/ref/layout.h"

namespace kiln {

namespace {

// Under --precision bf16 on AMX, a first layer whose window has this many steps of K (C · KH ·
// KW) or more leaves the image to a Transpose and runs on bf16 tiles (lower_precision, oneDNN's
// AMX kernel). One thread, the layer and the Transpose against kiln.direct_conv's f32 read:
// ResNet-50's 7x7 stem (147 steps) 326 + 47 against 1,323 µs, the model 0.884 of its time;
// the 3x3 stems over RGB (27 steps) lost: YOLO's 455 + 84 against 267 µs, EfficientNet-B0's
// 377 + 44 against 254. An f16 compile keeps the direct read everywhere: its kernels decline
// three input channels, and oneDNN's f32 one after the Transpose was no faster.
constexpr int64_t kTileWindowSteps = 64;

const std::set<std::string, std::less<>> kAnchors = {"Conv", "FusedConv", "MaxPool", "AveragePool", "GlobalAveragePool",
                                                    "GlobalMaxPool"};
const std::set<std::string, std::less<>> kUnary = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
                                                  "Gelu", "Elu", "Softplus", "Exp", "Neg", "Abs", "Sqrt", "Erf",
                                                  "Identity", "Clip"};
const std::set<std::string, std::less<>> kBroadcasting = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow"};

// Rank 4 is all the pass needs to know: symbolic dims (a batch left open without --input-shape)
// permute like the others, and the kernels are chosen on concrete shapes when a run plans.
bool rank4_f32(const Value& v) { return v.dtype == DType::f32 && v.shape.rank() == 4; }

// QuantizeLinear / DequantizeLinear with one scale and zero point (constants): elementwise, so
// layout-agnostic, between f32 and u8 / s8 tensors (a quantized model's, which lower_int8 then
// turns into int8 kernels).
bool per_tensor_qdq(const Graph& g, const Node& n) {
  if (n.op != "QuantizeLinear" && n.op != "DequantizeLinear") return false;
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (n.has_input(i) && (!g.value(n.inputs[i]).is_constant() || g.value(n.inputs[i]).constant.numel() != 1)) return false;
  const Value& x = g.value(n.inputs[0]);
  const Value& y = g.value(n.outputs[0]);
  return x.shape.rank() == 4 && y.shape.rank() == 4;
}

class Converter {
 public:
  /// `bf16_tiles`: lower_precision will run the convolutions on bf16 AMX tiles (--precision
  /// bf16 on a CPU with AMX).
  Converter(Graph& g, const Target& target, bool bf16_tiles)
      : g_(g), target_(target), bf16_tiles_(bf16_tiles), twin_(g.values.size(), kNoValue) {}

  // Whether node n runs channels-last.
  bool wanted(const Node& n) const {
    if (!n.domain.empty() || n.outputs.empty() || n.outputs[0] == kNoValue) return false;
    if (per_tensor_qdq(g_, n)) return has_twin(n.inputs[0]);
    for (ValueId o : n.outputs)
      if (o != kNoValue && !rank4_f32(g_.value(o))) return false;
    if (kAnchors.count(n.op)) {
      if (!n.has_input(0) || !rank4_f32(g_.value(n.inputs[0])) || nn::channels_last(n)) return false;
      if (n.op == "MaxPool" && n.outputs.size() > 1 && n.outputs[1] != kNoValue) return false;
      return n.op != "Conv" || n.inputs.size() <= 3;
    }
    if (kUnary.count(n.op)) return n.has_input(0) && has_twin(n.inputs[0]);
    if (n.op == "Concat") {
      for (ValueId v : n.inputs)
        if (!has_twin(v)) return false;
      return true;
    }
    if (n.op == "Split") return n.has_input(0) && has_twin(n.inputs[0]);  // input 1, the sizes, is not an activation
    if (n.op == "Resize") {
      if (n.has_attr("axes") || !n.has_input(0) || !has_twin(n.inputs[0])) return false;
      for (size_t i = 1; i < n.inputs.size(); ++i)
        if (n.has_input(i) && !constant_of_size(n.inputs[i], i == 1 ? 8 : 4)) return false;
      return true;
    }
    if (kBroadcasting.count(n.op)) {
      bool any = false;
      for (ValueId v : n.inputs) {
        if (v == kNoValue) return false;
        if (has_twin(v)) {
          any = true;
          continue;
        }
        const Value& c = g_.value(v);
        if (!c.is_constant() || c.constant.rank() > 4) return false;
      }
      return any;
    }
    return false;
  }

  // Appends n, converted, to `out`, with the transposes into and out of the channels-last region.
  void convert(Node n, std::vector<Node>& out) {
    ++converted_;
    const bool anchor = kAnchors.count(n.op) > 0;
    if (reads_image(n)) n.set_attr("x_channels_first", int64_t{1});
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      if (v == kNoValue) continue;
      if (has_twin(v)) {
        n.inputs[i] = twin_[static_cast<size_t>(v)];
      } else if (anchor ? nn::layout_input(n, i) : kBroadcasting.count(n.op) > 0) {
        n.inputs[i] = g_.value(v).is_constant() ? permuted_constant(v) : transposed_in(v, out);
      } else if (n.op == "Resize") {
        n.inputs[i] = permuted_vector(v, i == 1);
      }
    }
    if (n.op == "Conv") n.op = "FusedConv";
    if (anchor) n.set_attr("channels_last", int64_t{1});
    if (n.op == "Concat" || n.op == "Split") {
      int64_t axis = n.attr_int("axis", 0);
      if (axis < 0) axis += 4;
      const std::vector<int64_t> perm = nn::channels_last_perm(4);
      for (int64_t j = 0; j < 4; ++j)
        if (perm[static_cast<size_t>(j)] == axis) n.set_attr("axis", j);
    }
    std::vector<ValueId> originals = n.outputs;
    for (ValueId& o : n.outputs) {
      if (o == kNoValue) continue;
      const Value& v = g_.value(o);
      const ValueId t = g_.add_value(v.name + "_nhwc", v.dtype, last_shape(v.shape));
      set_twin(o, t);
      o = t;
    }
    out.push_back(std::move(n));
    for (ValueId o : originals)
      if (o != kNoValue) {
        back_.push_back(o);
        out.push_back(transpose(twin_[static_cast<size_t>(o)], o, nn::channels_first_perm(4)));
      }
  }

  // How many of the Transposes back have a reader (a channels-first node or a graph output).
  size_t transposes_out() const {
    const std::vector<size_t> readers = reader_counts(g_);
    size_t n = 0;
    for (ValueId o : back_) n += readers[static_cast<size_t>(o)] > 0;
    return n;
  }

  size_t converted() const { return converted_; }
  size_t transposes_in() const { return transposes_in_; }

 private:
  bool has_twin(ValueId v) const { return v != kNoValue && static_cast<size_t>(v) < twin_.size() && twin_[static_cast<size_t>(v)] != kNoValue; }

  void set_twin(ValueId v, ValueId t) {
    if (twin_.size() <= static_cast<size_t>(v)) twin_.resize(static_cast<size_t>(v) + 1, kNoValue);
    twin_[static_cast<size_t>(v)] = t;
  }

  // The steps of K in one output's window (C · KH · KW), or 0 when the weight is not a constant.
  int64_t window_steps(const Node& n) const {
    const Value& w = g_.value(n.inputs[1]);
    if (!w.is_constant() || w.constant.rank() < 2) return 0;
    return w.constant.numel() / w.constant.dim(0);
  }

  // Whether convolution n reads a graph input that kiln.direct_conv would read channels-first:
  // the kernel itself is asked, on the node as it would be, with each symbolic dim (an open
  // batch, height or width) at 1: what it checks (channels, filter, strides) does not change
  // with them, and an empty input runs no kernel. Not when the convolutions go to bf16 AMX
  // tiles and the window is long enough to fill them (kTileWindowSteps): there the image's
  // Transpose lets lower_precision take the first layer too.
  bool reads_image(const Node& n) const {
    if ((n.op != "Conv" && n.op != "FusedConv") || n.inputs.size() < 2 || n.inputs.size() > 3 || n.outputs.size() != 1 ||
        n.has_attr("x_parts"))
      return false;
    if (bf16_tiles_ && window_steps(n) >= kTileWindowSteps) return false;
    const ValueId x = n.inputs[0];
    if (has_twin(x) || std::find(g_.inputs.begin(), g_.inputs.end(), x) == g_.inputs.end()) return false;
    Node c = n;
    c.op = "FusedConv";
    c.set_attr("channels_last", int64_t{1});
    c.set_attr("x_channels_first", int64_t{1});
    std::vector<InferInput> in;
    for (ValueId v : c.inputs) {
      if (v == kNoValue) {
        in.emplace_back();
        continue;
      }
      const Value& value = g_.value(v);
      in.push_back({value.dtype, at_one(value.shape), value.is_constant() ? &value.constant : nullptr});
    }
    const Value& y = g_.value(n.outputs[0]);
    const InferOutput out[] = {{y.dtype, at_one(last_shape(y.shape)), Tensor()}};
    const KernelQuery q{c, g_, target_, in, out};
    for (const KernelImpl& impl : default_kernels().find("FusedConv", target_.device))
      if (impl.name.starts_with("kiln.direct_conv") && !impl.declines(q)) return true;
    return false;
  }

  bool constant_of_size(ValueId v, int64_t n) const {
    const Value& c = g_.value(v);
    return c.is_constant() && c.constant.rank() == 1 && (c.constant.numel() == n || c.constant.numel() == 0);
  }

  static Shape last_shape(const Shape& s) { return Shape(nn::permute(s.dims, nn::channels_last_perm(4))); }
  // `s` with each dim not known at 1 (a shape of unknown rank as it is).
  static Shape at_one(Shape s) {
    for (Dim& d : s.dims)
      if (!d.is_known()) d = Dim::known(1);
    return s;
  }

  Node transpose(ValueId from, ValueId to, std::vector<int64_t> perm) {
    Node t;
    t.op = "Transpose";
    t.name = g_.value(to).name + "_transpose";
    t.inputs = {from};
    t.outputs = {to};
    t.set_attr("perm", std::move(perm));
    return t;
  }

  // The channels-last twin of a channels-first activation, made once.
  ValueId transposed_in(ValueId v, std::vector<Node>& out) {
    const Value& x = g_.value(v);
    const ValueId t = g_.add_value(x.name + "_nhwc", x.dtype, last_shape(x.shape));
    out.push_back(transpose(v, t, nn::channels_last_perm(4)));
    set_twin(v, t);
    ++transposes_in_;
    return t;
  }

  // A constant operand of a broadcasting op: aligned to rank 4 from the right (as broadcasting
  // aligns it to the NCHW operand), then permuted like the activations.
  ValueId permuted_constant(ValueId v) {
    const Value& c = g_.value(v);
    if (c.constant.numel() <= 1) return v;
    std::vector<int64_t> shape = c.constant.shape();
    shape.insert(shape.begin(), 4 - shape.size(), 1);
    Tensor t = ref::permuted(c.constant.reshaped(shape), nn::channels_last_perm(4));
    return g_.add_constant(c.name + "_nhwc", std::move(t));
  }

  // Resize's scales or sizes (4 values) or roi (starts then ends, 8) in channels-last order.
  ValueId permuted_vector(ValueId v, bool roi) {
    const Value& c = g_.value(v);
    if (c.constant.numel() == 0) return v;
    const Tensor halves = roi ? c.constant.reshaped({2, 4}) : c.constant.reshaped({1, 4});
    Tensor t(halves.dtype(), halves.shape());
    const size_t es = dtype_size(t.dtype());
    const std::vector<int64_t> perm = nn::channels_last_perm(4);
    for (int64_t h = 0; h < halves.dim(0); ++h)
      for (size_t j = 0; j < 4; ++j)
        std::memcpy(static_cast<std::byte*>(t.raw()) + (static_cast<size_t>(h) * 4 + j) * es,
                    static_cast<const std::byte*>(halves.raw()) + (static_cast<size_t>(h) * 4 + static_cast<size_t>(perm[j])) * es, es);
    return g_.add_constant(c.name + "_nhwc", t.reshaped(c.constant.shape()));
  }

  Graph& g_;
  const Target& target_;
  bool bf16_tiles_;
  std::vector<ValueId> twin_;  ///< per value: its channels-last twin, or kNoValue
  std::vector<ValueId> back_;  ///< the values the Transposes back write
  size_t converted_ = 0, transposes_in_ = 0;
};

}  // namespace

Result<PassResult> channels_last(Model& model, PassContext& ctx) {
  Graph& g = model.graph;
  Converter c(g, ctx.target, ctx.precision == DType::bf16 && ctx.target.cpu.amx);
  std::vector<Node> nodes = std::move(g.nodes);
  g.nodes.clear();
  std::vector<Node> out;
  out.reserve(nodes.size());
  for (Node& n : nodes) {
    if (c.wanted(n))
      c.convert(std::move(n), out);
    else
      out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
  if (c.converted() == 0) return PassResult{};
  return PassResult{true, "ran " + count_of(c.converted(), "node", "nodes") + " channels-last, with " +
                              count_of(c.transposes_in(), "transpose", "transposes") + " in and " +
                              count_of(c.transposes_out(), "transpose", "transposes") + " out"};
}

}  // namespace kiln
