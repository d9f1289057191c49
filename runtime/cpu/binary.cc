// kiln.binary_f32_<isa>: Add, Sub, Mul, Div, Max and Min of two f32 tensors, and Pow by a
// constant 2, broadcasting as numpy does, on the row kernels of the target's ISA. The
// broadcast is worked out in prepare: dims next to each other that broadcast alike merge, so
// the run is rows of one inner length in which each operand is a vector or one value (an SE
// block's [N, H, W, C] · [N, 1, 1, C] is N·H·W rows of C against C), each row's offsets
// worked out from its index over the few outer dims; rows (and long rows in pieces) are shared
// among threads when there is enough work.
#include <algorithm>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kParallelElements = 1 << 16, kPiece = 1 << 14;

std::optional<BinaryOp> op_of(const KernelQuery& q) {
  const std::string& op = q.node.op;
  if (op == "Add") return BinaryOp::add;
  if (op == "Sub") return BinaryOp::sub;
  if (op == "Mul") return BinaryOp::mul;
  if (op == "Div") return BinaryOp::div;
  if (op == "Max") return BinaryOp::max;
  if (op == "Min") return BinaryOp::min;
  if (op == "Pow" && q.inputs.size() == 2 && q.inputs[1].value && q.inputs[1].value->numel() == 1 &&
      q.inputs[1].value->as_double(0) == 2.0)
    return BinaryOp::square;
  return std::nullopt;
}

std::optional<std::string> binary_declines(const KernelQuery& q, Isa isa) {
  if (auto why = lacks(q.target.cpu, isa)) return why;
  if (q.inputs.size() != 2 || q.outputs.size() != 1) return "not two inputs and one output";
  if (!op_of(q)) return "Pow by something other than a constant 2";
  const bool square = q.node.op == "Pow";
  for (size_t i = 0; i < (square ? 1u : 2u); ++i)
    if (q.inputs[i].dtype != DType::f32 || !q.inputs[i].shape.is_concrete()) return "not f32 of known shape";
  if (q.outputs[0].dtype != DType::f32 || !q.outputs[0].shape.is_concrete()) return "not f32 of known shape";
  return std::nullopt;
}

class BinaryKernel final : public Kernel {
 public:
  explicit BinaryKernel(Isa isa) : rows_(row_kernels(isa)) {}

  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    op_ = *op_of(q);
    const std::vector<int64_t> y = q.outputs[0].shape.concrete();
    std::vector<int64_t> a = q.inputs[0].shape.concrete(), b = op_ == BinaryOp::square ? a : q.inputs[1].shape.concrete();
    a.insert(a.begin(), y.size() - a.size(), 1);
    b.insert(b.begin(), y.size() - b.size(), 1);
    // Merge, from the innermost dim out, the dims in which each operand either runs or repeats
    // alike: a dim of 1 in the output goes; one that changes either operand's state starts a
    // new merged dim.
    dims_.clear();
    a_stride_.clear();
    b_stride_.clear();
    int64_t as = 1, bs = 1;  // the operands' strides over the dims seen so far
    int prev = -1;
    for (size_t d = y.size(); d-- > 0;) {
      if (y[d] == 1) continue;
      const bool ar = a[d] != 1, br = b[d] != 1;  // the operand runs along d (else repeats)
      const int state = ar * 2 + br;
      if (state == prev) {
        dims_.back() *= y[d];
      } else {
        dims_.push_back(y[d]);
        a_stride_.push_back(ar ? as : 0);
        b_stride_.push_back(br ? bs : 0);
        prev = state;
      }
      if (ar) as *= y[d];
      if (br) bs *= y[d];
    }
    if (dims_.empty()) {  // a single element
      dims_ = {1};
      a_stride_ = {0};
      b_stride_ = {0};
    }
    std::reverse(dims_.begin(), dims_.end());
    std::reverse(a_stride_.begin(), a_stride_.end());
    std::reverse(b_stride_.begin(), b_stride_.end());
    // Y may take the memory of an operand of its shape that dies here (each row piece reads its
    // elements of it before writing the same ones), on one thread. On two, writing over what
    // the other core wrote costs each line's ownership on top of the read: EfficientNet-B0's SE
    // scales (Mul of the activations by a per-channel factor) ran 1.21x their time in place at
    // two threads, 0.585x at one (node times, the least of 5-7 alternated profiles).
    const std::vector<int64_t> a0 = q.inputs[0].shape.concrete();
    over_ = q.target.threads > 1 ? -1 : a0 == y ? 0 : op_ != BinaryOp::square && q.inputs[1].shape.concrete() == y ? 1 : -1;
    inner_ = dims_.back();
    rows_count_ = 1;
    for (size_t d = 0; d + 1 < dims_.size(); ++d) rows_count_ *= dims_[d];
    return {};
  }

  int overwrites_input() const override { return over_; }

  Status run(KernelContext& ctx) override {
    const float* a = ctx.input(0).data<float>();
    const float* b = op_ == BinaryOp::square ? a : ctx.input(1).data<float>();
    float* y = ctx.output(0).data<float>();
    const int64_t as = a_stride_.back() != 0, bs = b_stride_.back() != 0, outer = static_cast<int64_t>(dims_.size()) - 1;
    // Piece p of row r: its operands from the row's index over the outer dims.
    auto piece = [&](int64_t r, int64_t from, int64_t n) {
      int64_t ao = 0, bo = 0;
      for (int64_t d = outer - 1, rest = r; d >= 0; --d) {
        const int64_t i = rest % dims_[static_cast<size_t>(d)];
        rest /= dims_[static_cast<size_t>(d)];
        ao += i * a_stride_[static_cast<size_t>(d)];
        bo += i * b_stride_[static_cast<size_t>(d)];
      }
      rows_.binary(op_, a + ao + from * as, as, b + bo + from * bs, bs, y + r * inner_ + from, n);
    };
    if (rows_count_ * inner_ < kParallelElements) {
      for (int64_t r = 0; r < rows_count_; ++r) piece(r, 0, inner_);
      return {};
    }
    const int64_t per_row = (inner_ + kPiece - 1) / kPiece, items = rows_count_ * per_row;
#pragma omp parallel for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t from = it % per_row * kPiece;
      piece(it / per_row, from, std::min(kPiece, inner_ - from));
    }
    return {};
  }

 private:
  const RowKernels& rows_;
  BinaryOp op_ = BinaryOp::add;
  std::vector<int64_t> dims_, a_stride_, b_stride_;  // merged output dims, the operands' strides (0: repeats)
  int64_t inner_ = 1, rows_count_ = 1;
  int over_ = -1;
};

}  // namespace

void register_binary(KernelRegistry& r) {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"})
      r.add(op, "cpu",
            KernelImpl{.name = std::string("kiln.binary_f32_") + isa_name(isa),
                       .declines = [isa](const KernelQuery& q) { return binary_declines(q, isa); },
                       .create = [isa](const KernelQuery&) { return std::make_unique<BinaryKernel>(isa); },
                       .needs_isa = isa_features(isa)});
}

}  // namespace kiln::cpu
