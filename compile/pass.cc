// The pass table: the default pipeline, read top to bottom.
#include "compile/pass.h"

#include <array>

namespace kiln {

namespace {

// Order matters: shapes first (folding needs concrete shapes to compute shape arithmetic), folding
// before CSE (folded constants that come out equal are merged), CSE before the weight folds (they
// need each intermediate to have one reader); linear layers lose the Reshapes around them before
// the patterns after a linear layer look for it; the exporter patterns become whole ops before the
// epilogues fuse (GELU must be one node to become a matmul's activation), and activations move
// ahead of reshapes and transposes before them (to meet their conv); row Gathers and Slices move
// ahead of the fused nodes (one node each, whole); the layout after fusion (a fused node converts
// as one), int8 lowering after both (it takes a fused, channels-last conv whole), then the lowering
// to bf16 / f16 of what stayed float (a fused node's weight), the f32 products that share an input
// merged after it (so that what it lowered stays apart), and the transposes it leaves at a region's
// edge merged with those the model makes after it; Concats of Splits folded once the layout has its
// final axes (and after merge_projections, which folds a Split into the product before it), then
// the Concats left before pointwise convolutions fused into them (after the lowering: f32 ones
// only); dead code before kernel selection (every pass before it may leave unread values behind),
// which plans the final graph; autotuning after it (it starts from the rule's choices); packing
// last, for the kernels chosen.
constexpr std::array kPasses = {
    PassInfo{"specialize_shapes", "bind symbolic input dims from --input-shape and re-infer every shape", specialize_shapes},
    PassInfo{"fold_constants", "evaluate nodes whose inputs are all constants, and shape arithmetic inference computed",
             fold_constants},
    PassInfo{"cse", "merge identical constants and nodes with the same op, attributes and inputs",
             eliminate_common_subexpressions},
    PassInfo{"fold_batchnorm", "fold BatchNormalization into the constant weights of the Conv, ConvTranspose, Gemm or MatMul before it",
             fold_batchnorm},
    PassInfo{"drop_linear_reshapes", "Reshape(x) -> Gemm/MatMul on 2-D rows -> Reshape back to x's leading dims (GPT-2's layers) -> MatMul of x itself (+ Add of the bias)",
             drop_linear_reshapes},
    PassInfo{"fuse_linear_bias", "MatMul of a 2-D input by a constant 2-D weight, then Add of a constant row bias -> Gemm",
             fuse_linear_bias},
    PassInfo{"fuse_layer_norm", "ReduceMean/Sub/Pow/Sqrt/Div (+ scale, bias) over the last axis -> LayerNormalization",
             fuse_layer_norm_pass},
    PassInfo{"fuse_rms_norm", "Pow/ReduceMean/Add/Sqrt/reciprocal/Mul (+ scale) over the last axis -> RMSNormalization",
             fuse_rms_norm_pass},
    PassInfo{"fuse_gelu", "x * 0.5 * (1 + erf(x / sqrt 2)) and its tanh approximation -> Gelu", fuse_gelu_pass},
    PassInfo{"fuse_rotary", "x * cos + rotate_half(x) * sin with constant tables on 4-D heads -> RotaryEmbedding", fuse_rotary_pass},
    PassInfo{"fuse_attention", "MatMul(Q, K^T), scale, mask, Softmax, MatMul(., V) on 4-D heads -> Attention (grouped-query K/V unrepeated, split heads read in place)",
             fuse_attention_pass},
    PassInfo{"hoist_activations", "an activation after a Reshape, Transpose, Flatten, Squeeze or Unsqueeze runs before it (to fuse into the conv or matmul behind)",
             hoist_activations},
    PassInfo{"fuse_epilogues", "Conv/MatMul/Gemm + bias + activation + residual Add + activation -> FusedConv / FusedMatMul",
             fuse_epilogues_pass},
    PassInfo{"gather_rows_early", "a Gather or Slice of rows (a class token, a last token) after row-wise nodes (norms, products by a weight with their residual, elementwise, a query's Attention) moves in front of them: only the rows kept are computed",
             gather_rows_early},
    PassInfo{"channels_last", "2-D convolutions and pools, and the elementwise, Concat, Split and Resize nodes between them, on [N, H, W, C] activations",
             channels_last},
    PassInfo{"lower_int8", "a quantized model's DQ -> conv / linear / add / mul by f32 / global average pool / layer norm / attention -> Q -> QFusedConv / QFusedMatMul / QAdd / QMul / QGlobalAveragePool / QLayerNormalization / QAttention (AMX), max pools, Splits, Concats and nearest Resizes on int8, DQ -> elementwise op -> LookupTable; weight DQs left folded",
             lower_int8},
    PassInfo{"lower_precision", "--precision bf16|fp16: convolutions and matrix products by constant weights in bf16 / f16, weights stored converted (and on AMX, attention's products bf16); the rest and the final layers f32",
             lower_precision},
    PassInfo{"merge_projections", "matrix products of one input by constant weights of one type (Q, K, V) -> one FusedMatMul whose columns split into their outputs; a Split of a product's columns folded into it",
             merge_projections},
    PassInfo{"merge_transposes", "Transpose -> Reshape splitting dims -> Transpose (or two Transposes) -> Reshape -> one Transpose",
             merge_transposes},
    PassInfo{"fold_split_concat", "Concat of a Split's pieces along its axis: all of them in order -> the Split's input; some unchanged -> ReplaceSlices of the input (those never copied)",
             fold_split_concat},
    PassInfo{"fuse_concat", "a channel Concat read only by pointwise convolutions with a transcendental activation: they read its inputs where they lie (FusedConv's x_parts, on kiln's f32 GEMM)",
             fuse_concat},
    PassInfo{"fuse_pointwise_depthwise", "a 1x1 convolution read only by a depthwise convolution (an inverted residual block's expansion), and a 1x1 convolution alone reading a depthwise one's output (its projection) -> PointwiseDepthwiseConv, the intermediates computed row by row as the next stage reads them, never stored whole (f32, large ones only)",
             fuse_pointwise_depthwise},
    PassInfo{"fuse_channel_scale", "a per-channel scale (a squeeze-excitation's gates) of a pointwise convolution's input, over many more pixels than output channels: the convolution reads the unscaled input by its weight scaled per input channel, computed each run (f32, on kiln's GEMM)",
             fuse_channel_scale},
    PassInfo{"eliminate_dead", "drop nodes and values the graph outputs do not need, unused constants included",
             eliminate_dead},
    PassInfo{"select_kernels", "plan the graph for the target: record each node's kernel, the target and the memory plan",
             select_kernels},
    PassInfo{"autotune_kernels", "time each GEMM/conv problem's candidate kernels in the graph and keep the fastest (--mode max-autotune), or take them from --tuning-db",
             autotune_kernels},
    PassInfo{"prepack_weights", "store constant weights packed in the layout their chosen kernel reads, dropping the plain copies",
             prepack_weights},
};

}  // namespace

std::span<const PassInfo> all_passes() { return kPasses; }

const PassInfo* find_pass(std::string_view name) {
  for (const PassInfo& p : kPasses)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace kiln
