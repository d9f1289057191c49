// Reference kernel for Einsum: any equation, any number of operands. Each label gets a size
// and, per operand, a stride (the sum of the strides of every dim carrying it, which is how
// repeated labels read diagonals; 0 where an ellipsis dim broadcasts). The kernel then walks
// the output labels and, for each output element, the summed labels.
#include <string>

#include "formats/ops/nn_util.h"
#include "runtime/ref/nn_util.h"

namespace kiln::nn {

namespace {

template <class T>
Status einsum_impl(KernelContext& ctx, const EinsumSpec& spec, const std::vector<const Tensor*>& in, Tensor& y) {
  using Acc = std::conditional_t<std::is_integral_v<T>, uint64_t, double>;
  const size_t nin = in.size();
  const size_t nl = static_cast<size_t>(spec.num_labels);
  std::vector<int64_t> size(nl, -1);
  for (size_t i = 0; i < nin; ++i)
    for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
      int64_t& s = size[static_cast<size_t>(spec.inputs[i][d])];
      const int64_t v = in[i]->dim(static_cast<int64_t>(d));
      if (s < 0 || s == 1) s = v;
      else if (v != s && v != 1)
        return ctx.error("operand " + std::to_string(i) + " dim " + std::to_string(d) + " is " + std::to_string(v) + " but the label is " +
                         std::to_string(s) + " elsewhere");
    }
  // Label order: output labels, then the summed ones.
  std::vector<int> order = spec.output;
  std::vector<bool> in_out(nl, false);
  for (int l : spec.output) in_out[static_cast<size_t>(l)] = true;
  for (size_t l = 0; l < nl; ++l)
    if (!in_out[l] && size[l] >= 0) order.push_back(static_cast<int>(l));
  const size_t nout = spec.output.size(), nall = order.size();
  std::vector<int64_t> dims(nall);
  for (size_t k = 0; k < nall; ++k) dims[k] = size[static_cast<size_t>(order[k])];
  // strides[i][k]: operand i's step for label order[k].
  std::vector<std::vector<int64_t>> strides(nin, std::vector<int64_t>(nall, 0));
  for (size_t i = 0; i < nin; ++i) {
    const Tensor& t = *in[i];
    int64_t st = 1;
    for (size_t d = spec.inputs[i].size(); d-- > 0;) {
      const int l = spec.inputs[i][d];
      const size_t k = static_cast<size_t>(std::find(order.begin(), order.end(), l) - order.begin());
      if (t.dim(static_cast<int64_t>(d)) != 1 || dims[k] == 1) strides[i][k] += st;
      st *= t.dim(static_cast<int64_t>(d));
    }
  }
  T* py = y.data<T>();
  int64_t out_total = 1, sum_total = 1;
  for (size_t k = 0; k < nout; ++k) out_total *= dims[k];
  for (size_t k = nout; k < nall; ++k) sum_total *= dims[k];
  std::vector<const T*> base(nin);
  for (size_t i = 0; i < nin; ++i) base[i] = in[i]->data<T>();
  std::vector<int64_t> idx(nall, 0), off(nin, 0), soff(nin);
  for (int64_t o = 0; o < out_total; ++o) {
    Acc acc = 0;
    if (sum_total > 0) {
      std::fill(idx.begin() + static_cast<ptrdiff_t>(nout), idx.end(), 0);
      soff = off;
      for (int64_t s = 0; s < sum_total; ++s) {
        Acc prod = 1;
        for (size_t i = 0; i < nin; ++i) prod *= static_cast<Acc>(base[i][soff[i]]);
        acc += prod;
        for (size_t k = nall; k-- > nout;) {
          for (size_t i = 0; i < nin; ++i) soff[i] += strides[i][k];
          if (++idx[k] < dims[k]) break;
          for (size_t i = 0; i < nin; ++i) soff[i] -= strides[i][k] * dims[k];
          idx[k] = 0;
        }
      }
    }
    py[o] = static_cast<T>(acc);
    for (size_t k = nout; k-- > 0;) {
      for (size_t i = 0; i < nin; ++i) off[i] += strides[i][k];
      if (++idx[k] < dims[k]) break;
      for (size_t i = 0; i < nin; ++i) off[i] -= strides[i][k] * dims[k];
      idx[k] = 0;
    }
  }
  return {};
}

Status ref_einsum(KernelContext& ctx) {
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) ranks.push_back(ctx.input(i).rank());
  KILN_ASSIGN_OR_RETURN(EinsumSpec spec, parse_einsum(ctx.node(), ctx.node().attr_string("equation", ""), ranks));
  const DType t = ctx.input(0).dtype();
  if (t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64)
    return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) -> Status {
      using T = decltype(tag);
      return einsum_impl<T>(ctx, spec, in, *out[0]);
    });
  std::vector<const Tensor*> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) in.push_back(&ctx.input(i));
  Status st;
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) st = einsum_impl<T>(ctx, spec, in, ctx.output(0));
    else st = ctx.error("Einsum does not support " + std::string(dtype_name(t)));
  });
  return st;
}

}  // namespace

void register_ref_nn_einsum(KernelRegistry& r) { r.add_reference("Einsum", ref_einsum); }

}  // namespace kiln::nn
