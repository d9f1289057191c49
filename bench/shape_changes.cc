// A model served at changing input shapes in one process (one compiled without --input-shape,
// typically): what each new shape costs on its first run (planning: shapes, memory, kernels
// prepared, weights packed or taken from the plans before), what a run costs once planned, and
// the process's resident memory after each shape.
//
//   kiln_bench_shape_changes MODEL.kiln SHAPES... [--threads T] [--runs N]
//
// SHAPES gives every input's shape, comma-separated: input_ids=1x128,attention_mask=1x128.
// The shapes run in the order given, then once more in that order (each plan is then cached,
// up to Session::kMaxCachedPlans). Inputs are random, valid for the model (runtime/random_inputs.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "formats/serialize.h"
#include "runtime/random_inputs.h"
#include "runtime/session.h"

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

// Resident memory now, from /proc/self/statm (MB).
double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1e6;
}

// "a=1x128,b=1x128" as one shape per graph input, or an error message.
std::string parse_shapes(const kiln::Graph& g, const std::string& text, std::vector<std::vector<int64_t>>& shapes) {
  std::map<std::string, std::vector<int64_t>> named;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return "'" + item + "': expected NAME=SHAPE";
    std::vector<int64_t> dims;
    for (size_t d = eq + 1; d <= item.size();) {
      const size_t x = std::min(item.find('x', d), item.size());
      char* end = nullptr;
      const std::string dim = item.substr(d, x - d);
      const long long v = std::strtoll(dim.c_str(), &end, 10);
      if (dim.empty() || *end || v < 0) return "'" + item + "': dims are non-negative integers separated by x";
      dims.push_back(v);
      d = x + 1;
    }
    named[item.substr(0, eq)] = dims;
    at = comma + 1;
  }
  shapes.clear();
  for (kiln::ValueId id : g.inputs) {
    auto it = named.find(g.value(id).name);
    if (it == named.end()) return "'" + text + "' gives no shape for input '" + g.value(id).name + "'";
    shapes.push_back(it->second);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, runs = 10;
  std::vector<std::string> signatures;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--threads" || arg == "--runs") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v < 1) {
        std::fprintf(stderr, "kiln_bench_shape_changes: %s takes a count of at least 1\n", arg.c_str());
        return 2;
      }
      (arg == "--threads" ? threads : runs) = v;
    } else if (path.empty()) {
      path = arg;
    } else {
      signatures.push_back(arg);
    }
  }
  if (path.empty() || signatures.empty()) {
    std::fprintf(stderr, "usage: kiln_bench_shape_changes MODEL.kiln NAME=SHAPE[,NAME=SHAPE...]... [--threads T] [--runs N]\n");
    return 2;
  }
  auto model = kiln::load_model(path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.error().message().c_str());
    return 1;
  }
  std::vector<std::vector<std::vector<int64_t>>> shapes(signatures.size());
  for (size_t s = 0; s < signatures.size(); ++s)
    if (std::string why = parse_shapes(model->graph, signatures[s], shapes[s]); !why.empty()) {
      std::fprintf(stderr, "kiln_bench_shape_changes: %s\n", why.c_str());
      return 2;
    }
  kiln::SessionOptions options;
  options.target.threads = threads;
  const auto t0 = clock_type::now();
  auto session = kiln::Session::create(*model, options);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.error().message().c_str());
    return 1;
  }
  std::printf("session %.1f ms, RSS %.1f MB; %d thread(s), %d timed runs a shape\n", ms_since(t0), rss_mb(), threads, runs);
  std::printf("%-5s %-44s %10s %10s %10s %9s %14s\n", "pass", "shapes", "first ms", "median ms", "planning", "RSS MB",
              "packed MB");
  for (int pass = 1; pass <= 2; ++pass)
    for (size_t s = 0; s < signatures.size(); ++s) {
      const std::vector<kiln::Tensor> inputs = kiln::random_inputs(model->graph, shapes[s], 1);
      auto t = clock_type::now();
      if (auto out = (*session)->run(inputs); !out.ok()) {
        std::fprintf(stderr, "%s\n", out.error().message().c_str());
        return 1;
      }
      const double first = ms_since(t);
      std::vector<double> times;
      for (int r = 0; r < runs; ++r) {
        t = clock_type::now();
        if (!(*session)->run(inputs).ok()) return 1;
        times.push_back(ms_since(t));
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      // What the first run cost beyond a planned run: planning the shape (none once cached).
      std::printf("%-5d %-44s %10.1f %10.2f %10.1f %9.1f %14.1f\n", pass, signatures[s].c_str(), first, median, first - median,
                  rss_mb(), static_cast<double>((*session)->packed_weight_bytes()) / 1e6);
    }
  return 0;
}
