// `kiln profile --compare BASE.json`: a profile against an earlier one, end to end and per
// kernel call site, with a significance test so that noise is not called a regression.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "formats/status.h"

namespace kiln::profile {

/// What a comparison needs of a profile document.
struct ProfileSamples {
  struct Node {
    std::string name, kernel;
    double share = 0;             ///< of the run
    std::vector<double> times_us; ///< per run
  };
  std::string model;
  std::string cpu;
  int threads = 0;
  std::vector<std::string> inputs;  ///< "name: f32[1x3x224x224]" per graph input, in order
  std::vector<double> iteration_ms;
  std::vector<Node> nodes;
};

/// Reads a "kiln.profile" document (version 1) from bytes; a user error naming `file` for
/// anything else (not JSON, another schema or version, a missing or mistyped field, no runs).
Result<ProfileSamples> read_profile_samples(std::string_view bytes, const std::string& file);
/// The same from a document already parsed.
Result<ProfileSamples> profile_samples(const nlohmann::ordered_json& doc, const std::string& file);

/// Two-sided Mann–Whitney U test of whether two samples come from the same distribution:
/// the p-value by the normal approximation with the tie correction (and a continuity
/// correction). 1 when either sample has fewer than 2 values or all values tie.
double mann_whitney_p(const std::vector<double>& a, const std::vector<double>& b);

struct CompareOptions {
  double max_regression = 0.05;  ///< a median rise past this fraction...
  double alpha = 0.01;           ///< ...with a Mann–Whitney p below this is a regression
  bool per_kernel = false;       ///< kernels above min_share of the run fail the check too
  double min_share = 0.01;
};

/// One matched measurement, base against now.
struct Delta {
  std::string what;  ///< "end to end", or the node's name
  std::string kernel;
  double base_median = 0, median = 0;  ///< ms end to end, µs per node
  double change = 0;                   ///< median / base_median - 1
  double p = 1;
  double share = 0;        ///< of the run now (nodes)
  bool significant = false;  ///< p < alpha
  bool regressed = false;    ///< change > max_regression and significant
  bool improved = false;     ///< change < -max_regression and significant
};

struct Comparison {
  Delta end_to_end;
  std::vector<Delta> nodes;              ///< every node in both, in the current profile's order
  std::vector<std::string> only_base;    ///< call sites (name [kernel]) the current profile lacks
  std::vector<std::string> only_now;     ///< and the other way round
  double base_spread = 0, spread = 0;    ///< (p90 - p10) / median of the runs' latencies
  std::vector<std::string> notes;        ///< machine, threads, inputs or graph differ; spread past the limit
  bool failed = false;  ///< the end to end regressed, or (per_kernel) a kernel above min_share did
};

Comparison compare_profiles(const ProfileSamples& base, const ProfileSamples& now, const CompareOptions& options);

/// The comparison as the "comparison" object of the profile document.
nlohmann::ordered_json to_json(const Comparison& c, const CompareOptions& options, const std::string& base_file);

/// Lines for a terminal: the end to end, then every significant change past the limit, slowest first.
std::string render_comparison(const Comparison& c, const CompareOptions& options, const std::string& base_file);

}  // namespace kiln::profile
