// kiln profile --html's page (profile/html.cc): the embedded document survives the trip into a
// <script> element byte for byte, and no name in it can end that element or open a comment. The
// page drawing itself in a browser is tests/cli/run_html_test.py's.
#include <gtest/gtest.h>

#include <string>

#include "profile/profiler.h"

namespace kiln::profile {
namespace {

using json = nlohmann::ordered_json;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A kiln.profile document with the schema's required fields and one node of the given name.
json tiny_doc(const std::string& node_name, const std::string& file) {
  json tensor = {{"name", "x"}, {"dtype", "f32"}, {"shape", {1, 4}}};
  json node = {{"index", 0}, {"name", node_name}, {"op", "Relu"}, {"kernel", "ref"}, {"kernel_params", ""},
               {"sources", {node_name}}, {"inputs", {tensor}}, {"outputs", {tensor}}, {"calls", 1},
               {"total_ms", 0.001}, {"median_us", 1.0}, {"p90_us", 1.0}, {"share", 0.5}, {"flops", 4},
               {"bytes_read", 16}, {"bytes_written", 16}, {"gflops", 0.004}, {"gbps", 0.032}, {"intensity", 0.125},
               {"bound", "memory"}, {"memory_level", "L1"}, {"precision", "f32"}, {"peak_share", 0.001},
               {"times_us", {1.0}}};
  json group = {{"key", "Relu"}, {"nodes", 1}, {"total_ms", 0.001}, {"share", 0.5}, {"flops", 4}, {"bytes", 32},
                {"gflops", 0.004}, {"gbps", 0.032}};
  json d;
  d["schema"] = "kiln.profile";
  d["schema_version"] = 1;
  d["kiln_version"] = "0";
  d["command_line"] = "kiln profile " + file + " --html r.html";
  d["created"] = "2026-01-01T00:00:00Z";
  d["model"] = {{"file", file}, {"stage", "compiled"}, {"compiled_in_memory", false}, {"nodes", 1}};
  d["machine"] = {{"cpu", "cpu"}, {"features", json::array()}, {"threads", 1},
                  {"ceilings", {{"compute_gflops", {{"f32", 100.0}}}, {"f32_isa", "avx2"},
                                {"memory", {{{"level", "L1"}, {"capacity_bytes", 32768}, {"gbps", 200.0}},
                                            {{"level", "DRAM"}, {"capacity_bytes", 0}, {"gbps", 20.0}}}},
                                {"memory_gbps", 20.0}, {"threads", 1}, {"source", "probed"}}}};
  d["run"] = {{"warmup", 0}, {"iterations", 1}, {"threads", 1}, {"threads_requested", 1}, {"seed", 0}, {"inputs", {tensor}}};
  d["latency_ms"] = {{"min", 0.002}, {"p50", 0.002}, {"p90", 0.002}, {"p99", 0.002}, {"max", 0.002}, {"mean", 0.002}, {"stdev", 0.0}};
  d["iteration_ms"] = {0.002};
  d["throughput_per_s"] = 500000.0;
  d["memory"] = {{"peak_rss_bytes", 1 << 20}, {"arena_bytes", 0}, {"workspace_bytes", 0}};
  d["kernel_time"] = {{"sum_ms_p50", 0.001}, {"wall_ms_p50", 0.002}, {"overhead_ms_p50", 0.001}, {"overhead_share", 0.5}};
  d["nodes"] = json::array({node});
  d["by_op"] = json::array({group});
  d["by_kernel"] = json::array({group});
  d["timeline"] = {{"iteration", 0}, {"wall_us", 2.0}, {"events", {{{"node", 0}, {"start_us", 0.5}, {"dur_us", 1.0}}}}};
  return d;
}

// The text of the <script type="application/json"> element.
std::string embedded(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"profile-data\">";
  const size_t begin = page.find(open);
  if (begin == std::string::npos) return "";
  const size_t start = begin + open.size();
  return page.substr(start, page.find("</script>", start) - start);
}

TEST(ProfileHtml, ANodeNamedLikeMarkupCannotLeaveTheDataBlock) {
  const std::string hostile = "</script><script>alert(1)</script><!-- </SCRIPT> & <style>";
  const json doc = tiny_doc(hostile, "<b>m</b>.kiln");
  const std::string page = render_html(doc);

  // The page's own three scripts (the error hook, the data, the drawing) and no others.
  EXPECT_EQ(count(page, "<script"), 3u);
  EXPECT_EQ(count(page, "</script>"), 3u);
  EXPECT_EQ(page.find("</script><script>alert"), std::string::npos);
  EXPECT_EQ(page.find("alert(1)</script>"), std::string::npos);
  EXPECT_EQ(page.find("<!--"), std::string::npos);
  EXPECT_EQ(page.find("</SCRIPT>"), std::string::npos);

  // What the browser hands JSON.parse is the document, exactly.
  const std::string data = embedded(page);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.find('<'), std::string::npos);
  EXPECT_EQ(data.find('>'), std::string::npos);
  EXPECT_EQ(json::parse(data), doc);

  // The one string C++ itself puts on the page, HTML-escaped.
  EXPECT_NE(page.find("<title>kiln profile: &lt;b&gt;m&lt;/b&gt;.kiln</title>"), std::string::npos);
}

TEST(ProfileHtml, SelfContainedAndTolerantOfBadUtf8) {
  const std::string page = render_html(tiny_doc(std::string("bad \xff\xfe utf-8"), "m.kiln"));
  // Nothing fetched: no URLs, no external scripts or styles.
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("src="), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_EQ(page.find("@import"), std::string::npos);
  // The hooks the browser test reads.
  EXPECT_NE(page.find("id=\"errors\""), std::string::npos);
  EXPECT_NE(page.find("document.body.dataset.rendered = \"ok\""), std::string::npos);
  // Invalid UTF-8 in a name becomes U+FFFD rather than failing the report.
  const json back = json::parse(embedded(page));
  EXPECT_EQ(back["nodes"][0]["name"], "bad \xef\xbf\xbd\xef\xbf\xbd utf-8");
}

}  // namespace
}  // namespace kiln::profile
