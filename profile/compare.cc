#include "profile/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "profile/stats.h"

namespace kiln::profile {

namespace {

using json = nlohmann::ordered_json;

double spread_of(const std::vector<double>& v) {
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  const double m = median(v);
  return m > 0 ? (percentile(sorted, 0.9) - percentile(sorted, 0.1)) / m : 0;
}

// A list of non-negative finite numbers, or an error naming `what`.
Result<std::vector<double>> numbers(const json& j, const std::string& file, const std::string& what) {
  if (!j.is_array()) return user_error(file, what + ": expected an array of numbers");
  std::vector<double> out;
  out.reserve(j.size());
  for (const auto& x : j) {
    if (!x.is_number()) return user_error(file, what + ": expected an array of numbers");
    const double v = x.get<double>();
    if (!std::isfinite(v) || v < 0) return user_error(file, what + ": holds " + x.dump().substr(0, 40) + ", not a time");
    out.push_back(v);
  }
  return out;
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * x);
  return buf;
}

Delta make_delta(std::string what, std::string kernel, const std::vector<double>& base, const std::vector<double>& now,
                 const CompareOptions& o) {
  Delta d;
  d.what = std::move(what);
  d.kernel = std::move(kernel);
  d.base_median = median(base);
  d.median = median(now);
  d.change = d.base_median > 0 ? d.median / d.base_median - 1 : 0;
  d.p = mann_whitney_p(base, now);
  d.significant = d.p < o.alpha;
  d.regressed = d.significant && d.change > o.max_regression;
  d.improved = d.significant && d.change < -o.max_regression;
  return d;
}

}  // namespace

Result<ProfileSamples> profile_samples(const json& doc, const std::string& file) {
  if (!doc.is_object() || !doc.contains("schema") || doc["schema"] != "kiln.profile")
    return user_error(file, "not a kiln profile (expected \"schema\": \"kiln.profile\", from kiln profile --json)");
  if (!doc.contains("schema_version") || !doc["schema_version"].is_number_integer() || doc["schema_version"] != 1)
    return user_error(file, "kiln.profile schema_version " + (doc.contains("schema_version") ? doc["schema_version"].dump().substr(0, 40) : std::string("missing")) +
                                " is not one this kiln reads (1)");
  ProfileSamples s;
  auto str = [&](const json& obj, const char* key, std::string& out) -> Status {
    if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string()) return user_error(file, std::string("\"") + key + "\": expected a string");
    out = obj[key].get<std::string>();
    return {};
  };
  if (!doc.contains("model")) return user_error(file, "\"model\": missing");
  KILN_RETURN_IF_ERROR(str(doc["model"], "file", s.model));
  if (!doc.contains("machine")) return user_error(file, "\"machine\": missing");
  KILN_RETURN_IF_ERROR(str(doc["machine"], "cpu", s.cpu));
  if (!doc.contains("run") || !doc["run"].is_object() || !doc["run"].contains("threads") || !doc["run"]["threads"].is_number_integer())
    return user_error(file, "\"run\".\"threads\": expected an integer");
  s.threads = doc["run"]["threads"].get<int>();
  // The inputs' names, dtypes and shapes: a baseline at another batch size is another workload.
  if (const json& ins = doc["run"].contains("inputs") ? doc["run"]["inputs"] : json(); !ins.is_null()) {
    if (!ins.is_array()) return user_error(file, "\"run\".\"inputs\": expected an array");
    for (const json& t : ins) {
      std::string name, dtype, shape;
      if (t.is_null()) continue;  // an input the profile could not describe
      KILN_RETURN_IF_ERROR(str(t, "name", name));
      KILN_RETURN_IF_ERROR(str(t, "dtype", dtype));
      if (!t.contains("shape") || !t["shape"].is_array()) return user_error(file, "input '" + name + "': \"shape\": expected an array");
      for (const json& d : t["shape"]) {
        if (!d.is_number_integer()) return user_error(file, "input '" + name + "': \"shape\": expected integers");
        shape += (shape.empty() ? "" : "x") + std::to_string(d.get<int64_t>());
      }
      s.inputs.push_back(name + ": " + dtype + "[" + shape + "]");
    }
  }
  if (!doc.contains("iteration_ms")) return user_error(file, "\"iteration_ms\": missing");
  KILN_ASSIGN_OR_RETURN(s.iteration_ms, numbers(doc["iteration_ms"], file, "\"iteration_ms\""));
  if (s.iteration_ms.empty()) return user_error(file, "\"iteration_ms\": no runs");
  if (!doc.contains("nodes") || !doc["nodes"].is_array()) return user_error(file, "\"nodes\": expected an array");
  for (const auto& n : doc["nodes"]) {
    ProfileSamples::Node node;
    KILN_RETURN_IF_ERROR(str(n, "name", node.name));
    KILN_RETURN_IF_ERROR(str(n, "kernel", node.kernel));
    if (!n.contains("share") || !n["share"].is_number()) return user_error(file, "node '" + node.name + "': \"share\": expected a number");
    node.share = n["share"].get<double>();
    if (!n.contains("times_us")) return user_error(file, "node '" + node.name + "': \"times_us\": missing");
    KILN_ASSIGN_OR_RETURN(node.times_us, numbers(n["times_us"], file, "node '" + node.name + "': \"times_us\""));
    s.nodes.push_back(std::move(node));
  }
  return s;
}

Result<ProfileSamples> read_profile_samples(std::string_view bytes, const std::string& file) {
  json doc = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return user_error(file, "not valid JSON (expected a kiln profile from kiln profile --json)");
  return profile_samples(doc, file);
}

double mann_whitney_p(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n1 = a.size(), n2 = b.size(), n = n1 + n2;
  if (n1 < 2 || n2 < 2) return 1;
  std::vector<std::pair<double, int>> all;
  all.reserve(n);
  for (double x : a) all.emplace_back(x, 0);
  for (double x : b) all.emplace_back(x, 1);
  std::sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  // Average ranks over ties; the tie term sums t³ - t over each group of t equal values.
  double rank_sum_a = 0, ties = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const double avg_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (size_t k = i; k < j; ++k)
      if (all[k].second == 0) rank_sum_a += avg_rank;
    ties += t * t * t - t;
    i = j;
  }
  const double dn1 = static_cast<double>(n1), dn2 = static_cast<double>(n2), dn = static_cast<double>(n);
  const double u = rank_sum_a - dn1 * (dn1 + 1) / 2;
  const double mu = dn1 * dn2 / 2;
  const double var = dn1 * dn2 / 12 * ((dn + 1) - ties / (dn * (dn - 1)));
  if (!(var > 0)) return 1;
  const double z = std::max(0.0, std::abs(u - mu) - 0.5) / std::sqrt(var);
  return std::erfc(z / std::sqrt(2.0));
}

Comparison compare_profiles(const ProfileSamples& base, const ProfileSamples& now, const CompareOptions& o) {
  Comparison c;
  c.end_to_end = make_delta("end to end", "", base.iteration_ms, now.iteration_ms, o);
  c.base_spread = spread_of(base.iteration_ms);
  c.spread = spread_of(now.iteration_ms);
  // A node is its name and kernel, and which of the nodes of that name and kernel it is in the
  // profile's order: a graph's node names need not be unique, and the k-th of a name pairs with
  // the k-th.
  using Key = std::tuple<std::string, std::string, int>;
  auto keys_of = [](const std::vector<ProfileSamples::Node>& nodes) {
    std::map<std::pair<std::string, std::string>, int> seen;
    std::vector<Key> keys;
    for (const auto& n : nodes) keys.emplace_back(n.name, n.kernel, seen[{n.name, n.kernel}]++);
    return keys;
  };
  const std::vector<Key> base_keys = keys_of(base.nodes), now_keys = keys_of(now.nodes);
  std::map<Key, const ProfileSamples::Node*> base_nodes;
  for (size_t i = 0; i < base.nodes.size(); ++i) base_nodes[base_keys[i]] = &base.nodes[i];
  std::set<Key> matched;
  for (size_t i = 0; i < now.nodes.size(); ++i) {
    const ProfileSamples::Node& n = now.nodes[i];
    auto it = base_nodes.find(now_keys[i]);
    if (it == base_nodes.end()) {
      c.only_now.push_back(n.name + " [" + n.kernel + "]");
      continue;
    }
    matched.insert(it->first);
    Delta d = make_delta(n.name, n.kernel, it->second->times_us, n.times_us, o);
    d.share = n.share;
    c.nodes.push_back(d);
  }
  for (size_t i = 0; i < base.nodes.size(); ++i)
    if (!matched.count(base_keys[i])) c.only_base.push_back(base.nodes[i].name + " [" + base.nodes[i].kernel + "]");
  if (base.cpu != now.cpu) c.notes.push_back("the baseline ran on another CPU (" + base.cpu + ")");
  if (base.threads != now.threads)
    c.notes.push_back("the baseline ran on " + std::to_string(base.threads) + " threads, this profile on " + std::to_string(now.threads));
  if (base.inputs != now.inputs) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
      return s.empty() ? std::string("none") : s;
    };
    c.notes.push_back("the baseline ran on other inputs (" + list(base.inputs) + "; now " + list(now.inputs) + ")");
  }
  // Most call sites unmatched: the baseline profiled another model (or one compiled otherwise).
  if (!base.nodes.empty() && 2 * c.nodes.size() < base.nodes.size())
    c.notes.push_back("only " + std::to_string(c.nodes.size()) + " of the baseline's " + std::to_string(base.nodes.size()) +
                      " call sites (node and kernel) are in this profile: was it another model, " + base.model + "?");
  const double spread = std::max(c.base_spread, c.spread);
  if (spread > o.max_regression)
    c.notes.push_back("the runs' spread (p90 - p10 over the median: " + percent(c.base_spread).substr(1) + " then, " +
                      percent(c.spread).substr(1) + " now) is larger than the " + percent(o.max_regression).substr(1) +
                      " limit: only the significance test tells a regression that small from noise");
  c.failed = c.end_to_end.regressed;
  if (o.per_kernel)
    for (const Delta& d : c.nodes)
      if (d.regressed && d.share >= o.min_share) c.failed = true;
  return c;
}

json to_json(const Comparison& c, const CompareOptions& o, const std::string& base_file) {
  auto delta = [](const Delta& d, bool node) {
    json j;
    if (node) {
      j["name"] = d.what;
      j["kernel"] = d.kernel;
      j["share"] = d.share;
    }
    j["base_median"] = d.base_median;
    j["median"] = d.median;
    j["change"] = d.change;
    j["p"] = d.p;
    j["regressed"] = d.regressed;
    j["improved"] = d.improved;
    return j;
  };
  json nodes = json::array();
  for (const Delta& d : c.nodes) nodes.push_back(delta(d, true));
  json j;
  j["base"] = base_file;
  j["max_regression"] = o.max_regression;
  j["alpha"] = o.alpha;
  j["per_kernel"] = o.per_kernel;
  j["end_to_end_ms"] = delta(c.end_to_end, false);
  j["spread"] = {{"base", c.base_spread}, {"now", c.spread}};
  j["nodes_us"] = nodes;
  j["only_base"] = c.only_base;
  j["only_now"] = c.only_now;
  j["notes"] = c.notes;
  j["failed"] = c.failed;
  return j;
}

std::string render_comparison(const Comparison& c, const CompareOptions& o, const std::string& base_file) {
  std::ostringstream out;
  char line[512];
  const Delta& e = c.end_to_end;
  std::snprintf(line, sizeof line, "against %s: end to end p50 %.4g ms -> %.4g ms (%s, Mann-Whitney p=%.2g): %s\n",
                escape_controls(base_file).c_str(), e.base_median, e.median, percent(e.change).c_str(), e.p,
                e.regressed ? "REGRESSED" : e.improved ? "faster" : e.significant ? "within the limit" : "no significant change");
  out << line;
  std::vector<const Delta*> changed;
  for (const Delta& d : c.nodes)
    if (d.regressed || d.improved) changed.push_back(&d);
  std::stable_sort(changed.begin(), changed.end(), [](const Delta* a, const Delta* b) { return a->change > b->change; });
  for (const Delta* d : changed) {
    std::snprintf(line, sizeof line, "  %-7s %8.1f us -> %8.1f us (%s, p=%.2g, %.1f%% of the run)  %s [%s]\n",
                  d->regressed ? "slower" : "faster", d->base_median, d->median, percent(d->change).c_str(), d->p,
                  100 * d->share, escape_controls(d->what).c_str(), escape_controls(d->kernel).c_str());
    out << line;
  }
  if (changed.empty()) out << "  no kernel changed by more than " << percent(o.max_regression).substr(1) << " significantly\n";
  for (const std::string& s : c.only_base) out << "  only in the baseline: " << escape_controls(s) << "\n";
  for (const std::string& s : c.only_now) out << "  only now: " << escape_controls(s) << "\n";
  for (const std::string& s : c.notes) out << "  note: " << escape_controls(s) << "\n";
  return out.str();
}

}  // namespace kiln::profile
