// Two compiled models in one process, their runs alternated: how much faster B is than A on
// the same inputs, told apart from a noisy machine's drift (a neighbour's load, the clock),
// which moves two separate `kiln run` processes minutes apart by more than the difference
// between them.
//
//   kiln_bench_pair A.kiln B.kiln INPUTS.npz [--threads T] [--runs N] [--warmup N]
//
// Each count is at least 1: the first warm-up run of each model also builds its plan, which no
// timed run should pay.
//
// A is typically a model compiled by the kiln before a change and B by the one after (each
// file records its kernels and their parameters, so one binary runs both as compiled), or the
// default compile against max-autotune's or a --precision one. Each of the N rounds runs A
// and B once, which first alternating, and their time ratio B/A is one paired sample: both
// runs saw nearly the same machine. Prints each side's median with its quartiles and the
// median paired ratio with its quartiles.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/npy.h"
#include "formats/serialize.h"
#include "runtime/session.h"

namespace {

using clock_type = std::chrono::steady_clock;

// The q-quantile (0..1) of v, nearest rank below.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || (argc - 4) % 2 != 0) {
    std::fprintf(stderr, "usage: kiln_bench_pair A.kiln B.kiln INPUTS.npz [--threads T] [--runs N] [--warmup N]\n");
    return 2;
  }
  int threads = 1, runs = 30, warmup = 3;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--threads" && v >= 1) threads = v;
    else if (flag == "--runs" && v >= 1) runs = v;
    else if (flag == "--warmup" && v >= 1) warmup = v;
    else {
      std::fprintf(stderr, "kiln_bench_pair: %s %s: the flags are --threads, --runs and --warmup, each a count of at least 1 "
                           "(the first warm-up run also builds the plan)\n", flag.c_str(), argv[i + 1]);
      return 2;
    }
  }
  auto named = kiln::read_npz_file(argv[3]);
  if (!named.ok()) {
    std::fprintf(stderr, "%s\n", named.error().message().c_str());
    return 1;
  }
  const std::map<std::string, kiln::Tensor> inputs(named->begin(), named->end());
  kiln::SessionOptions options;
  options.target.threads = threads;
  std::vector<kiln::Model> models;
  std::vector<std::unique_ptr<kiln::Session>> sessions;
  for (int m = 0; m < 2; ++m) {
    auto model = kiln::load_model(argv[1 + m]);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.error().message().c_str());
      return 1;
    }
    models.push_back(std::move(*model));
  }
  for (const kiln::Model& model : models) {
    auto session = kiln::Session::create(model, options);
    if (!session.ok()) {
      std::fprintf(stderr, "%s\n", session.error().message().c_str());
      return 1;
    }
    sessions.push_back(std::move(*session));
  }
  auto run = [&](int m) {
    const auto t0 = clock_type::now();
    auto out = sessions[static_cast<size_t>(m)]->run(inputs);
    if (!out.ok()) {
      std::fprintf(stderr, "%s: %s\n", argv[1 + m], out.error().message().c_str());
      std::exit(1);
    }
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  };
  for (int i = 0; i < warmup; ++i)
    for (int m = 0; m < 2; ++m) run(m);
  std::vector<double> times[2], ratios;
  for (int r = 0; r < runs; ++r) {
    double t[2];
    const int first = r % 2;
    t[first] = run(first);
    t[1 - first] = run(1 - first);
    times[0].push_back(t[0]);
    times[1].push_back(t[1]);
    ratios.push_back(t[1] / t[0]);
  }
  std::printf("%d threads, %d rounds: A %.3g ms (%.3g-%.3g)  B %.3g ms (%.3g-%.3g)  paired B/A %.3f (%.3f-%.3f)\n", threads, runs,
              quantile(times[0], 0.5), quantile(times[0], 0.25), quantile(times[0], 0.75), quantile(times[1], 0.5),
              quantile(times[1], 0.25), quantile(times[1], 0.75), quantile(ratios, 0.5), quantile(ratios, 0.25),
              quantile(ratios, 0.75));
  return 0;
}
