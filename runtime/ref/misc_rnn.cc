// Reference kernels of the recurrent layers RNN, GRU and LSTM (ONNX semantics: gate orders,
// directions, sequence_lens, initial states, peepholes, clip, layout, linear_before_reset). One
// loop serves all three; the math runs in double and is stored in the input's dtype.
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernel.h"

namespace kiln {

void register_ref_misc_rnn(KernelRegistry& r);

namespace {

enum class Cell { rnn, gru, lstm };

// One activation function with its alpha / beta.
struct RnnActivation {
  std::string name;
  double alpha = 0, beta = 0;
  double operator()(double x) const {
    if (name == "Sigmoid") return 1.0 / (1.0 + std::exp(-x));
    if (name == "Tanh") return std::tanh(x);
    if (name == "Relu") return x > 0 ? x : 0;
    if (name == "Affine") return alpha * x + beta;
    if (name == "LeakyRelu") return x >= 0 ? x : alpha * x;
    if (name == "ThresholdedRelu") return x > alpha ? x : 0;
    if (name == "ScaledTanh") return alpha * std::tanh(beta * x);
    if (name == "HardSigmoid") return std::max(0.0, std::min(1.0, alpha * x + beta));
    if (name == "Elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (name == "Softsign") return x / (1 + std::fabs(x));
    if (name == "Softplus") return std::log1p(std::exp(x));
    return x;
  }
};

// Activations per direction: the node's list (alpha / beta consumed in order by the functions
// that take them, as ONNX Runtime does) or the op's defaults.
Result<std::vector<RnnActivation>> activations(const KernelContext& ctx, Cell cell, int64_t dirs) {
  const Node& n = ctx.node();
  std::vector<std::string> names = n.attr_strings("activations");
  const size_t per = cell == Cell::rnn ? 1 : cell == Cell::gru ? 2 : 3;
  if (names.empty()) {
    std::vector<std::string> def = cell == Cell::rnn ? std::vector<std::string>{"Tanh"}
                                   : cell == Cell::gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                       : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), def.begin(), def.end());
  }
  if (names.size() != per * static_cast<size_t>(dirs))
    return ctx.error("activations has " + std::to_string(names.size()) + " entries; expected " +
                     std::to_string(per * static_cast<size_t>(dirs)));
  std::vector<double> alphas = n.attr_floats("activation_alpha"), betas = n.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  std::vector<RnnActivation> out;
  for (const std::string& name : names) {
    RnnActivation a{name};
    double da = name == "LeakyRelu" ? 0.01 : name == "HardSigmoid" ? 0.2 : 1.0;
    double db = name == "HardSigmoid" ? 0.5 : name == "Affine" ? 0.0 : 1.0;
    bool takes_alpha = name == "Affine" || name == "LeakyRelu" || name == "ThresholdedRelu" || name == "ScaledTanh" ||
                       name == "HardSigmoid" || name == "Elu";
    bool takes_beta = name == "Affine" || name == "ScaledTanh" || name == "HardSigmoid";
    a.alpha = takes_alpha && ai < alphas.size() ? alphas[ai++] : da;
    a.beta = takes_beta && bi < betas.size() ? betas[bi++] : db;
    out.push_back(a);
  }
  return out;
}

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.as_double(i);
  return v;
}

void store(Tensor& t, const std::vector<double>& v) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(static_cast<float>(v[i]));
    if constexpr (std::is_same_v<T, double>)
      for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  });
}

Status run_recurrent(KernelContext& ctx, Cell cell) {
  const Node& n = ctx.node();
  const int gates = cell == Cell::rnn ? 1 : cell == Cell::gru ? 3 : 4;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor& R = ctx.input(2);
  const std::string direction = n.attr_string("direction", "forward");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const bool layout1 = n.attr_int("layout", 0) == 1;
  const int64_t seq = X.dim(layout1 ? 1 : 0), batch = X.dim(layout1 ? 0 : 1), in = X.dim(2);
  const int64_t H = R.dim(2);
  const int64_t GH = gates * H;
  if (W.rank() != 3 || W.dim(0) != dirs || W.dim(1) != GH || W.dim(2) != in)
    return ctx.error("W has shape " + shape_str(W.shape()) + "; expected " + shape_str(std::vector<int64_t>{dirs, GH, in}));
  if (R.rank() != 3 || R.dim(0) != dirs || R.dim(1) != GH)
    return ctx.error("R has shape " + shape_str(R.shape()) + "; expected " + shape_str(std::vector<int64_t>{dirs, GH, H}));
  auto check = [&](size_t i, std::vector<int64_t> want, const char* what) -> Status {
    if (ctx.has_input(i) && ctx.input(i).shape() != want)
      return ctx.error(std::string(what) + " has shape " + shape_str(ctx.input(i).shape()) + "; expected " + shape_str(want));
    return {};
  };
  std::vector<int64_t> state_shape = layout1 ? std::vector<int64_t>{batch, dirs, H} : std::vector<int64_t>{dirs, batch, H};
  KILN_RETURN_IF_ERROR(check(3, {dirs, 2 * GH}, "B"));
  KILN_RETURN_IF_ERROR(check(4, {batch}, "sequence_lens"));
  KILN_RETURN_IF_ERROR(check(5, state_shape, "initial_h"));
  if (cell == Cell::lstm) {
    KILN_RETURN_IF_ERROR(check(6, state_shape, "initial_c"));
    KILN_RETURN_IF_ERROR(check(7, {dirs, 3 * H}, "P"));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<RnnActivation> acts, activations(ctx, cell, dirs));
  const double clip = n.attr_float("clip", 0.0);
  const bool lbr = n.attr_int("linear_before_reset", 0) != 0;
  const bool input_forget = n.attr_int("input_forget", 0) != 0;
  std::vector<int64_t> lens(static_cast<size_t>(batch), seq);
  if (ctx.has_input(4))
    for (int64_t b = 0; b < batch; ++b) {
      lens[static_cast<size_t>(b)] = ctx.input(4).as_int64(b);
      if (lens[static_cast<size_t>(b)] < 0 || lens[static_cast<size_t>(b)] > seq)
        return ctx.error("sequence_lens[" + std::to_string(b) + "] = " + std::to_string(lens[static_cast<size_t>(b)]) +
                         " is out of range for sequence length " + std::to_string(seq));
    }
  std::vector<double> x = to_doubles(X), w = to_doubles(W), r = to_doubles(R);
  std::vector<double> bias = ctx.has_input(3) ? to_doubles(ctx.input(3)) : std::vector<double>(static_cast<size_t>(dirs * 2 * GH), 0.0);
  std::vector<double> p = cell == Cell::lstm && ctx.has_input(7) ? to_doubles(ctx.input(7)) : std::vector<double>(static_cast<size_t>(dirs * 3 * H), 0.0);
  std::vector<double> h0 = ctx.has_input(5) ? to_doubles(ctx.input(5)) : std::vector<double>(static_cast<size_t>(dirs * batch * H), 0.0);
  std::vector<double> c0 = cell == Cell::lstm && ctx.has_input(6) ? to_doubles(ctx.input(6)) : std::vector<double>(static_cast<size_t>(dirs * batch * H), 0.0);
  // Layout-independent element offsets.
  auto xo = [&](int64_t t, int64_t b) { return layout1 ? (b * seq + t) * in : (t * batch + b) * in; };
  auto yo = [&](int64_t t, int64_t d, int64_t b) { return layout1 ? ((b * seq + t) * dirs + d) * H : ((t * dirs + d) * batch + b) * H; };
  auto so = [&](int64_t d, int64_t b) { return layout1 ? (b * dirs + d) * H : (d * batch + b) * H; };
  std::vector<double> y(static_cast<size_t>(seq * dirs * batch * H), 0.0), yh(static_cast<size_t>(dirs * batch * H)), yc(yh.size());
  auto cl = [&](double v) { return clip > 0 ? std::max(-clip, std::min(clip, v)) : v; };
  std::vector<double> xw(static_cast<size_t>(GH)), hr(static_cast<size_t>(GH)), h(static_cast<size_t>(H)), c(static_cast<size_t>(H)),
      hn(static_cast<size_t>(H)), rg(static_cast<size_t>(H));
  for (int64_t d = 0; d < dirs; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    const double* wd = w.data() + d * GH * in;
    const double* rd = r.data() + d * GH * H;
    const double* wb = bias.data() + d * 2 * GH;
    const double* rb = wb + GH;
    const double* pd = p.data() + d * 3 * H;
    const RnnActivation& f = acts[static_cast<size_t>(d * (gates == 1 ? 1 : gates == 3 ? 2 : 3))];
    const RnnActivation& g = gates == 1 ? f : acts[static_cast<size_t>(d * (gates == 3 ? 2 : 3) + 1)];
    const RnnActivation& ha = gates == 4 ? acts[static_cast<size_t>(d * 3 + 2)] : f;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < H; ++j) {
        h[static_cast<size_t>(j)] = h0[static_cast<size_t>(so(d, b) + j)];
        c[static_cast<size_t>(j)] = c0[static_cast<size_t>(so(d, b) + j)];
      }
      const int64_t len = lens[static_cast<size_t>(b)];
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = reverse ? len - 1 - s : s;
        const double* xt = x.data() + xo(t, b);
        for (int64_t gi = 0; gi < GH; ++gi) {
          double a = wb[gi], e = rb[gi];
          for (int64_t k = 0; k < in; ++k) a += xt[k] * wd[gi * in + k];
          for (int64_t k = 0; k < H; ++k) e += h[static_cast<size_t>(k)] * rd[gi * H + k];
          xw[static_cast<size_t>(gi)] = a;
          hr[static_cast<size_t>(gi)] = e;
        }
        if (cell == Cell::gru)
          for (int64_t j = 0; j < H; ++j)
            rg[static_cast<size_t>(j)] = f(cl(xw[static_cast<size_t>(H + j)] + hr[static_cast<size_t>(H + j)]));
        for (int64_t j = 0; j < H; ++j) {
          const size_t J = static_cast<size_t>(j);
          if (cell == Cell::rnn) {
            hn[J] = f(cl(xw[J] + hr[J]));
          } else if (cell == Cell::gru) {
            double z = f(cl(xw[J] + hr[J]));
            double rr = rg[J];
            double pre;
            if (lbr) {
              pre = xw[J + 2 * H] + rr * hr[J + 2 * H];
            } else {
              // (r * h) R_h^T + Rb_h: hr holds h R_h^T, which is the other variant.
              double e = rb[2 * H + j];
              for (int64_t k = 0; k < H; ++k)
                e += rg[static_cast<size_t>(k)] * h[static_cast<size_t>(k)] * rd[(2 * H + j) * H + k];
              pre = xw[J + 2 * H] + e;
            }
            double hh = g(cl(pre));
            hn[J] = (1 - z) * hh + z * h[J];
          } else {
            double ig = f(cl(xw[J] + hr[J] + pd[j] * c[J]));
            double fg = input_forget ? 1 - ig : f(cl(xw[J + 2 * H] + hr[J + 2 * H] + pd[2 * H + j] * c[J]));
            double cc = g(cl(xw[J + 3 * H] + hr[J + 3 * H]));
            double cn = fg * c[J] + ig * cc;
            double og = f(cl(xw[J + H] + hr[J + H] + pd[H + j] * cn));
            c[J] = cn;
            hn[J] = og * ha(cn);
          }
        }
        h = hn;
        for (int64_t j = 0; j < H; ++j) y[static_cast<size_t>(yo(t, d, b) + j)] = h[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < H; ++j) {
        yh[static_cast<size_t>(so(d, b) + j)] = h[static_cast<size_t>(j)];
        yc[static_cast<size_t>(so(d, b) + j)] = c[static_cast<size_t>(j)];
      }
    }
  }
  if (ctx.num_outputs() > 0 && n.outputs[0] != kNoValue) store(ctx.output(0), y);
  if (ctx.num_outputs() > 1 && n.outputs[1] != kNoValue) store(ctx.output(1), yh);
  if (ctx.num_outputs() > 2 && n.outputs[2] != kNoValue) store(ctx.output(2), yc);
  return {};
}

Status ref_rnn(KernelContext& ctx) { return run_recurrent(ctx, Cell::rnn); }
Status ref_gru(KernelContext& ctx) { return run_recurrent(ctx, Cell::gru); }
Status ref_lstm(KernelContext& ctx) { return run_recurrent(ctx, Cell::lstm); }

}  // namespace

void register_ref_misc_rnn(KernelRegistry& r) {
  r.add_reference("RNN", ref_rnn);
  r.add_reference("GRU", ref_gru);
  r.add_reference("LSTM", ref_lstm);
}

}  // namespace kiln
