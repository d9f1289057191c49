// Whether Debian's XNNPACK earns a provider next to oneDNN: the same f32 operations through both
// libraries' own APIs, one thread, on the shapes the real models run (MobileNetV2's and
// EfficientNet's depthwise and pointwise convolutions on NHWC tensors, the transformers'
// batch-1 and small-batch fully-connected layers), each with its weights packed ahead as a
// kiln kernel would pack them. Prints the median time of each and oneDNN's over XNNPACK's.
//
//   kiln_bench_xnnpack_vs_onednn [--runs N]
//
// Single-threaded on purpose: XNNPACK parallelises on its own pthreadpool, a second thread pool
// next to GNU OpenMP's (which oneDNN and kiln share), so a multi-threaded XNNPACK provider
// would oversubscribe the machine.
#include <oneapi/dnnl/dnnl.hpp>
#include <xnnpack.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/threads.h"

namespace {

using dnnl::memory;
using tag = memory::format_tag;

int g_runs = 41;

template <class F>
double median_us(F&& f) {
  for (int i = 0; i < 5; ++i) f();
  std::vector<double> t;
  for (int r = 0; r < g_runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> wave(size_t n, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * step);
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

void row(const std::string& what, double onednn, double xnn, double diff) {
  std::printf("%-34s %10.1f %10.1f %8.2f  %s  (max |diff| %.1e)\n", what.c_str(), onednn, xnn, onednn / xnn,
              onednn <= xnn ? "oneDNN" : "XNNPACK", diff);
}

// A 2-D convolution on a [1, H, H, C] NHWC input: C -> K channels, k x k, stride s, groups g.
void conv(int C, int H, int K, int k, int s, int g) {
  const int p = k / 2, oh = (H + 2 * p - k) / s + 1;
  std::vector<float> x = wave(static_cast<size_t>(H) * H * C, 0.1f), w = wave(static_cast<size_t>(K) * (C / g) * k * k, 0.3f);
  std::vector<float> b(static_cast<size_t>(K), 0.1f), y(static_cast<size_t>(oh) * oh * K), y2(y.size());
  dnnl::engine e(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(e);
  const memory::dims wd = g == 1 ? memory::dims{K, C, k, k} : memory::dims{g, K / g, C / g, k, k};
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                    {{1, C, H, H}, memory::data_type::f32, tag::nhwc}, {wd, memory::data_type::f32, tag::any},
                                    {{K}, memory::data_type::f32, tag::a}, {{1, K, oh, oh}, memory::data_type::f32, tag::nhwc},
                                    {s, s}, {p, p}, {p, p});
  dnnl::convolution_forward::primitive_desc pd(d, e);
  memory W(pd.weights_desc(), e), S(pd.src_desc(), e, x.data()), D(pd.dst_desc(), e, y.data());
  memory B({{K}, memory::data_type::f32, tag::a}, e, b.data());
  memory user_w({wd, memory::data_type::f32, g == 1 ? tag::oihw : tag::goihw}, e, w.data());
  dnnl::reorder(user_w, W).execute(st, user_w, W);
  st.wait();
  dnnl::convolution_forward prim(pd);
  const double t_dnnl = median_us([&] {
    prim.execute(st, {{DNNL_ARG_SRC, S}, {DNNL_ARG_WEIGHTS, W}, {DNNL_ARG_BIAS, B}, {DNNL_ARG_DST, D}});
    st.wait();
  });
  // XNNPACK's weights: [K, k, k, C/g] per output channel, or [k, k, C] for depthwise.
  std::vector<float> wx(w.size());
  uint32_t flags = 0;
  if (g == C && K == C) {
    flags = XNN_FLAG_DEPTHWISE_CONVOLUTION;
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < k * k; ++i) wx[static_cast<size_t>(i) * C + c] = w[static_cast<size_t>(c) * k * k + i];
  } else {
    const int cg = C / g;
    for (int o = 0; o < K; ++o)
      for (int ci = 0; ci < cg; ++ci)
        for (int i = 0; i < k * k; ++i)
          wx[(static_cast<size_t>(o) * k * k + i) * cg + ci] = w[(static_cast<size_t>(o) * cg + ci) * k * k + i];
  }
  xnn_operator_t op = nullptr;
  if (xnn_create_convolution2d_nhwc_f32(p, p, p, p, k, k, s, s, 1, 1, g, C / g, K / g, C, K, wx.data(), b.data(), -INFINITY,
                                        INFINITY, flags, &op) != xnn_status_success ||
      xnn_setup_convolution2d_nhwc_f32(op, 1, H, H, x.data(), y2.data(), nullptr) != xnn_status_success) {
    std::printf("conv: XNNPACK refused the shape\n");
    return;
  }
  const double t_xnn = median_us([&] { xnn_run_operator(op, nullptr); });
  xnn_delete_operator(op);
  char what[96];
  std::snprintf(what, sizeof what, "conv %s %dx%d s%d C%d->%d @%d", g == C ? "dw" : "", k, k, s, C, K, H);
  row(what, t_dnnl, t_xnn, max_diff(y, y2));
}

// Y[M, N] = X[M, K] · W[K, N]: oneDNN's matmul with W packed, XNNPACK's fully-connected.
void linear(int M, int K, int N) {
  std::vector<float> x = wave(static_cast<size_t>(M) * K, 0.37f), w = wave(static_cast<size_t>(K) * N, 0.11f);
  std::vector<float> wt(w.size()), y(static_cast<size_t>(M) * N), y2(y.size());
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) wt[static_cast<size_t>(n) * K + k] = w[static_cast<size_t>(k) * N + n];
  dnnl::engine e(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(e);
  const memory::desc a({M, K}, memory::data_type::f32, tag::ab), c({M, N}, memory::data_type::f32, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, {{K, N}, memory::data_type::f32, tag::any}, c), e);
  memory W(pd.weights_desc(), e), user_w({{K, N}, memory::data_type::f32, tag::ab}, e, w.data());
  dnnl::reorder(user_w, W).execute(st, user_w, W);
  st.wait();
  memory A(a, e, x.data()), C(c, e, y.data());
  dnnl::matmul prim(pd);
  const double t_dnnl = median_us([&] {
    prim.execute(st, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, W}, {DNNL_ARG_DST, C}});
    st.wait();
  });
  xnn_operator_t op = nullptr;
  if (xnn_create_fully_connected_nc_f32(K, N, K, N, wt.data(), nullptr, -INFINITY, INFINITY, 0, &op) != xnn_status_success ||
      xnn_setup_fully_connected_nc_f32(op, M, x.data(), y2.data(), nullptr) != xnn_status_success) {
    std::printf("linear: XNNPACK refused the shape\n");
    return;
  }
  const double t_xnn = median_us([&] { xnn_run_operator(op, nullptr); });
  xnn_delete_operator(op);
  row("linear " + std::to_string(M) + "x" + std::to_string(K) + " @ " + std::to_string(K) + "x" + std::to_string(N), t_dnnl, t_xnn,
      max_diff(y, y2));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--runs") g_runs = std::max(1, std::atoi(argv[i + 1]));
  if (xnn_initialize(nullptr) != xnn_status_success) {
    std::fprintf(stderr, "XNNPACK does not support this CPU\n");
    return 1;
  }
  kiln::use_threads(1);  // oneDNN runs on kiln's pool, GNU OpenMP's
  std::printf("# one thread, median of %d runs after 5 warm-ups; us\n", g_runs);
  std::printf("%-34s %10s %10s %8s  %s\n", "operation", "oneDNN", "XNNPACK", "ratio", "faster");
  // MobileNetV2 / EfficientNet-B0 depthwise, then pointwise convolutions.
  conv(32, 112, 32, 3, 1, 32);
  conv(96, 112, 96, 3, 2, 96);
  conv(144, 56, 144, 3, 1, 144);
  conv(144, 56, 144, 3, 2, 144);
  conv(240, 28, 240, 5, 1, 240);
  conv(672, 14, 672, 5, 1, 672);
  conv(960, 7, 960, 3, 1, 960);
  conv(24, 56, 144, 1, 1, 1);
  conv(144, 56, 24, 1, 1, 1);
  conv(320, 7, 1280, 1, 1, 1);
  // The MLP sample, BERT / GPT-2 layers at batch 1 and at 32 tokens, LLaMA's LM head.
  linear(1, 16, 64);
  linear(64, 64, 64);
  linear(1, 768, 768);
  linear(1, 768, 3072);
  linear(32, 768, 2304);
  linear(32, 512, 32000);
  return 0;
}
