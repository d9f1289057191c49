// ONNX converters of the nn family. Most ops map one to one onto the core op of the same name
// (whose semantics are the newest ONNX version's); older versions are normalised here:
// attributes that later became inputs become constant inputs, renamed enum values are renamed,
// and Upsample / Resize-10 become Resize with the coordinate mapping they implied.
#include <string>

#include "export/converter.h"

namespace kiln {

namespace {

// Gemm before opset 7 has a `broadcast` flag; C broadcasting is the later default.
Status convert_gemm(ConvertContext& ctx) {
  auto n = ctx.emit_passthrough("Gemm", {"broadcast"});
  return n.ok() ? Status() : Status(n.error());
}

// LpPool / GlobalLpPool version 1 have a float `p`; later versions an int.
Status convert_lp_pool_v1(ConvertContext& ctx) {
  double p = ctx.attr_float("p", 2.0);
  if (p != static_cast<double>(static_cast<int64_t>(p)) || p < 1)
    return ctx.error("p " + std::to_string(p) + " is not a positive integer, which kiln's LpPool requires");
  KILN_ASSIGN_OR_RETURN(Node * n, ctx.emit_passthrough(ctx.op_type(), {"p"}));
  n->set_attr("p", static_cast<int64_t>(p));
  return {};
}

// Drops scales / sizes / roi inputs that are constant and empty (opset 11 requires a
// placeholder for scales when sizes is used).
bool empty_constant(ConvertContext& ctx, size_t i) {
  const Tensor* t = ctx.constant_input(i);
  return t && t->numel() == 0;
}

Status convert_resize(ConvertContext& ctx) {
  std::string ctm = ctx.attr_string("coordinate_transformation_mode", "half_pixel");
  if (ctm == "tf_half_pixel_for_nn")
    return ctx.error("coordinate_transformation_mode 'tf_half_pixel_for_nn' (Resize-11 only) is not supported");
  KILN_ASSIGN_OR_RETURN(Node * n, ctx.emit_passthrough("Resize"));
  for (size_t i = 1; i < n->inputs.size() && i < 4; ++i)
    if (ctx.has_input(i) && empty_constant(ctx, i)) n->inputs[i] = kNoValue;
  if (ctm != "tf_crop_and_resize" && n->inputs.size() > 1) n->inputs[1] = kNoValue;  // roi only matters for crops
  while (!n->inputs.empty() && n->inputs.back() == kNoValue) n->inputs.pop_back();
  return {};
}

// Resize-10 and Upsample: output = floor(input * scale), sampled at x_out / scale (asymmetric),
// nearest taking the floor.
Status emit_asymmetric_resize(ConvertContext& ctx, ValueId scales) {
  std::string mode = ctx.attr_string("mode", "nearest");
  if (mode == "bilinear") mode = "linear";
  if (mode != "nearest" && mode != "linear") return ctx.error("mode '" + mode + "' is not one of nearest, linear");
  Node& n = ctx.emit("Resize", {ctx.input(0), kNoValue, scales}, {ctx.output(0)});
  n.set_attr("mode", mode);
  n.set_attr("coordinate_transformation_mode", std::string("asymmetric"));
  n.set_attr("nearest_mode", std::string("floor"));
  return {};
}

Status convert_resize_v10(ConvertContext& ctx) { return emit_asymmetric_resize(ctx, ctx.input(1)); }

Status convert_upsample_v7(ConvertContext& ctx) {
  std::vector<double> s = ctx.attr_floats("scales");
  if (s.empty()) return ctx.error("attribute 'scales' is missing");
  std::vector<float> f(s.begin(), s.end());
  return emit_asymmetric_resize(ctx, ctx.constant(Tensor::from<float>({static_cast<int64_t>(f.size())}, f), "scales"));
}

Status convert_upsample_v9(ConvertContext& ctx) { return emit_asymmetric_resize(ctx, ctx.input(1)); }

// GridSample-16 names its modes bilinear / bicubic; later versions linear / cubic.
Status convert_grid_sample_v16(ConvertContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Node * n, ctx.emit_passthrough("GridSample", {"mode"}));
  std::string mode = ctx.attr_string("mode", "bilinear");
  if (mode == "bilinear") mode = "linear";
  else if (mode == "bicubic") mode = "cubic";
  n->set_attr("mode", mode);
  return {};
}

// RoiAlign-10 has no coordinate_transformation_mode: it behaves as output_half_pixel.
Status convert_roi_align_v10(ConvertContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Node * n, ctx.emit_passthrough("RoiAlign"));
  n->set_attr("coordinate_transformation_mode", std::string("output_half_pixel"));
  return {};
}

}  // namespace

void register_nn_converters(ConverterRegistry& r) {
  r.add("Conv", 1, 22, convert_passthrough);
  r.add("ConvTranspose", 1, 22, convert_passthrough);
  r.add("MatMul", 1, 13, convert_passthrough);
  r.add("Gemm", 1, 13, convert_gemm);
  r.add("MaxPool", 1, 22, convert_passthrough);
  r.add("AveragePool", 1, 22, convert_passthrough);
  r.add("LpPool", 1, 1, convert_lp_pool_v1);
  r.add("LpPool", 2, 22, convert_passthrough);
  r.add("GlobalAveragePool", 1, 22, convert_passthrough);
  r.add("GlobalMaxPool", 1, 22, convert_passthrough);
  r.add("GlobalLpPool", 1, 1, convert_lp_pool_v1);
  r.add("GlobalLpPool", 2, 22, convert_passthrough);
  r.add("LRN", 1, 13, convert_passthrough);
  r.add("Einsum", 12, 12, convert_passthrough);
  r.add("MaxUnpool", 9, 22, convert_passthrough);
  r.add("Col2Im", 18, 18, convert_passthrough);
  r.add("Resize", 10, 10, convert_resize_v10);
  r.add("Resize", 11, 19, convert_resize);
  r.add("Upsample", 7, 7, convert_upsample_v7);
  r.add("Upsample", 9, 10, convert_upsample_v9);
  r.add("GridSample", 16, 16, convert_grid_sample_v16);
  r.add("GridSample", 20, 22, convert_passthrough);
  r.add("RoiAlign", 10, 10, convert_roi_align_v10);
  r.add("RoiAlign", 16, 22, convert_passthrough);
  r.add("AffineGrid", 20, 20, convert_passthrough);
}

}  // namespace kiln
