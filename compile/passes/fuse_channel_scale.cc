// fuse_channel_scale: a per-channel scale of a pointwise convolution's input (a
// squeeze-excitation's gates) moves onto the convolution's weight.
//
//   Mul(D, S [1, 1, 1, C]) -> FusedConv 1x1(., W [K, C, 1, 1], ...)
//     =>   FusedConv 1x1(D, Mul(W, Reshape(S, [1, C, 1, 1])), ...)
//
// EfficientNet's blocks end so: the depthwise output D (112x112x32 to 14x14x672) is scaled by
// its squeeze-excitation's sigmoid gates, one per channel, and projected. The Mul wrote D again
// for the projection to read; scaling the weight's K · C values instead touches a fraction of
// that where the image has many more pixels than the convolution has output channels (the
// rule, below), and kiln's f32 GEMM packs a weight computed at run time once a run. Channels-
// last, f32, the scale's C values shared by every image, the weight a constant [K, C, 1, 1],
// stride 1, no padding, no parts; the target needs AVX2 (kiln's GEMM).
#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/match.h"
#include "formats/infer.h"

namespace kiln {

namespace {

// The rule: fuse where the image has at least this many pixels per output channel of the
// convolution (docs/architecture.md has the table): EfficientNet-B0's 56x56 and 28x28
// projections (20-130 pixels a channel) took 0.95-0.97 of their blocks' time at one and two
// threads, its 14x14 ones (1.75 and 2.45) 1.08-1.71, the weight's packing each run outweighing
// the Mul.
constexpr int64_t kPixelsPerChannel = 4;
// ... and more output channels than this: kiln's GEMM computes 32 columns for 16 (EfficientNet-
// B0's 112x112 projection to 16 took 185 µs so against oneDNN's 118, for a Mul of 38).
constexpr int64_t kFewChannels = 16;

// Whether `n` is a pointwise convolution of `x` (pointwise_conv_of) that kiln's f32 GEMM reads
// as it is: X and W not int8 codes, Y f32.
bool plain_pointwise(const Graph& g, const Node& n, ValueId x) {
  return pointwise_conv_of(g, n, x) && !n.has_attr("int8_operands") && !n.has_attr("output_type");
}

// Whether `s` is an f32 scale of `c` channels broadcast over the rest of a rank-4 channels-last
// tensor: shape [..., C] with every other dim 1.
bool per_channel(const Value& s, int64_t c) {
  if (s.dtype != DType::f32 || !s.shape.is_concrete() || s.shape.rank() < 1 || s.shape.rank() > 4) return false;
  const std::vector<int64_t> d = s.shape.concrete();
  return d.back() == c && shape_numel(d) == c;
}

}  // namespace

Result<PassResult> fuse_channel_scale(Model& model, PassContext& ctx) {
  if (!ctx.target.cpu.avx2 || !ctx.target.cpu.fma) return PassResult{};
  Graph& g = model.graph;
  const Matcher m(g);
  Rewrite rw(g);
  size_t fused = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& mul = g.nodes[i];
    if (mul.op != "Mul" || !mul.domain.empty() || mul.inputs.size() != 2 || mul.outputs.size() != 1) continue;
    const Node* conv = m.single_reader(mul.outputs[0]);
    if (!conv || !plain_pointwise(g, *conv, mul.outputs[0]) || !rw.free({i, m.index(*conv)})) continue;
    const Value& y = g.value(mul.outputs[0]);
    if (y.dtype != DType::f32 || !y.shape.is_concrete() || y.shape.rank() != 4) continue;
    const std::vector<int64_t> ys = y.shape.concrete();
    const int64_t c = ys[3], k = g.value(conv->inputs[1]).constant.dim(0);
    // D: the input of the Mul's output shape; S: the other, per channel.
    size_t d_at = 2;
    for (size_t j = 0; j < 2; ++j)
      if (g.value(mul.inputs[j]).shape == y.shape && per_channel(g.value(mul.inputs[1 - j]), c)) d_at = j;
    if (d_at == 2 || g.value(mul.inputs[d_at]).dtype != DType::f32) continue;
    if (ys[0] * ys[1] * ys[2] < kPixelsPerChannel * k || k <= kFewChannels) continue;
    const ValueId d = mul.inputs[d_at], s = mul.inputs[1 - d_at];
    const std::string base = g.value(conv->inputs[1]).name;  // a copy: adding values moves them
    Node reshape;
    reshape.name = mul.name + "_per_input_channel";
    reshape.op = "Reshape";
    reshape.sources = merged_sources(g, {i});
    reshape.inputs = {s, g.add_constant(reshape.name + "_shape", Tensor::from<int64_t>({4}, {1, c, 1, 1}))};
    reshape.outputs = {g.add_value(reshape.name, DType::f32, Shape::of(std::vector<int64_t>{1, c, 1, 1}))};
    Node scale;
    scale.name = mul.name + "_weight";
    scale.op = "Mul";
    scale.sources = reshape.sources;
    scale.inputs = {conv->inputs[1], reshape.outputs[0]};
    scale.outputs = {g.add_value(base + "_scaled", DType::f32, g.value(conv->inputs[1]).shape)};
    Node scaled = *conv;
    scaled.inputs[0] = d;
    scaled.inputs[1] = scale.outputs[0];
    rw.add(std::move(reshape));
    rw.add(std::move(scale));
    rw.replace({i, m.index(*conv)}, std::move(scaled));
    ++fused;
  }
  if (fused == 0) return PassResult{};
  KILN_RETURN_IF_ERROR(rw.commit());
  KILN_RETURN_IF_ERROR(infer_graph(g).status());
  return PassResult{true, "moved " + count_of(fused, "per-channel scale", "per-channel scales") +
                              " of a pointwise convolution's input onto its weight"};
}

}  // namespace kiln
