// kiln.binary_f32_<isa>: Add, Sub, Mul, Div, Max and Min of two f32 tensors, and Pow by a
// constant 2, broadcasting as numpy does, on the row kernels of the target's ISA. The
// broadcast is worked out in prepare: dims next to each other that broadcast alike merge, so
// the run is planes of rows of one inner length in which each operand is a vector or one value
// (an SE block's [N, H, W, C] · [N, 1, 1, C] is N planes of H·W rows of C against C). The
// threads share runs of rows (or pieces of a long row) from 16K values, in the order the
// producer's threads wrote them, so each core reads what it wrote; Y takes an operand's memory
// when it can. EfficientNet-B0's sixteen SE scales (Mul by a per-channel factor) at two threads:
// 522 -> 242 us against one call per row of C, on one thread below 64K values and out of place
// (the least of 4 alternated profiles).
#include <algorithm>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kParallelElements = 1 << 14, kPiece = 1 << 14;

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
    // Y may take the memory of an operand of its shape that dies here (each item reads its
    // elements of it before writing the same ones).
    const std::vector<int64_t> a0 = q.inputs[0].shape.concrete();
    over_ = a0 == y ? 0 : op_ != BinaryOp::square && q.inputs[1].shape.concrete() == y ? 1 : -1;
    // The run's items: a plane's rows in runs of about kPiece values (a long row in pieces).
    if (dims_.size() == 1) {
      dims_.insert(dims_.begin(), 1);
      a_stride_.insert(a_stride_.begin(), 0);
      b_stride_.insert(b_stride_.begin(), 0);
    }
    const size_t rd = dims_.size() - 2;
    inner_ = dims_.back();
    plane_rows_ = dims_[rd];
    a_row_ = a_stride_[rd];
    b_row_ = b_stride_[rd];
    int64_t planes = 1;
    for (size_t d = 0; d < rd; ++d) planes *= dims_[d];
    if (planes * plane_rows_ * inner_ == 0) {  // an empty output
      items_ = 0;
      parallel_ = false;
      return {};
    }
    row_pieces_ = (inner_ + kPiece - 1) / kPiece;
    rows_per_item_ = row_pieces_ > 1 ? 1 : std::max<int64_t>(1, kPiece / inner_);
    per_plane_ = row_pieces_ > 1 ? plane_rows_ * row_pieces_ : (plane_rows_ + rows_per_item_ - 1) / rows_per_item_;
    items_ = planes * per_plane_;
    parallel_ = planes * plane_rows_ * inner_ >= kParallelElements && items_ > 1;
    return {};
  }

  int overwrites_input() const override { return over_; }

  Status run(KernelContext& ctx) override {
    const float* a = ctx.input(0).data<float>();
    const float* b = op_ == BinaryOp::square ? a : ctx.input(1).data<float>();
    float* y = ctx.output(0).data<float>();
    const int64_t as = a_stride_.back() != 0, bs = b_stride_.back() != 0;
    // Item i: rows [r0, r1) of one plane (one index over the dims before the rows'), or a piece
    // of a row longer than kPiece; its operands from the plane's index over those dims.
    auto item = [&](int64_t i) {
      const int64_t plane = i / per_plane_, k = i % per_plane_;
      int64_t ao = 0, bo = 0;
      for (int64_t d = static_cast<int64_t>(dims_.size()) - 3, rest = plane; d >= 0; --d) {
        const auto u = static_cast<size_t>(d);
        ao += rest % dims_[u] * a_stride_[u];
        bo += rest % dims_[u] * b_stride_[u];
        rest /= dims_[u];
      }
      if (row_pieces_ > 1) {  // k: piece k % row_pieces_ of row k / row_pieces_
        const int64_t r = k / row_pieces_, from = k % row_pieces_ * kPiece;
        rows_.binary(op_, a + ao + r * a_row_ + from * as, as, 0, b + bo + r * b_row_ + from * bs, bs, 0,
                     y + (plane * plane_rows_ + r) * inner_ + from, 1, std::min(kPiece, inner_ - from));
        return;
      }
      const int64_t r0 = k * rows_per_item_, rows = std::min(rows_per_item_, plane_rows_ - r0);
      rows_.binary(op_, a + ao + r0 * a_row_, as, a_row_, b + bo + r0 * b_row_, bs, b_row_, y + (plane * plane_rows_ + r0) * inner_,
                   rows, inner_);
    };
    if (!parallel_) {  // no parallel region: one that an `if` keeps serial still calls the OpenMP runtime
      for (int64_t i = 0; i < items_; ++i) item(i);
      return {};
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < items_; ++i) item(i);
    return {};
  }

 private:
  const RowKernels& rows_;
  BinaryOp op_ = BinaryOp::add;
  std::vector<int64_t> dims_, a_stride_, b_stride_;  // merged output dims, the operands' strides (0: repeats)
  int64_t inner_ = 1, plane_rows_ = 1, a_row_ = 0, b_row_ = 0;  // the last two merged dims: rows of inner_
  int64_t row_pieces_ = 1, rows_per_item_ = 1, per_plane_ = 1, items_ = 1;
  bool parallel_ = false;
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
