// What timing every node costs: one session, runs with and without kiln profile's recorder
// attached, interleaved in rounds in the same process (so that memory placement and clocks are
// the same for both), and how much of the wall-clock time the node times account for.
//
//   kiln_bench_profile_overhead MODEL.kiln INPUTS.npz [--threads T] [--rounds R] [--iters N]
//
// Each round times N plain Session::run calls and N calls inside profile::measure (the recorder
// on every node), in alternating order. Prints one JSON line: the median latency of each side
// over all its runs, the min and max of the round medians, the overhead (profiled median over
// plain median, less 1), and the median share of the wall time the node times sum to.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/npy.h"
#include "formats/serialize.h"
#include "profile/profiler.h"
#include "profile/stats.h"
#include "runtime/threads.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kiln_bench_profile_overhead MODEL.kiln INPUTS.npz [--threads T] [--rounds R] [--iters N]\n");
    return 2;
  }
  int threads = kiln::available_cores(), rounds = 20, iters = 10;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--threads") threads = v;
    else if (flag == "--rounds") rounds = v;
    else if (flag == "--iters") iters = v;
  }
  auto model = kiln::load_model(argv[1]);
  auto named = model.ok() ? kiln::read_npz_file(argv[2]) : kiln::Result<kiln::NamedTensors>(model.error());
  if (!named.ok()) {
    std::fprintf(stderr, "%s\n", named.error().message().c_str());
    return 1;
  }
  std::map<std::string, kiln::Tensor> by_name(named->begin(), named->end());
  std::vector<kiln::Tensor> inputs;
  for (kiln::ValueId id : model->graph.inputs) inputs.push_back(by_name[model->graph.value(id).name]);
  kiln::SessionOptions options;
  options.target.threads = threads;
  auto session = kiln::Session::create(*model, options);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.error().message().c_str());
    return 1;
  }
  for (int i = 0; i < 3; ++i)
    if (!(*session)->run(inputs).ok()) return 1;

  using clock_type = std::chrono::steady_clock;
  std::vector<double> plain, profiled, plain_rounds, profiled_rounds, shares;
  kiln::profile::RunOptions ro;
  ro.warmup = 0;
  ro.iterations = iters;
  for (int r = 0; r < rounds; ++r) {
    for (int side = 0; side < 2; ++side) {
      if ((side == 0) == (r % 2 == 0)) {  // plain first on even rounds
        std::vector<double> ms;
        for (int i = 0; i < iters; ++i) {
          const auto t0 = clock_type::now();
          if (!(*session)->run(inputs).ok()) return 1;
          ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        }
        plain.insert(plain.end(), ms.begin(), ms.end());
        plain_rounds.push_back(kiln::profile::median(ms));
      } else {
        auto m = kiln::profile::measure(**session, inputs, ro);
        if (!m.ok()) return 1;
        profiled.insert(profiled.end(), m->iteration_ms.begin(), m->iteration_ms.end());
        profiled_rounds.push_back(kiln::profile::median(m->iteration_ms));
        for (size_t i = 0; i < m->iteration_ms.size(); ++i) {
          double sum = 0;
          for (const auto& node : m->node_us) sum += node[i] / 1e3;
          shares.push_back(sum / m->iteration_ms[i]);
        }
      }
    }
  }
  const double a = kiln::profile::median(plain), b = kiln::profile::median(profiled);
  nlohmann::ordered_json j = {
      {"model", argv[1]},
      {"threads", (*session)->run_threads()},
      {"runs", plain.size()},
      {"plain_ms", {{"median", a}, {"round_min", *std::min_element(plain_rounds.begin(), plain_rounds.end())},
                    {"round_max", *std::max_element(plain_rounds.begin(), plain_rounds.end())}}},
      {"profiled_ms", {{"median", b}, {"round_min", *std::min_element(profiled_rounds.begin(), profiled_rounds.end())},
                       {"round_max", *std::max_element(profiled_rounds.begin(), profiled_rounds.end())}}},
      {"overhead", b / a - 1},
      {"kernel_share", kiln::profile::median(shares)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
