// The profile's text views: the terminal table, CSV and the Chrome trace.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "profile/profiler.h"

namespace kiln::profile {

namespace {

using json = nlohmann::ordered_json;

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt(u == 0 ? "%.0f" : "%.1f", b) + " " + units[u];
}

std::string shape_text(const json& t) {
  if (t.is_null()) return "-";
  std::string s = t["dtype"].get<std::string>() + "[";
  bool first = true;
  for (const auto& d : t["shape"]) {
    if (!first) s += "x";
    s += std::to_string(d.get<int64_t>());
    first = false;
  }
  return s + "]";
}

// Cuts `s` to `w` columns, marking the cut with "~".
std::string fit(const std::string& s, size_t w) {
  if (s.size() <= w) return s;
  if (w == 0) return "";
  return s.substr(0, w - 1) + "~";
}

std::string pad(const std::string& s, size_t w, bool right) {
  std::string t = fit(s, w);
  std::string fill(w - t.size(), ' ');
  return right ? fill + t : t + fill;
}

// A table whose last column takes what the terminal leaves.
struct Table {
  std::vector<std::string> header;
  std::vector<bool> right;
  std::vector<std::vector<std::string>> rows;

  std::string render(int width) const {
    std::vector<std::vector<std::string>> shown = rows;  // names come from the model file
    for (auto& r : shown)
      for (std::string& cell : r) cell = escape_controls(cell);
    std::vector<size_t> w(header.size());
    for (size_t c = 0; c < header.size(); ++c) {
      w[c] = header[c].size();
      for (const auto& r : shown) w[c] = std::max(w[c], r[c].size());
    }
    size_t fixed = 0;
    for (size_t c = 0; c + 1 < w.size(); ++c) fixed += w[c] + 2;
    const size_t last_min = std::max<size_t>(header.back().size(), 12);
    if (width > 0) w.back() = std::min(w.back(), std::max(last_min, static_cast<size_t>(std::max(0, width - static_cast<int>(fixed)))));
    std::string out;
    auto line = [&](const std::vector<std::string>& cells) {
      std::string l;
      for (size_t c = 0; c < cells.size(); ++c) {
        l += pad(cells[c], w[c], right[c]);
        if (c + 1 < cells.size()) l += "  ";
      }
      while (!l.empty() && l.back() == ' ') l.pop_back();
      out += l + "\n";
    };
    line(header);
    for (const auto& r : shown) line(r);
    return out;
  }
};

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string joined(const json& list, const std::string& sep, bool shapes) {
  std::string s;
  for (const auto& x : list) {
    if (!s.empty()) s += sep;
    s += shapes ? shape_text(x) : x.get<std::string>();
  }
  return s;
}

std::string number(const json& x) { return x.dump(); }

}  // namespace

std::string render_table(const json& doc, int width, int top) {
  std::ostringstream out;
  const json& model = doc["model"];
  const json& machine = doc["machine"];
  const json& ceil = machine["ceilings"];
  const json& lat = doc["latency_ms"];
  const json& kt = doc["kernel_time"];
  out << "model    " << escape_controls(model["file"].get<std::string>()) << " (" << model["stage"].get<std::string>()
      << (model["compiled_in_memory"].get<bool>() ? "; compiled in memory with the default passes, as kiln compile would" : "")
      << "), " << model["nodes"].get<int64_t>() << " nodes\n";
  const int threads = doc["run"]["threads"].get<int>(), asked = doc["run"]["threads_requested"].get<int>();
  out << "machine  " << escape_controls(machine["cpu"].get<std::string>()) << ", " << threads << (threads == 1 ? " thread" : " threads");
  if (asked != threads) out << " (of " << asked << " asked: the graph is too little work to share)";
  out << "\n";
  out << "ceilings";
  std::string sep = " ";
  for (const auto& [k, v] : ceil["compute_gflops"].items()) {
    out << sep << k << " " << fmt("%.0f", v.get<double>()) << (k == "int8" ? " GOP/s" : " GFLOP/s");
    if (k == "f32") out << " (" << ceil["f32_isa"].get<std::string>() << ")";
    sep = ", ";
  }
  out << "; read";
  sep = " ";
  for (const auto& level : ceil["memory"]) {
    out << sep << level["level"].get<std::string>() << " " << fmt("%.0f", level["gbps"].get<double>());
    sep = ", ";
  }
  out << " GB/s (" << (ceil["source"] == "cache" ? "cached" : "probed now") << ")\n";
  out << "latency  min " << fmt("%.4g", lat["min"].get<double>()) << " ms, p50 " << fmt("%.4g", lat["p50"].get<double>())
      << ", p90 " << fmt("%.4g", lat["p90"].get<double>()) << ", p99 " << fmt("%.4g", lat["p99"].get<double>()) << " over "
      << doc["run"]["iterations"].get<int64_t>() << " runs (" << doc["run"]["warmup"].get<int64_t>() << " warm-up); "
      << fmt("%.4g", doc["throughput_per_s"].get<double>()) << " runs/s\n";
  out << "memory   peak RSS " << bytes_text(doc["memory"]["peak_rss_bytes"].get<double>()) << ", arena "
      << bytes_text(doc["memory"]["arena_bytes"].get<double>()) << ", workspace "
      << bytes_text(doc["memory"]["workspace_bytes"].get<double>()) << "\n";
  // Absent where nothing was mapped or asked for 2 MiB pages, or smaps could not be read.
  std::string pages;
  const json& mem = doc["memory"];
  for (const auto& [what, key] :
       {std::pair{"model file ", "model_file"}, std::pair{"buffers that asked for them ", "huge_page_buffers"}}) {
    const std::string resident = std::string(key) + "_resident_bytes", huge = std::string(key) + "_huge_page_bytes";
    if (!mem.contains(resident) || !mem.contains(huge)) continue;
    pages += (pages.empty() ? "" : ", ") + (what + bytes_text(mem[huge].get<double>())) + " of " +
             bytes_text(mem[resident].get<double>()) + " resident";
  }
  if (!pages.empty()) out << "pages    on 2 MiB pages: " << pages << "\n";
  out << "kernels  " << fmt("%.4g", kt["sum_ms_p50"].get<double>()) << " ms of " << fmt("%.4g", kt["wall_ms_p50"].get<double>())
      << " ms per run; executor overhead " << fmt("%.3g", kt["overhead_ms_p50"].get<double>()) << " ms ("
      << fmt("%.1f", 100 * kt["overhead_share"].get<double>()) << "%)\n\n";

  std::vector<const json*> nodes;
  for (const auto& n : doc["nodes"]) nodes.push_back(&n);
  std::stable_sort(nodes.begin(), nodes.end(), [](const json* a, const json* b) {
    return (*a)["total_ms"].get<double>() > (*b)["total_ms"].get<double>();
  });
  Table t;
  t.header = {"%run", "p50 us", "p90 us", "GFLOP/s", "GB/s", "bound", "%peak", "op", "kernel", "node [output]"};
  t.right = {true, true, true, true, true, false, true, false, false, false};
  for (size_t i = 0; i < nodes.size() && static_cast<int>(i) < top; ++i) {
    const json& n = *nodes[i];
    std::string kernel = n["kernel"].get<std::string>();  // as `kiln run -v` names it
    if (!n["kernel_params"].get<std::string>().empty()) kernel.append(" (").append(n["kernel_params"].get<std::string>()).append(")");
    std::string where = n["name"].get<std::string>();
    if (!n["outputs"].empty()) where.append(" ").append(shape_text(n["outputs"][0]));
    t.rows.push_back({fmt("%.1f", 100 * n["share"].get<double>()), fmt("%.1f", n["median_us"].get<double>()),
                      fmt("%.1f", n["p90_us"].get<double>()), fmt("%.1f", n["gflops"].get<double>()),
                      fmt("%.1f", n["gbps"].get<double>()),
                      n["bound"] == "compute" ? std::string("compute") : n["memory_level"].get<std::string>(),
                      fmt("%.0f", 100 * n["peak_share"].get<double>()), n["op"].get<std::string>(), kernel, where});
  }
  out << "top " << t.rows.size() << " of " << nodes.size() << " nodes by time\n" << t.render(width) << "\n";

  Table ops;
  ops.header = {"%run", "us/run", "nodes", "GFLOP/s", "GB/s", "op"};
  ops.right = {true, true, true, true, true, false};
  const double iters = std::max<double>(1, doc["run"]["iterations"].get<double>());
  for (const auto& g : doc["by_op"])
    ops.rows.push_back({fmt("%.1f", 100 * g["share"].get<double>()), fmt("%.1f", 1e3 * g["total_ms"].get<double>() / iters),
                        std::to_string(g["nodes"].get<int64_t>()), fmt("%.1f", g["gflops"].get<double>()),
                        fmt("%.1f", g["gbps"].get<double>()), g["key"].get<std::string>()});
  out << "by op type\n" << ops.render(width);
  if (doc.contains("notes"))
    for (const auto& note : doc["notes"]) out << "\nnote: " << escape_controls(note.get<std::string>()) << "\n";
  return out.str();
}

std::string render_csv(const json& doc) {
  std::ostringstream out;
  out << "index,name,op,kernel,kernel_params,sources,inputs,outputs,calls,total_ms,median_us,p90_us,share,flops,"
         "bytes_read,bytes_written,gflops,gbps,intensity,bound,memory_level,precision,peak_share\n";
  for (const auto& n : doc["nodes"]) {
    out << n["index"].get<int64_t>() << "," << csv_field(n["name"].get<std::string>()) << ","
        << csv_field(n["op"].get<std::string>()) << "," << csv_field(n["kernel"].get<std::string>()) << ","
        << csv_field(n["kernel_params"].get<std::string>()) << "," << csv_field(joined(n["sources"], ";", false)) << ","
        << csv_field(joined(n["inputs"], ";", true)) << "," << csv_field(joined(n["outputs"], ";", true)) << ",";
    for (const char* k : {"calls", "total_ms", "median_us", "p90_us", "share", "flops", "bytes_read", "bytes_written",
                          "gflops", "gbps", "intensity"})
      out << number(n[k]) << ",";
    out << n["bound"].get<std::string>() << "," << n["memory_level"].get<std::string>() << "," << n["precision"].get<std::string>() << "," << number(n["peak_share"]) << "\n";
  }
  return out.str();
}

json render_trace(const json& doc, const Measurements& m) {
  const int64_t pid = static_cast<int64_t>(getpid());
  const int64_t tid = m.thread_id;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", tid},
                    {"args", {{"name", "kiln profile " + doc["model"]["file"].get<std::string>()}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid},
                    {"args", {{"name", "kiln executor (kernels use " + std::to_string(m.run_threads) + " threads)"}}}});
  // The pool's other threads, each named once.
  std::map<int64_t, int> workers;
  for (const auto& run : m.worker_events)
    for (const WorkerEvent& w : run)
      if (w.os_tid != tid) workers.emplace(w.os_tid, w.thread);
  for (const auto& [os_tid, index] : workers)
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", os_tid},
                      {"args", {{"name", "kiln pool thread " + std::to_string(index)}}}});
  const json& nodes = doc["nodes"];
  for (size_t it = 0; it < m.start_us.size(); ++it) {
    const double base = m.iteration_start_us[it];
    events.push_back({{"ph", "X"}, {"cat", "run"}, {"name", "run " + std::to_string(it)}, {"pid", pid}, {"tid", tid},
                      {"ts", base}, {"dur", m.iteration_ms[it] * 1e3}});
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (m.start_us[it][n] < 0 || it >= m.node_us[n].size()) continue;
      const json& node = nodes[n];
      json args = {{"op", node["op"]}, {"kernel", node["kernel"]}, {"sources", node["sources"]},
                   {"inputs", node["inputs"]}, {"outputs", node["outputs"]}, {"flops", node["flops"]},
                   {"bytes", node["bytes_read"].get<int64_t>() + node["bytes_written"].get<int64_t>()}};
      if (!node["kernel_params"].get<std::string>().empty()) args["kernel_params"] = node["kernel_params"];
      events.push_back({{"ph", "X"}, {"cat", "kernel"}, {"name", node["name"]}, {"pid", pid}, {"tid", tid},
                        {"ts", base + m.start_us[it][n]}, {"dur", m.node_us[n][it]}, {"args", args}});
    }
    if (it < m.worker_events.size())
      for (const WorkerEvent& w : m.worker_events[it])
        events.push_back({{"ph", "X"}, {"cat", "worker"}, {"name", nodes[w.node]["name"]}, {"pid", pid}, {"tid", w.os_tid},
                          {"ts", base + w.start_us}, {"dur", w.dur_us},
                          {"args", {{"node", nodes[w.node]["name"]}, {"kernel", nodes[w.node]["kernel"]}, {"thread", w.thread}}}});
  }
  json trace;
  trace["traceEvents"] = events;
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"schema", "kiln.profile.trace"}, {"kiln_version", doc["kiln_version"]},
                        {"model", doc["model"]["file"]}, {"cpu", doc["machine"]["cpu"]}, {"threads", doc["run"]["threads"]}};
  return trace;
}

}  // namespace kiln::profile
