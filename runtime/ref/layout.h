// Reference kernels of channels-last nodes (FusedConv and the pools with channels_last = 1,
// which `kiln compile` introduces): the channels-first reference kernel runs on X (and Z)
// transposed to [N, C, spatial...], and its output is transposed back. The oracle stays one
// implementation per op; the layout is a data movement around it.
#pragma once

#include <vector>

#include "runtime/kernel.h"

namespace kiln::ref {

/// A view of a kernel context for a reference kernel to run on: the node (a copy, which the
/// view may change), inputs and one output of its own; subgraphs and the workspace are the outer
/// context's. The channels-first view of a channels-last node and the float view of a
/// quantized one are such views.
class ViewContext : public KernelContext {
 public:
  ViewContext(KernelContext& outer, Node node, std::vector<Tensor> inputs, Tensor y)
      : outer_(outer), node_(std::move(node)), inputs_(std::move(inputs)), y_(std::move(y)) {}
  const Node& node() const override { return node_; }
  size_t num_inputs() const override { return inputs_.size(); }
  bool has_input(size_t i) const override { return i < inputs_.size() && inputs_[i].defined(); }
  const Tensor& input(size_t i) const override { return inputs_.at(i); }
  size_t num_outputs() const override { return 1; }
  Tensor& output(size_t) override { return y_; }
  bool output_allocated(size_t) const override { return true; }
  Tensor& allocate_output(size_t, DType dtype, std::vector<int64_t> shape) override {
    y_ = Tensor(dtype, std::move(shape));
    return y_;
  }
  Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs) override {
    return outer_.run_subgraph(g, std::move(inputs));
  }
  std::span<std::byte> workspace() override { return outer_.workspace(); }
  /// The output the kernel wrote.
  const Tensor& y() const { return y_; }

 private:
  KernelContext& outer_;
  Node node_;
  std::vector<Tensor> inputs_;
  Tensor y_;
};

/// x with its dims permuted as Transpose(perm) does, in a new contiguous tensor.
Tensor permuted(const Tensor& x, const std::vector<int64_t>& perm);

/// Runs `channels_first` on the node as it is, or on its channels-first view when the node
/// has channels_last = 1.
Status run_any_layout(KernelContext& ctx, KernelFn channels_first);

/// Runs `f` on the node as it is, or, for a FusedConv whose X comes in parts (`x_parts`: input 0
/// and the inputs after Z), on a view whose X is the parts joined along the channels.
Status run_joined(KernelContext& ctx, KernelFn f);

/// Runs `f32` (FusedConv's or FusedMatMul's f32 reference) on the node's f32 view when its
/// weight, input 1, is bf16 or f16 (`kiln compile --precision`): the weight widened to f32, and
/// for a bf16 weight input 0 rounded to bf16 (to nearest even), which is what AVX512-BF16's
/// products of bf16 pairs summed in f32 compute; an f16 weight multiplies the f32 input as it
/// is. With a bf16 weight, a FusedConv's X, and its Y and Z, may be bf16 too (activations
/// kept bf16 between convolutions): X and Z widened, the f32 result rounded to bf16 as it is
/// stored. A node with an f32 weight runs as it is.
Status run_widened(KernelContext& ctx, KernelFn f32);

}  // namespace kiln::ref
