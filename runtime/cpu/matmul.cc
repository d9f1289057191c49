// kiln.gemm_f32_<isa>: MatMul, FusedMatMul and Gemm on kiln's own GEMM templates
// (runtime/cpu/gemm/), and the channels-last 1x1 convolutions that are the same product and
// that it measured faster at than oneDNN (pointwise_declines). A product whose B has no batch (a linear layer's weight) is one tall GEMM
// over all of A's rows; otherwise each batch index (numpy broadcasting, offsets worked out in
// prepare) is one GEMM. A constant 2-D B is packed once in prepare for the tile's NR (or used
// where a compiled model mapped it, when it was stored packed that way); Gemm's transposed
// operands are read through the packing, never copied whole. The epilogue (bias, activation,
// residual Z or Gemm's full C, second activation) runs on each tile as it is finished.
//
// The template's parameters are the node's recorded ones (KernelChoice::params) when the model
// pinned this kernel with them, and otherwise gemm::default_params for the shapes and threads;
// a recorded thread grid made for another thread count is derived again for the target's.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/gemm/gemm.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

bool present(const KernelQuery& q, size_t i) { return q.inputs.size() > i && q.inputs[i].dtype != DType::undefined; }

bool is_conv(const Node& n) { return n.op == "Conv" || n.op == "FusedConv"; }

// A channels-last convolution that is a plain matrix product: 1x1 kernel, stride 1, no
// padding, no dilation, no groups. Its [N, H, W, C] input is [N·H·W, C] rows, its weight
// [K, C, 1, 1] is Bᵀ.
std::optional<std::string> pointwise_declines(const KernelQuery& q) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not 2-D";
  if (!q.inputs[1].value) return "the weights are computed at run time";
  const std::vector<int64_t> w = q.inputs[1].shape.concrete();
  if (w.size() != 4 || w[2] != 1 || w[3] != 1 || q.node.attr_int("group", 1) != 1) return "not a 1x1 ungrouped convolution";
  for (const char* attr : {"strides", "dilations"})
    for (int64_t v : q.node.attr_ints(attr)) if (v != 1) return std::string(attr) + " other than 1";
  for (int64_t v : q.node.attr_ints("pads")) if (v != 0) return "padding";
  if (const std::string pad = q.node.attr_string("auto_pad", "NOTSET"); pad != "NOTSET" && pad != "VALID") return "auto_pad";
  // oneDNN's convolution is the faster one unless a call's fixed cost is the time (one pixel:
  // an SE block's squeeze and excite, 2-5x faster here) or the epilogue is a transcendental
  // activation, which kiln's row kernels compute faster than oneDNN's post-ops (SiLU layers:
  // 0.85-1.0 of oneDNN's time; ReLU, Clip or none: 1.0-1.7). docs/architecture.md has the table.
  const std::vector<int64_t> x = q.inputs[0].shape.concrete();
  if (x[1] * x[2] == 1) return std::nullopt;
  const Result<ActivationSpec> act = read_activation(q.node, "activation");
  const Activation kind = act.ok() ? act->kind : Activation::none;
  if (kind == Activation::none || kind == Activation::relu || kind == Activation::leaky_relu || kind == Activation::clip)
    return "oneDNN is faster on pointwise convolutions over many pixels with a piecewise-linear epilogue";
  return std::nullopt;
}

std::optional<std::string> gemm_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (auto why = f32_and_concrete(q)) return why;
  if (is_conv(q.node)) return pointwise_declines(q);
  if (q.inputs[0].shape.rank() < 2 || q.inputs[1].shape.rank() < 2) return "1-D operands";
  if (q.node.op == "Gemm") return gemm_form_declines(q);
  return std::nullopt;
}

// A recorded integer parameter of the node, 0 when it has none.
int64_t recorded_int(const Node& node, std::string_view key) {
  const int64_t* i = node.kernel.param<int64_t>(key);
  return i ? *i : 0;
}

// The recorded parameters of a node that pinned this kernel, if it has them.
std::optional<gemm::GemmParams> recorded_params(const Node& node, Isa isa) {
  if (node.kernel.params.empty()) return std::nullopt;
  gemm::GemmParams p;
  p.isa = isa;
  p.tile = {static_cast<int>(recorded_int(node, "mr")), static_cast<int>(recorded_int(node, "nr"))};
  p.mc = recorded_int(node, "mc");
  p.nc = recorded_int(node, "nc");
  p.kc = recorded_int(node, "kc");
  p.tm = static_cast<int>(recorded_int(node, "tm"));
  p.tn = static_cast<int>(recorded_int(node, "tn"));
  p.pack_a = recorded_int(node, "pack_a") != 0;
  return p;
}

class GemmKernel final : public Kernel {
 public:
  explicit GemmKernel(Isa isa) : isa_(isa) {}

  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    const bool conv = is_conv(q.node), gemm_op = q.node.op == "Gemm";
    const bool fused = q.node.op == "FusedMatMul" || q.node.op == "FusedConv";
    std::vector<int64_t> a = q.inputs[0].shape.concrete(), b = q.inputs[1].shape.concrete();
    std::vector<int64_t> y = q.outputs[0].shape.concrete();
    if (conv) {  // [N, H, W, C] · [K, C, 1, 1]ᵀ: rows of C by the weight transposed
      a = {a[0] * a[1] * a[2], a[3]};
      b = {b[0], b[1]};
      y = {y[0] * y[1] * y[2], y[3]};
    }
    trans_a_ = gemm_op && q.node.attr_int("transA", 0) != 0;
    trans_b_ = conv || (gemm_op && q.node.attr_int("transB", 0) != 0);
    const size_t rank = y.size();
    k_ = trans_a_ ? a[a.size() - 2] : a.back();
    n_ = y.back();
    // B without a batch: A's batch folds into M, one GEMM.
    const bool b_flat = shape_numel(std::span(b).first(b.size() - 2)) == 1;
    batch_a_.clear();
    batch_b_.clear();
    if (b_flat && !trans_a_) {
      m_ = shape_numel(std::span(a).first(a.size() - 1));
      batch_a_ = {0};
      batch_b_ = {0};
    } else {
      m_ = y[rank - 2];
      // Offsets of each output batch index's A and B matrices, broadcasting as numpy does.
      std::vector<int64_t> ad(a.begin(), a.end() - 2), bd(b.begin(), b.end() - 2), yd(y.begin(), y.end() - 2);
      ad.insert(ad.begin(), yd.size() - ad.size(), 1);
      bd.insert(bd.begin(), yd.size() - bd.size(), 1);
      const int64_t batches = shape_numel(yd);
      for (int64_t index = 0; index < batches; ++index) {
        int64_t rest = index, ao = 0, bo = 0, as = 1, bs = 1;
        for (size_t d = yd.size(); d-- > 0;) {
          const int64_t i = rest % yd[d];
          rest /= yd[d];
          ao += (ad[d] == 1 ? 0 : i) * as;
          bo += (bd[d] == 1 ? 0 : i) * bs;
          as *= ad[d];
          bs *= bd[d];
        }
        batch_a_.push_back(ao * a[a.size() - 2] * a.back());
        batch_b_.push_back(bo * b[b.size() - 2] * b.back());
      }
    }
    lda_ = a.back();
    ldb_ = b.back();
    // The bias: FusedMatMul's [N], or Gemm's C when it is one row; else C (or Z) is a residual.
    bias_input_ = z_input_ = -1;
    if (present(q, 2)) {
      const std::vector<int64_t> c = q.inputs[2].shape.concrete();
      if (fused || c.size() == 1 || c[0] == 1) bias_input_ = 2;
      else z_input_ = 2;
    }
    if (fused && present(q, 3)) z_input_ = 3;
    if (fused) {
      KILN_ASSIGN_OR_RETURN(act_, read_activation(q.node, "activation"));
      KILN_ASSIGN_OR_RETURN(post_, read_activation(q.node, "post_activation"));
    }
    // The template's parameters: recorded, or the defaults for these shapes; the threads go to
    // whole products when there are at least as many as threads (attention's heads), each
    // product then on one thread, and otherwise to each product's grid.
    const int threads = std::max(1, q.target.threads);
    const bool pinned = q.node.kernel.name == impl_name(isa_);
    std::optional<gemm::GemmParams> rec = pinned ? recorded_params(q.node, isa_) : std::nullopt;
    if (rec) {
      if (auto why = rec->invalid()) return user_error(q.node.where(), "the recorded GEMM parameters are invalid: " + *why);
      params_ = gemm::fit(*rec, m_, n_, k_);
      batch_threads_ = static_cast<int>(std::clamp<int64_t>(recorded_int(q.node, "tb"), 1, 1024));
    } else {
      params_ = gemm::default_params(isa_, gemm::default_tile(isa_, n_), gemm::CacheSizes::host(), m_, n_, k_, threads);
    }
    if (!rec || params_.threads() * batch_threads_ != threads) {  // no record, or one made for another thread count
      const int64_t batches = static_cast<int64_t>(batch_a_.size());
      const gemm::GemmParams grid = gemm::default_params(isa_, params_.tile, gemm::CacheSizes::host(), m_, n_, k_, threads);
      const bool whole = batches > 1 && threads > 1 && batches >= threads;
      batch_threads_ = whole ? threads : 1;
      params_.tm = whole ? 1 : grid.tm;
      params_.tn = whole ? 1 : grid.tn;
    }
    // A constant B of one matrix: packed once for the tile's NR.
    b_packed_ = false;
    packed_ = Tensor();
    if (const Tensor* w = q.inputs[1].value; w && batch_b_.size() == 1 && batch_b_[0] == 0) {
      const PackedLayout want = gemm::packed_b_layout(k_, n_, params_.tile.nr, trans_b_);
      if (w->layout() && w->layout()->same_placement(want)) {
        packed_ = *w;  // stored packed this way: used where it is mapped
      } else {
        const Tensor plain = w->is_packed() ? unpack(*w) : *w;
        Tensor packed = Tensor(DType::f32, {gemm::packed_b_floats(k_, n_, params_.tile.nr)});
        gemm::pack_b(plain.data<float>(), trans_b_ ? k_ : n_, trans_b_, k_, n_, params_.tile.nr, packed.data<float>());
        packed_ = Tensor::packed(DType::f32, w->shape(), want, packed.nbytes(), packed.raw(),
                                 std::shared_ptr<void>(std::make_shared<Tensor>(packed), packed.raw()));
      }
      b_packed_ = true;
    } else if (w && w->is_packed()) {
      plain_b_ = unpack(*w);  // a batched weight stored packed: read plain
    }
    gemm::GemmProblem shape{.m = m_, .n = n_, .k = k_, .b_packed = b_packed_};
    needs.workspace_bytes = gemm::workspace_bytes(params_, shape) * static_cast<size_t>(batch_threads_);
    return {};
  }

  Tensor packed_input(size_t input) const override { return input == 1 && b_packed_ ? packed_ : Tensor(); }

  std::vector<std::pair<std::string, KernelParam>> params() const override {
    return {{"mr", int64_t{params_.tile.mr}}, {"nr", int64_t{params_.tile.nr}}, {"mc", params_.mc}, {"nc", params_.nc},
            {"kc", params_.kc},           {"tm", int64_t{params_.tm}},     {"tn", int64_t{params_.tn}},
            {"pack_a", int64_t{params_.pack_a}}, {"tb", int64_t{batch_threads_}}};
  }
  std::string label() const override { return params_.name(); }

  Status run(KernelContext& ctx) override {
    const float* b = b_packed_ ? packed_.data<float>() : plain_b_.defined() ? plain_b_.data<float>() : ctx.input(1).data<float>();
    gemm::GemmProblem g{.m = m_, .n = n_, .k = k_, .lda = lda_, .trans_a = trans_a_, .ldb = ldb_,
                        .trans_b = trans_b_, .b_packed = b_packed_, .ldc = n_};
    g.epilogue.bias = bias_input_ >= 0 ? ctx.input(static_cast<size_t>(bias_input_)).data<float>() : nullptr;
    g.epilogue.z = z_input_ >= 0 ? ctx.input(static_cast<size_t>(z_input_)).data<float>() : nullptr;
    g.epilogue.ldz = n_;
    g.epilogue.act = act_;
    g.epilogue.post = post_;
    g.a = ctx.input(0).data<float>();
    g.b = b;
    g.c = ctx.output(0).data<float>();
    if (batch_a_.size() == 1) gemm::run(params_, g, ctx.workspace().data());
    else gemm::run_batch(params_, g, batch_a_, batch_b_, m_ * n_, batch_threads_, ctx.workspace().data());
    return {};
  }

  static std::string impl_name(Isa isa) { return std::string("kiln.gemm_f32_") + isa_name(isa); }

 private:
  Isa isa_;
  gemm::GemmParams params_;
  int64_t m_ = 0, n_ = 0, k_ = 0, lda_ = 0, ldb_ = 0;
  bool trans_a_ = false, trans_b_ = false, b_packed_ = false;
  std::vector<int64_t> batch_a_, batch_b_;  // per GEMM: the offsets of its A and B
  int bias_input_ = -1, z_input_ = -1;
  int batch_threads_ = 1;
  ActivationSpec act_, post_;
  Tensor packed_, plain_b_;
};

}  // namespace

void register_gemm(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"MatMul", "FusedMatMul", "Gemm", "Conv", "FusedConv"})
      r.add(op, "cpu",
            KernelImpl{.name = GemmKernel::impl_name(isa),
                       .declines = [isa](const KernelQuery& q) { return gemm_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<GemmKernel>(isa); },
                       .needs_isa = isa_features(isa),
                       .reads_packed = true});
}

}  // namespace kiln::cpu
