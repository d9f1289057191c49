// Core ops of the misc family: the recurrent layers (RNN, GRU, LSTM), NonMaxSuppression, the
// signal ops (HannWindow, HammingWindow, BlackmanWindow, DFT, STFT, MelWeightMatrix) and Det.
// Semantics are the newest ONNX versions'; shapes that depend on input data (window sizes, DFT
// lengths, the NMS selection count) are concrete when that data is known.
#include <algorithm>

#include "formats/checked.h"
#include "formats/op_schema.h"

namespace kiln {

namespace {

Dim dim_of(const Shape& s, size_t i) { return s.rank_known && i < s.dims.size() ? s.dims[i] : Dim::unknown(); }

// A scalar / one-element integer input's value when known.
std::optional<int64_t> known_int(const InferContext& ctx, size_t i) {
  const Tensor* t = ctx.value(i);
  if (!t || t->numel() != 1) return std::nullopt;
  return t->as_int64(0);
}

// ---- recurrent layers --------------------------------------------------------------------

// gates: 1 for RNN, 3 for GRU, 4 for LSTM.
Status infer_recurrent(InferContext& ctx, int gates) {
  const Node& n = ctx.node();
  DType t = ctx.dtype(0);
  std::string direction = n.attr_string("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return ctx.error("unknown direction '" + direction + "'");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const int64_t layout = n.attr_int("layout", 0);
  if (layout != 0 && layout != 1) return ctx.error("layout " + std::to_string(layout) + " is not 0 or 1");
  const Shape& x = ctx.shape(0);
  const Shape& w = ctx.shape(1);
  if (x.rank_known && x.rank() != 3) return ctx.error("X has shape " + x.str() + "; expected rank 3");
  if (w.rank_known && w.rank() != 3) return ctx.error("W has shape " + w.str() + "; expected rank 3");
  Dim hidden = n.has_attr("hidden_size") ? Dim::known(n.attr_int("hidden_size", 0)) : Dim::unknown();
  if (!hidden.is_known() && ctx.shape(2).rank_known && ctx.shape(2).rank() == 3) hidden = ctx.shape(2).dims[2];
  if (hidden.is_known() && hidden.value <= 0) return ctx.error("hidden_size must be positive");
  Dim wd = dim_of(w, 0), wg = dim_of(w, 1);
  if (wd.is_known() && wd.value != dirs)
    return ctx.error("W has " + std::to_string(wd.value) + " directions but direction is '" + direction + "'");
  if (wg.is_known() && hidden.is_known() && CheckedInt(wg.value) != CheckedInt(gates) * hidden.value)
    return ctx.error("W has " + std::to_string(wg.value) + " rows; expected " + std::to_string(gates) + " x hidden_size " +
                     std::to_string(hidden.value));
  if (dim_of(x, 2).is_known() && dim_of(w, 2).is_known() && dim_of(x, 2).value != dim_of(w, 2).value)
    return ctx.error("X has input size " + std::to_string(dim_of(x, 2).value) + " but W expects " +
                     std::to_string(dim_of(w, 2).value));
  for (const std::string& a : n.attr_strings("activations")) {
    static const char* known[] = {"Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
                                  "HardSigmoid", "Elu", "Softsign", "Softplus"};
    if (std::none_of(std::begin(known), std::end(known), [&](const char* k) { return a == k; }))
      return ctx.error("unknown activation '" + a + "'");
  }
  Dim seq = dim_of(x, layout == 0 ? 0 : 1), batch = dim_of(x, layout == 0 ? 1 : 0);
  if (!x.rank_known) seq = batch = Dim::unknown();
  Dim nd = Dim::known(dirs);
  ctx.set_output(0, t, layout == 0 ? Shape({seq, nd, batch, hidden}) : Shape({batch, seq, nd, hidden}));
  Shape state = layout == 0 ? Shape({nd, batch, hidden}) : Shape({batch, nd, hidden});
  ctx.set_output(1, t, state);
  if (gates == 4) ctx.set_output(2, t, state);
  return {};
}

Status infer_rnn(InferContext& ctx) { return infer_recurrent(ctx, 1); }
Status infer_gru(InferContext& ctx) { return infer_recurrent(ctx, 3); }
Status infer_lstm(InferContext& ctx) { return infer_recurrent(ctx, 4); }

std::vector<AttrSpec> recurrent_attrs(int gates) {
  std::vector<AttrSpec> a = {
      {"activation_alpha", AttrType::floats, false, "alpha of the activations that take one, in order"},
      {"activation_beta", AttrType::floats, false, "beta of the activations that take one, in order"},
      {"activations", AttrType::strings, false, "activation names per direction"},
      {"clip", AttrType::float64, false, "clip gate pre-activations to [-clip, clip]"},
      {"direction", AttrType::string, false, "forward (default), reverse or bidirectional"},
      {"hidden_size", AttrType::int64, false, "hidden units; default from R"},
      {"layout", AttrType::int64, false, "0: [seq, batch, ...] (default), 1: [batch, seq, ...]"}};
  if (gates == 3) a.push_back({"linear_before_reset", AttrType::int64, false, "apply R before the reset gate"});
  if (gates == 4) a.push_back({"input_forget", AttrType::int64, false, "couple the input and forget gates"});
  return a;
}

// ---- NonMaxSuppression -------------------------------------------------------------------

Status infer_nms(InferContext& ctx) {
  const Shape& b = ctx.shape(0);
  const Shape& s = ctx.shape(1);
  if (b.rank_known && (b.rank() != 3 || (b.dims[2].is_known() && b.dims[2].value != 4)))
    return ctx.error("boxes have shape " + b.str() + "; expected [batch, boxes, 4]");
  if (s.rank_known && s.rank() != 3) return ctx.error("scores have shape " + s.str() + "; expected [batch, classes, boxes]");
  int64_t cpb = ctx.node().attr_int("center_point_box", 0);
  if (cpb != 0 && cpb != 1) return ctx.error("center_point_box " + std::to_string(cpb) + " is not 0 or 1");
  ctx.set_output(0, DType::i64, Shape({Dim::unknown(), Dim::known(3)}));
  return {};
}

// ---- signal ops --------------------------------------------------------------------------

Status infer_window(InferContext& ctx) {
  if (ctx.shape(0).is_concrete() && shape_numel(ctx.shape(0).concrete()) != 1)
    return ctx.error("size must be a scalar, got shape " + ctx.shape(0).str());
  KILN_ASSIGN_OR_RETURN(DType out, dtype_attr(ctx, "output_datatype", DType::f32));
  if (!is_float(out) && !is_integer(out)) return ctx.error("output_datatype " + std::string(dtype_name(out)) + " is not numeric");
  auto size = known_int(ctx, 0);
  if (size && *size < 0) return ctx.error("window size " + std::to_string(*size) + " is negative");
  ctx.set_output(0, out, Shape({size ? Dim::known(*size) : Dim::unknown()}));
  return {};
}

Status infer_dft(InferContext& ctx) {
  const Node& n = ctx.node();
  const Shape& x = ctx.shape(0);
  const bool inverse = n.attr_int("inverse", 0) != 0, onesided = n.attr_int("onesided", 0) != 0;
  if (!x.rank_known) { ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank()); return {}; }
  if (x.rank() < 2) return ctx.error("input has shape " + x.str() + "; expected rank >= 2 with a trailing 1 or 2");
  const Dim& last = x.dims.back();
  if (last.is_known() && last.value != 1 && last.value != 2)
    return ctx.error("input's last dim is " + std::to_string(last.value) + "; expected 1 (real) or 2 (complex)");
  int64_t axis = -2;
  if (ctx.has_input(2)) {
    auto a = known_int(ctx, 2);
    if (!a) { ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(x.dims.size(), Dim::unknown()))); return {}; }
    axis = *a;
  }
  KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(axis, x.rank(), ctx));
  if (ax == x.rank() - 1) return ctx.error("axis " + std::to_string(axis) + " is the real/imaginary dim");
  Dim len = x.dims[static_cast<size_t>(ax)];
  if (ctx.has_input(1)) {
    auto l = known_int(ctx, 1);
    len = l ? Dim::known(*l) : Dim::unknown();
    if (l && *l <= 0) return ctx.error("dft_length " + std::to_string(*l) + " must be positive");
  } else if (inverse && onesided) {
    if (len.is_known()) {
      std::optional<int64_t> full = checked_mul(2, len.value - 1);
      if (!full) return ctx.error("the onesided length " + std::to_string(len.value) + " doubled overflows int64");
      len = Dim::known(*full);
    }
  }
  std::vector<Dim> out = x.dims;
  out[static_cast<size_t>(ax)] = (!inverse && onesided) ? (len.is_known() ? Dim::known(len.value / 2 + 1) : Dim::unknown()) : len;
  out.back() = Dim::known(inverse && onesided ? 1 : 2);
  ctx.set_output(0, ctx.dtype(0), Shape(std::move(out)));
  return {};
}

Status infer_stft(InferContext& ctx) {
  const Shape& x = ctx.shape(0);
  if (x.rank_known && x.rank() != 3) return ctx.error("signal has shape " + x.str() + "; expected [batch, length, 1 or 2]");
  auto step = known_int(ctx, 1);
  if (step && *step <= 0) return ctx.error("frame_step " + std::to_string(*step) + " must be positive");
  std::optional<int64_t> flen;
  if (ctx.has_input(3)) flen = known_int(ctx, 3);
  else if (ctx.has_input(2) && dim_of(ctx.shape(2), 0).is_known()) flen = dim_of(ctx.shape(2), 0).value;
  else if (!ctx.has_input(2) && dim_of(x, 1).is_known()) flen = dim_of(x, 1).value;
  Dim frames = Dim::unknown();
  if (step && flen && dim_of(x, 1).is_known()) {
    if (*flen <= 0 || *flen > dim_of(x, 1).value)
      return ctx.error("frame length " + std::to_string(*flen) + " is out of range for signal length " +
                       std::to_string(dim_of(x, 1).value));
    frames = Dim::known(1 + (dim_of(x, 1).value - *flen) / *step);
  }
  const bool onesided = ctx.node().attr_int("onesided", 1) != 0;
  Dim bins = flen ? Dim::known(onesided ? *flen / 2 + 1 : *flen) : Dim::unknown();
  ctx.set_output(0, ctx.dtype(0), Shape({dim_of(x, 0), frames, bins, Dim::known(2)}));
  return {};
}

Status infer_mel(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DType out, dtype_attr(ctx, "output_datatype", DType::f32));
  auto bins = known_int(ctx, 0), len = known_int(ctx, 1);
  if (bins && *bins < 0) return ctx.error("num_mel_bins " + std::to_string(*bins) + " is negative");
  if (len && *len <= 0) return ctx.error("dft_length " + std::to_string(*len) + " must be positive");
  ctx.set_output(0, out, Shape({len ? Dim::known(*len / 2 + 1) : Dim::unknown(), bins ? Dim::known(*bins) : Dim::unknown()}));
  return {};
}

Status infer_det(InferContext& ctx) {
  const Shape& x = ctx.shape(0);
  if (!x.rank_known) { ctx.set_output(0, ctx.dtype(0), Shape::unknown_rank()); return {}; }
  if (x.rank() < 2) return ctx.error("input has shape " + x.str() + "; expected [..., M, M]");
  const Dim& a = x.dims[x.dims.size() - 2];
  const Dim& b = x.dims.back();
  if (a.is_known() && b.is_known() && a.value != b.value) return ctx.error("input has shape " + x.str() + "; matrices must be square");
  ctx.set_output(0, ctx.dtype(0), Shape(std::vector<Dim>(x.dims.begin(), x.dims.end() - 2)));
  return {};
}

std::vector<AttrSpec> window_attrs() {
  return {{"output_datatype", AttrType::string, false, "dtype of the window, default f32"},
          {"periodic", AttrType::int64, false, "1 (default): periodic window, 0: symmetric"}};
}

}  // namespace

void register_misc_ops(OpRegistry& r) {
  using namespace types;
  // LSTM's inputs; RNN and GRU take the first six.
  const std::vector<TypeConstraint> lstm_types = {
      input(0, kFloat, "X"), same_as(1, 0, "W"), same_as(2, 0, "R"), same_as(3, 0, "B"), input(4, DType::i32, "sequence_lens"),
      same_as(5, 0, "initial_h"), same_as(6, 0, "initial_c"), same_as(7, 0, "P")};
  const std::vector<TypeConstraint> rnn_types(lstm_types.begin(), lstm_types.begin() + 6);
  const std::vector<TypeConstraint> window_types = {input(0, kInt, "size")};
  r.add("", OpSchema{"RNN", "Elman RNN: H = f(X W^T + H R^T + b)", 3, 6, 0, 2, recurrent_attrs(1), infer_rnn})
      .traits.types = rnn_types;
  r.add("", OpSchema{"GRU", "gated recurrent unit (gates z, r, h)", 3, 6, 0, 2, recurrent_attrs(3), infer_gru})
      .traits.types = rnn_types;
  r.add("", OpSchema{"LSTM", "long short-term memory (gates i, o, f, c), optional peepholes", 3, 8, 0, 3,
                     recurrent_attrs(4), infer_lstm}).traits.types = lstm_types;
  r.add("", OpSchema{"NonMaxSuppression", "greedy per-class box selection by score and IoU", 2, 5, 1, 1,
                     {{"center_point_box", AttrType::int64, false, "0: [y1, x1, y2, x2] (default), 1: [xc, yc, w, h]"}},
                     infer_nms})
      .traits.types = {input(0, kFloat, "boxes"), same_as(1, 0, "scores"), input(2, DType::i64, "max_output_boxes_per_class")};
  r.add("", OpSchema{"HannWindow", "sin^2(pi n / N)", 1, 1, 1, 1, window_attrs(), infer_window})
      .traits.types = window_types;
  r.add("", OpSchema{"HammingWindow", "25/46 - 21/46 cos(2 pi n / N)", 1, 1, 1, 1, window_attrs(), infer_window})
      .traits.types = window_types;
  r.add("", OpSchema{"BlackmanWindow", "0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)", 1, 1, 1, 1,
                     window_attrs(), infer_window}).traits.types = window_types;
  r.add("", OpSchema{"DFT", "discrete Fourier transform along an axis; complex as a trailing dim of 2", 1, 3, 1, 1,
                     {{"inverse", AttrType::int64, false, "1: inverse transform (scaled by 1/n)"},
                      {"onesided", AttrType::int64, false, "1: only the n/2+1 non-redundant bins"}},
                     infer_dft}).traits.types = {input(0, kFloat)};
  r.add("", OpSchema{"STFT", "short-time Fourier transform of [batch, length, 1|2] signals", 2, 4, 1, 1,
                     {{"onesided", AttrType::int64, false, "1 (default): only the non-redundant bins"}}, infer_stft})
      .traits.types = {input(0, kFloat, "signal")};
  r.add("", OpSchema{"MelWeightMatrix", "triangular mel filter bank of shape [dft_length/2+1, num_mel_bins]", 5, 5, 1,
                     1, {{"output_datatype", AttrType::string, false, "dtype of the matrix, default f32"}}, infer_mel})
      .traits.types = {input(0, kInt, "num_mel_bins"), input(1, kInt, "dft_length"), input(2, kInt, "sample_rate")};
  r.add("", OpSchema{"Det", "determinant of square matrices [..., M, M]", 1, 1, 1, 1, {}, infer_det})
      .traits.types = {input(0, kFloat)};
}

}  // namespace kiln
