// The profile's HTML view: one self-contained page (inline CSS and JavaScript, nothing fetched)
// that embeds the "kiln.profile" document and draws it in the browser: the summary, a roofline
// of the nodes under the machine's measured roofs, one run's timeline and the node, op-type and
// kernel tables.
//
// The C++ side only assembles the page: every number and name is put on the page by the script,
// from the embedded document, as text nodes (textContent), never as markup. The document sits in
// a <script type="application/json"> element with '<', '>' and '&' written as \u escapes, so no
// name in it ("</script>", "<!--") can end that element early.
#include <string>

#include "profile/profiler.h"

namespace kiln::profile {

namespace {

using json = nlohmann::ordered_json;

// `s` as HTML text (element content or a quoted attribute value).
std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// The document as JSON that is safe inside a <script> element. In JSON, '<', '>' and '&' can only
// occur inside strings, where \u003c, \u003e and \u0026 mean the same characters; a name that is
// not valid UTF-8 gets U+FFFD instead of failing the report.
std::string script_json(const json& doc) {
  const std::string text = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size() + text.size() / 16);
  for (char c : text) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out += c;
    }
  }
  return out;
}

// The colours the roofline draws with are distinctive on purpose: tests/cli/run_html_test.py
// finds them in a screenshot (compute roof #d6006e, bandwidth roof #008c46, compute-bound nodes
// #ff7800, memory-bound nodes #1e5adc). The op-type palette avoids them.
constexpr const char* kStyle = R"css(
:root { --ink: #1d2330; --muted: #5b6475; --rule: #d9dde5; --band: #f4f6f9; }
* { box-sizing: border-box; }
body { margin: 0 auto; padding: 16px 24px 40px; max-width: 1400px; color: var(--ink);
       font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 20px; margin: 0 0 8px; }
h1 .model { font-family: ui-monospace, Menlo, Consolas, monospace; font-weight: 600; }
h2 { font-size: 16px; margin: 22px 0 6px; border-bottom: 1px solid var(--rule); padding-bottom: 3px; }
.note { color: var(--muted); margin: 4px 0; }
.errors { background: #fde8e8; color: #8a1111; border: 1px solid #e7a1a1; padding: 6px 10px; margin: 8px 0;
          white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; }
.errors:empty { display: none; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0; }
dl.summary dt { color: var(--muted); }
dl.summary dd { margin: 0; }
.split { display: flex; height: 10px; width: 420px; margin-top: 3px; border: 1px solid var(--rule); }
.split .kernels { background: #4e79a7; }
.split .overhead { background: #bab0ac; }
.row { display: flex; gap: 20px; align-items: flex-start; flex-wrap: wrap; }
.side { flex: 1; min-width: 260px; font-size: 13px; }
.side ul { margin: 4px 0; padding-left: 18px; }
.side ul.legend { list-style: none; padding: 0; }
.side ul.legend svg { vertical-align: -1px; margin-right: 6px; }
svg text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; fill: var(--ink); }
svg .axis-label { font-size: 12px; fill: var(--muted); }
svg .grid { stroke: #e6e9ef; stroke-width: 1; }
svg .frame { fill: none; stroke: #9aa3b2; stroke-width: 1; }
.rl-roof-compute, .rl-swatch-compute { stroke: #d6006e; stroke-width: 2; fill: none; }
.rl-roof-memory, .rl-swatch-memory { stroke: #008c46; stroke-width: 2.5; fill: none; }
.rl-roof-compute.other { stroke-dasharray: 6 4; }
.rl-label-compute { fill: #d6006e; }
.rl-label-memory { fill: #008c46; }
.rl-compute { fill: #ff7800; }
.rl-memory { fill: #1e5adc; }
.rl-point { stroke: #ffffff; stroke-width: 1; }
.rl-point:hover, .tl-bar:hover { stroke: var(--ink); stroke-width: 2; }
.tl-run { fill: none; stroke: #9aa3b2; }
.tl-gap { fill: #6b7280; }
.tl-gap-band { fill: #9ca3af; fill-opacity: 0.18; }
.ops { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 4px 0 6px; font-size: 13px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; vertical-align: -1px; border-radius: 2px; }
table { border-collapse: collapse; font-size: 12.5px; margin-top: 4px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eceef2; text-align: left; vertical-align: top; }
th { position: sticky; top: 0; background: #fff; border-bottom: 2px solid var(--rule); cursor: pointer;
     user-select: none; white-space: nowrap; }
th[data-sort="desc"]::after { content: " \25BE"; }
th[data-sort="asc"]::after { content: " \25B4"; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; overflow-wrap: anywhere; }
td.wide { min-width: 26ch; }
td.share { min-width: 64px; }
td.nowrap { white-space: nowrap; }
td .params { display: block; color: var(--muted); font-size: 11.5px; overflow-wrap: anywhere; }
tbody tr:hover { background: var(--band); }
footer { margin-top: 28px; color: var(--muted); font-size: 12px; }
footer code { word-break: break-all; }
)css";

// Runs first, so that any error of the main script (a document it cannot read) is on the page.
constexpr const char* kErrorHook = R"js(
window.onerror = function (message, source, line, column, error) {
  var box = document.getElementById("errors");
  var item = document.createElement("div");
  item.textContent = "error: " + String(message) + (line ? " (script line " + line + ")" : "");
  box.appendChild(item);
  return false;
};
)js";

constexpr const char* kScript = R"js(
(function () {
  "use strict";
  const doc = JSON.parse(document.getElementById("profile-data").textContent);
  const SVG_NS = document.getElementById("roofline-svg").namespaceURI;

  // The document is read strictly: a field of the wrong type is an error on the page, not a
  // wrong picture.
  function num(x, what) {
    if (typeof x !== "number" || !Number.isFinite(x)) throw new TypeError(what + " is not a number: " + JSON.stringify(x));
    return x;
  }
  function str(x, what) {
    if (typeof x !== "string") throw new TypeError(what + " is not a string: " + JSON.stringify(x));
    return x;
  }
  function list(x, what) {
    if (!Array.isArray(x)) throw new TypeError(what + " is not a list");
    return x;
  }
  function obj(x, what) {
    if (x === null || typeof x !== "object" || Array.isArray(x)) throw new TypeError(what + " is not an object");
    return x;
  }

  // Like printf's %.<digits>g.
  function g(x, digits) {
    if (x === 0) return "0";
    const a = Math.abs(x);
    if (a >= 1e-4 && a < 1e9) return String(Number(x.toPrecision(digits)));
    return x.toExponential(digits - 1);
  }
  function fixed(x, digits) { return x.toFixed(digits); }
  function pct(x, digits) { return (100 * x).toFixed(digits); }
  function bytes(b) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0;
    while (b >= 1024 && u < 4) { b /= 1024; ++u; }
    return (u === 0 ? b.toFixed(0) : b.toFixed(1)) + " " + units[u];
  }
  function shape(t, what) {
    if (t === null) return "-";
    obj(t, what);
    return str(t.dtype, what + ".dtype") + "[" + list(t.shape, what + ".shape").map(function (d) { return num(d, what + ".shape"); }).join("x") + "]";
  }
  function cut(s, n) { return s.length <= n ? s : s.slice(0, n - 1) + "\u2026"; }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function svg(parent, tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function tip(e, text) { svg(e, "title", {}, text); }

  // ---- the document, checked ----
  const model = obj(doc.model, "model");
  const machine = obj(doc.machine, "machine");
  const ceilings = obj(machine.ceilings, "machine.ceilings");
  const run = obj(doc.run, "run");
  const iterations = num(run.iterations, "run.iterations");
  const nodes = list(doc.nodes, "nodes").map(function (n, i) {
    const w = "nodes[" + i + "]";
    obj(n, w);
    return {
      name: str(n.name, w + ".name"), op: str(n.op, w + ".op"), kernel: str(n.kernel, w + ".kernel"),
      params: str(n.kernel_params, w + ".kernel_params"),
      sources: list(n.sources, w + ".sources").map(function (s) { return str(s, w + ".sources"); }),
      outputs: list(n.outputs, w + ".outputs").map(function (t, j) { return shape(t, w + ".outputs[" + j + "]"); }).join(", "),
      share: num(n.share, w + ".share"), total_ms: num(n.total_ms, w + ".total_ms"),
      median_us: num(n.median_us, w + ".median_us"), p90_us: num(n.p90_us, w + ".p90_us"),
      flops: num(n.flops, w + ".flops"), bytes: num(n.bytes_read, w + ".bytes_read") + num(n.bytes_written, w + ".bytes_written"),
      gflops: num(n.gflops, w + ".gflops"), gbps: num(n.gbps, w + ".gbps"), intensity: num(n.intensity, w + ".intensity"),
      bound: str(n.bound, w + ".bound"), level: str(n.memory_level, w + ".memory_level"),
      precision: str(n.precision, w + ".precision"), peak_share: num(n.peak_share, w + ".peak_share"),
    };
  });
  function group(g, i, what) {
    const w = what + "[" + i + "]";
    obj(g, w);
    return { key: str(g.key, w + ".key"), nodes: num(g.nodes, w + ".nodes"), total_ms: num(g.total_ms, w + ".total_ms"),
             share: num(g.share, w + ".share"), gflops: num(g.gflops, w + ".gflops"), gbps: num(g.gbps, w + ".gbps") };
  }
  const byOp = list(doc.by_op, "by_op").map(function (g, i) { return group(g, i, "by_op"); });
  const byKernel = list(doc.by_kernel, "by_kernel").map(function (g, i) { return group(g, i, "by_kernel"); });
  const compute = Object.keys(obj(ceilings.compute_gflops, "machine.ceilings.compute_gflops")).map(function (p) {
    return { name: p, gflops: num(ceilings.compute_gflops[p], "machine.ceilings.compute_gflops." + p) };
  });
  const memory = list(ceilings.memory, "machine.ceilings.memory").map(function (m, i) {
    const w = "machine.ceilings.memory[" + i + "]";
    obj(m, w);
    return { name: str(m.level, w + ".level"), gbps: num(m.gbps, w + ".gbps"), capacity: num(m.capacity_bytes, w + ".capacity_bytes") };
  });
  if (compute.length === 0 || memory.length === 0) throw new Error("the document has no compute or memory ceilings");

  // Op types keep one colour everywhere (timeline, tables), in by_op order (most time first).
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                   "#9c755f", "#bab0ac", "#86bcb6", "#d37295", "#a0cbe8", "#8cd17d", "#b6992d", "#499894"];
  const opColours = new Map();
  byOp.forEach(function (g, i) { opColours.set(g.key, PALETTE[i % PALETTE.length]); });
  nodes.forEach(function (n) { if (!opColours.has(n.op)) opColours.set(n.op, PALETTE[opColours.size % PALETTE.length]); });
  function swatch(colour) {
    const s = el("span", null, "swatch");
    s.style.background = colour;
    return s;
  }

  // ---- summary ----
  function renderSummary() {
    document.getElementById("title-model").textContent = str(model.file, "model.file");
    const dl = document.getElementById("summary-list");
    function row(label, value) {
      dl.appendChild(el("dt", label));
      const dd = el("dd", value);
      dl.appendChild(dd);
      return dd;
    }
    const stage = str(model.stage, "model.stage");
    row("model", str(model.file, "model.file") + " (" + stage +
        (model.compiled_in_memory === true ? "; compiled in memory with the default passes, as kiln compile would" : "") +
        "), " + num(model.nodes, "model.nodes") + " nodes");
    const threads = num(run.threads, "run.threads"), asked = num(run.threads_requested, "run.threads_requested");
    row("machine", str(machine.cpu, "machine.cpu") + ", " + threads + (threads === 1 ? " thread" : " threads") +
        (asked !== threads ? " (of " + asked + " asked: the graph is too little work to share)" : "") +
        "; " + list(machine.features, "machine.features").join(" "));
    row("compute ceilings", compute.map(function (c) {
      return c.name + " " + g(c.gflops, 3) + (c.name === "int8" ? " GOP/s" : " GFLOP/s") +
             (c.name === "f32" ? " (" + str(ceilings.f32_isa, "machine.ceilings.f32_isa") + ")" : "");
    }).join(", "));
    row("memory ceilings", "read " + memory.map(function (m) {
      return m.name + " " + g(m.gbps, 3) + " GB/s" + (m.capacity > 0 ? " (" + bytes(m.capacity) + ")" : "");
    }).join(", ") + (ceilings.source === "cache" ? "; cached" : "; probed now"));
    const lat = obj(doc.latency_ms, "latency_ms");
    row("latency", "min " + g(num(lat.min, "latency_ms.min"), 4) + " ms, p50 " + g(num(lat.p50, "latency_ms.p50"), 4) +
        " ms, p90 " + g(num(lat.p90, "latency_ms.p90"), 4) + " ms, p99 " + g(num(lat.p99, "latency_ms.p99"), 4) + " ms over " +
        iterations + " runs (" + num(run.warmup, "run.warmup") + " warm-up)");
    row("throughput", g(num(doc.throughput_per_s, "throughput_per_s"), 4) + " runs/s");
    const mem = obj(doc.memory, "memory");
    row("memory", "peak RSS " + bytes(num(mem.peak_rss_bytes, "memory.peak_rss_bytes")) + ", arena " +
        bytes(num(mem.arena_bytes, "memory.arena_bytes")) + ", workspace " + bytes(num(mem.workspace_bytes, "memory.workspace_bytes")));
    const pages = [["model file ", "model_file"], ["buffers that asked for them ", "huge_page_buffers"]]
      .filter(function (p) { return mem[p[1] + "_resident_bytes"] !== undefined; })
      .map(function (p) {
        return p[0] + bytes(num(mem[p[1] + "_huge_page_bytes"], "memory." + p[1] + "_huge_page_bytes")) + " of " +
               bytes(num(mem[p[1] + "_resident_bytes"], "memory." + p[1] + "_resident_bytes")) + " resident";
      });
    if (pages.length > 0) row("2 MiB pages", pages.join(", "));
    const kt = obj(doc.kernel_time, "kernel_time");
    const sum = num(kt.sum_ms_p50, "kernel_time.sum_ms_p50"), wall = num(kt.wall_ms_p50, "kernel_time.wall_ms_p50");
    const share = num(kt.overhead_share, "kernel_time.overhead_share");
    const dd = row("kernel time", g(sum, 4) + " ms of " + g(wall, 4) + " ms wall-clock per run (p50); executor overhead " +
                   g(num(kt.overhead_ms_p50, "kernel_time.overhead_ms_p50"), 3) + " ms (" + pct(share, 1) + "%)");
    const split = el("div", null, "split");
    const k = el("span", null, "kernels"), o = el("span", null, "overhead");
    const kernelShare = Math.min(1, Math.max(0, 1 - share));
    k.style.width = pct(kernelShare, 2) + "%";
    o.style.width = pct(1 - kernelShare, 2) + "%";
    k.title = "kernels " + pct(kernelShare, 1) + "%";
    o.title = "executor overhead " + pct(1 - kernelShare, 1) + "%";
    split.appendChild(k);
    split.appendChild(o);
    dd.appendChild(split);
  }

  // ---- roofline ----
  function renderRoofline() {
    const plot = document.getElementById("roofline-svg");
    const W = 860, H = 520, M = { l: 66, r: 18, t: 14, b: 50 };
    plot.setAttribute("width", W);
    plot.setAttribute("height", H);
    plot.setAttribute("viewBox", "0 0 " + W + " " + H);

    // Nodes that do arithmetic are points at (intensity, GFLOP/s), from their exact FLOPs, bytes
    // and median time; the others cannot sit on a log scale.
    const points = [], idle = [];
    nodes.forEach(function (n) {
      if (!(n.flops > 0)) { idle.push(n); return; }
      const x = n.bytes > 0 ? n.flops / n.bytes : n.intensity;
      const y = n.median_us > 0 ? n.flops / (n.median_us * 1e3) : n.gflops;
      points.push({ n: n, x: x, y: y });
    });
    const peakMax = Math.max.apply(null, compute.map(function (c) { return c.gflops; }));
    const bwMax = Math.max.apply(null, memory.map(function (m) { return m.gbps; }));
    const bwMin = Math.min.apply(null, memory.map(function (m) { return m.gbps; }));
    const ridges = [];
    compute.forEach(function (c) { memory.forEach(function (m) { ridges.push(c.gflops / m.gbps); }); });
    const xs = ridges.concat(points.map(function (p) { return p.x; }).filter(function (x) { return x > 0; }));
    let lx1 = Math.ceil(Math.log10(Math.max.apply(null, xs) * 2));
    let lx0 = Math.max(Math.floor(Math.log10(Math.min.apply(null, xs) / 2)), lx1 - 8);
    const ly1 = Math.ceil(Math.log10(peakMax * 2));
    const ys = [bwMin * Math.pow(10, lx0)].concat(points.map(function (p) { return p.y; }).filter(function (y) { return y > 0; }));
    const ly0 = Math.max(Math.floor(Math.log10(Math.min.apply(null, ys) / 2)), ly1 - 7);
    if (lx1 <= lx0) lx1 = lx0 + 1;
    const xlo = Math.pow(10, lx0), xhi = Math.pow(10, lx1), ylo = Math.pow(10, ly0), yhi = Math.pow(10, ly1);
    const X = function (x) { return M.l + (Math.log10(x) - lx0) / (lx1 - lx0) * (W - M.l - M.r); };
    const Y = function (y) { return H - M.b - (Math.log10(y) - ly0) / (ly1 - ly0) * (H - M.t - M.b); };
    const clampX = function (x) { return Math.min(xhi, Math.max(xlo, x)); };
    const clampY = function (y) { return Math.min(yhi, Math.max(ylo, y)); };

    // Grid and axes: a line per decade, short ticks for 2..9.
    const decade = function (e) { return e >= 0 && e <= 4 ? String(Math.pow(10, e)) : e < 0 && e >= -3 ? Math.pow(10, e).toFixed(-e) : "1e" + e; };
    for (let e = lx0; e <= lx1; ++e) {
      const x = Math.round(X(Math.pow(10, e))) + 0.5;
      svg(plot, "line", { class: "grid", x1: x, x2: x, y1: M.t, y2: H - M.b });
      svg(plot, "text", { x: x, y: H - M.b + 16, "text-anchor": "middle" }, decade(e));
      for (let k = 2; k < 10 && e < lx1; ++k) {
        const xm = Math.round(X(k * Math.pow(10, e))) + 0.5;
        svg(plot, "line", { class: "frame", x1: xm, x2: xm, y1: H - M.b, y2: H - M.b + 4 });
      }
    }
    for (let e = ly0; e <= ly1; ++e) {
      const y = Math.round(Y(Math.pow(10, e))) + 0.5;
      svg(plot, "line", { class: "grid", x1: M.l, x2: W - M.r, y1: y, y2: y });
      svg(plot, "text", { x: M.l - 6, y: y + 4, "text-anchor": "end" }, decade(e));
      for (let k = 2; k < 10 && e < ly1; ++k) {
        const ym = Math.round(Y(k * Math.pow(10, e))) + 0.5;
        svg(plot, "line", { class: "frame", x1: M.l - 4, x2: M.l, y1: ym, y2: ym });
      }
    }
    svg(plot, "rect", { class: "frame", x: M.l + 0.5, y: M.t + 0.5, width: W - M.l - M.r, height: H - M.t - M.b });
    svg(plot, "text", { class: "axis-label", x: (M.l + W - M.r) / 2, y: H - 12, "text-anchor": "middle" },
        "arithmetic intensity (FLOP/byte)");
    svg(plot, "text", { class: "axis-label", x: 16, y: (M.t + H - M.b) / 2, "text-anchor": "middle",
                        transform: "rotate(-90 16 " + (M.t + H - M.b) / 2 + ")" }, "GFLOP/s (int8: GOP/s)");

    // The roofs: a sloped bandwidth roof per memory level up to the highest compute roof, and a
    // compute roof per precision from where the fastest memory roof meets it. Precisions no node
    // uses are dashed.
    const used = new Set(nodes.map(function (n) { return n.precision; }));
    memory.forEach(function (m) {
      const x0 = Math.max(xlo, ylo / m.gbps), x1 = Math.min(xhi, peakMax / m.gbps);
      if (!(x1 > x0)) return;
      const line = svg(plot, "line", { class: "rl-roof-memory", x1: X(x0), y1: Y(m.gbps * x0), x2: X(x1), y2: Y(m.gbps * x1) });
      tip(line, m.name + " bandwidth " + g(m.gbps, 4) + " GB/s");
      const angle = Math.atan2(Y(m.gbps * x1) - Y(m.gbps * x0), X(x1) - X(x0)) * 180 / Math.PI;
      const lx = X(x0) + 14 * Math.cos(angle * Math.PI / 180), ly = Y(m.gbps * x0) + 14 * Math.sin(angle * Math.PI / 180) - 5;
      svg(plot, "text", { class: "rl-label-memory", x: lx, y: ly, transform: "rotate(" + angle + " " + lx + " " + ly + ")" },
          m.name + " " + g(m.gbps, 3) + " GB/s");
    });
    compute.forEach(function (c) {
      const x0 = clampX(c.gflops / bwMax), y = Math.round(Y(c.gflops));
      const line = svg(plot, "line", { class: "rl-roof-compute" + (used.has(c.name) ? "" : " other"), x1: X(x0), y1: y, x2: W - M.r, y2: y });
      tip(line, c.name + " peak " + g(c.gflops, 4) + (c.name === "int8" ? " GOP/s" : " GFLOP/s"));
      svg(plot, "text", { class: "rl-label-compute", x: W - M.r - 4, y: y - 5, "text-anchor": "end" },
          c.name + " " + g(c.gflops, 3) + (c.name === "int8" ? " GOP/s" : " GFLOP/s"));
    });

    // The nodes, largest first so that small ones stay visible; area by share of the run.
    let clamped = 0;
    points.map(function (p) { p.r = 4 + 16 * Math.sqrt(Math.min(1, Math.max(0, p.n.share))); return p; })
      .sort(function (a, b) { return b.r - a.r; })
      .forEach(function (p) {
        const x = clampX(p.x > 0 ? p.x : xlo), y = clampY(p.y > 0 ? p.y : ylo);
        if (x !== p.x || y !== p.y) ++clamped;
        const n = p.n;
        const c = svg(plot, "circle", { class: "rl-point " + (n.bound === "compute" ? "rl-compute" : "rl-memory"),
                                        cx: X(x), cy: Y(y), r: p.r });
        tip(c, n.name + "\n" + n.op + " on " + n.kernel + (n.params ? " (" + n.params + ")" : "") + "\n" +
               g(n.gflops, 4) + " GFLOP/s, " + g(n.gbps, 4) + " GB/s at " + g(p.x, 3) + " FLOP/byte\n" +
               pct(n.peak_share, 0) + "% of the " + (n.bound === "compute" ? n.precision + " compute" : n.level + " bandwidth") +
               " roof; " + pct(n.share, 1) + "% of the run, p50 " + g(n.median_us, 4) + " \u00b5s");
      });

    // The legend and what is not on the plot, beside it.
    const side = document.getElementById("roofline-side");
    const legend = el("ul", null, "legend");
    [["line", "rl-swatch-compute", "compute roof, one per precision (dashed: no node uses it)"],
     ["line", "rl-swatch-memory", "bandwidth roof, one per memory level"],
     ["circle", "rl-compute", "compute-bound node"],
     ["circle", "rl-memory", "memory-bound node"]].forEach(function (it) {
      const li = el("li");
      const icon = document.createElementNS(SVG_NS, "svg");
      icon.setAttribute("width", 26);
      icon.setAttribute("height", 12);
      if (it[0] === "line") svg(icon, "line", { class: it[1], x1: 1, x2: 25, y1: 6, y2: 6 });
      else svg(icon, "circle", { class: it[1], cx: 13, cy: 6, r: 5 });
      li.appendChild(icon);
      li.appendChild(document.createTextNode(it[2]));
      legend.appendChild(li);
    });
    side.appendChild(legend);
    // What is not on the plot, and why.
    side.appendChild(el("p", points.length + " of " + nodes.length + " nodes are points: x = FLOPs per byte read and written, " +
                                   "y = FLOPs over the median time; a point's area is its share of the run. Hover a point for its node."));
    if (clamped) side.appendChild(el("p", clamped + (clamped === 1 ? " point lies" : " points lie") + " outside the axes and sit" +
                                          (clamped === 1 ? "s" : "") + " on their edge."));
    const out = el("p", idle.length === 0 ? "Every node does arithmetic." :
                        idle.length + (idle.length === 1 ? " node does" : " nodes do") +
                        " no arithmetic (0 FLOPs: data movement) and cannot sit on a log scale; left out:");
    out.id = "roofline-left-out";
    side.appendChild(out);
    if (idle.length) {
      const ul = el("ul");
      idle.slice().sort(function (a, b) { return b.total_ms - a.total_ms; }).forEach(function (n) {
        const li = el("li");
        li.appendChild(swatch(opColours.get(n.op)));
        li.appendChild(document.createTextNode(n.name + " (" + n.op + ", " + pct(n.share, 1) + "% of the run, " +
                                               g(n.gbps, 3) + " GB/s)"));
        ul.appendChild(li);
      });
      side.appendChild(ul);
    }
  }

  // ---- timeline ----
  function niceStep(span) {
    const raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function renderTimeline() {
    const plot = document.getElementById("timeline-svg");
    const note = document.getElementById("timeline-note");
    const tl = obj(doc.timeline, "timeline");
    if (tl.events === undefined) {
      note.textContent = "No run kept its timeline.";
      plot.setAttribute("height", 0);
      return;
    }
    const wall = num(tl.wall_us, "timeline.wall_us");
    const events = list(tl.events, "timeline.events").map(function (e, i) {
      const w = "timeline.events[" + i + "]";
      obj(e, w);
      const k = num(e.node, w + ".node");
      if (!(k >= 0 && k < nodes.length)) throw new RangeError(w + ".node " + k + " is not a node of the document");
      return { n: nodes[k], start: num(e.start_us, w + ".start_us"), dur: num(e.dur_us, w + ".dur_us") };
    }).sort(function (a, b) { return a.start - b.start; });
    const end = Math.max(wall, Math.max.apply(null, [0].concat(events.map(function (e) { return e.start + e.dur; }))));
    // The executor's time: what no node covers between the run's start and its end.
    const gaps = [];
    let cursor = 0;
    events.forEach(function (e) {
      if (e.start > cursor + 1e-9) gaps.push([cursor, e.start]);
      cursor = Math.max(cursor, e.start + e.dur);
    });
    if (end > cursor + 1e-9) gaps.push([cursor, end]);
    const gapSum = gaps.reduce(function (s, x) { return s + x[1] - x[0]; }, 0);
    note.textContent = "Run " + num(tl.iteration, "timeline.iteration") + ", the kept run nearest the median: " + g(wall, 4) +
                       " \u00b5s wall-clock, " + events.length + " nodes one after another (" +
                       (events.length <= 40 ? "a row each" : "a row per op type") + "); " + g(gapSum, 3) + " \u00b5s (" +
                       (end > 0 ? pct(gapSum / end, 1) : "0") + "%) between them is the executor's own work (grey).";
    const ops = document.getElementById("timeline-ops");
    const seen = new Set();
    events.forEach(function (e) { seen.add(e.n.op); });
    Array.from(opColours.keys()).filter(function (op) { return seen.has(op); }).forEach(function (op) {
      const span = el("span");
      span.appendChild(swatch(opColours.get(op)));
      span.appendChild(document.createTextNode(op));
      ops.appendChild(span);
    });

    // A row per node while the rows stay readable; past that, a lane per op type.
    const perNode = events.length <= 40;
    const laneOps = Array.from(opColours.keys()).filter(function (op) { return seen.has(op); });
    const rowOf = function (e, i) { return perNode ? i : laneOps.indexOf(e.n.op); };
    const rowLabels = perNode ? events.map(function (e) { return cut(e.n.name, 44); }) : laneOps;
    const W = 1340, L = 300, R = 16, T = 8, lane = 16, rowH = 18;
    const top = T + 2 * (lane + 4);
    const H = top + rowLabels.length * rowH + 40;
    plot.setAttribute("width", W);
    plot.setAttribute("height", H);
    plot.setAttribute("viewBox", "0 0 " + W + " " + H);
    const span = end > 0 ? end : 1;
    const Tx = function (t) { return L + t / span * (W - L - R); };
    const step = niceStep(span);
    for (let t = 0; t <= span * 1.0001; t += step) {
      const x = Math.round(Tx(t)) + 0.5;
      svg(plot, "line", { class: "grid", x1: x, x2: x, y1: T, y2: H - 34 });
      svg(plot, "text", { x: x, y: H - 20, "text-anchor": "middle" }, g(t, 4));
    }
    svg(plot, "text", { class: "axis-label", x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "time since the run's start (\u00b5s)");
    gaps.forEach(function (gp) {
      svg(plot, "rect", { class: "tl-gap-band", x: Tx(gp[0]), y: T, width: Math.max(0, Tx(gp[1]) - Tx(gp[0])), height: H - 34 - T });
    });
    svg(plot, "text", { x: L - 8, y: T + lane - 4, "text-anchor": "end" }, "run");
    const runBar = svg(plot, "rect", { class: "tl-run", x: Tx(0), y: T + 0.5, width: Tx(wall) - Tx(0), height: lane });
    tip(runBar, "run " + tl.iteration + ": " + g(wall, 4) + " \u00b5s");
    svg(plot, "text", { x: L - 8, y: T + 2 * lane, "text-anchor": "end" }, "executor");
    gaps.forEach(function (gp) {
      const r = svg(plot, "rect", { class: "tl-gap", x: Tx(gp[0]), y: T + lane + 4, width: Math.max(1, Tx(gp[1]) - Tx(gp[0])), height: lane });
      tip(r, "executor: " + g(gp[1] - gp[0], 3) + " \u00b5s from " + g(gp[0], 4) + " to " + g(gp[1], 4) + " \u00b5s");
    });
    rowLabels.forEach(function (label, i) {
      svg(plot, "text", { x: L - 8, y: top + i * rowH + rowH - 5, "text-anchor": "end" }, label);
    });
    events.forEach(function (e, i) {
      const y = top + rowOf(e, i) * rowH;
      const bar = svg(plot, "rect", { class: "tl-bar", x: Tx(e.start), y: y + 1, width: Math.max(1, Tx(e.start + e.dur) - Tx(e.start)),
                                      height: rowH - 2, fill: opColours.get(e.n.op) });
      tip(bar, e.n.name + "\n" + e.n.op + " on " + e.n.kernel + (e.n.params ? " (" + e.n.params + ")" : "") + "\nstart " +
               g(e.start, 4) + " \u00b5s, " + g(e.dur, 4) + " \u00b5s (" + pct(e.dur / span, 1) + "% of the run)");
    });
  }

  // ---- tables: sortable by clicking a column's header ----
  function table(id, columns, rows, sortColumn) {
    const t = document.getElementById(id);
    const head = el("thead"), hr = el("tr"), body = el("tbody");
    const ths = columns.map(function (c, i) {
      const th = el("th", c.label, c.num ? "num" : "");
      if (c.hint) th.title = c.hint;
      th.addEventListener("click", function () { sortBy(i); });
      hr.appendChild(th);
      return th;
    });
    head.appendChild(hr);
    t.appendChild(head);
    t.appendChild(body);
    const trs = rows.map(function (r) {
      const tr = el("tr");
      columns.forEach(function (c) {
        const td = el("td", null, (c.num ? "num" : "") + (c.mono ? " mono" : "") + (c.cls ? " " + c.cls : ""));
        if (c.cell) c.cell(td, r); else td.textContent = c.text(r);
        tr.appendChild(td);
      });
      return { r: r, tr: tr };
    });
    let current = -1, desc = true;
    function sortBy(i) {
      desc = i === current ? !desc : !!columns[i].num;
      current = i;
      const key = columns[i].key || columns[i].text;
      trs.sort(function (a, b) {
        const x = key(a.r), y = key(b.r);
        const c = x < y ? -1 : x > y ? 1 : 0;
        return desc ? -c : c;
      });
      trs.forEach(function (x) { body.appendChild(x.tr); });
      ths.forEach(function (th, j) { th.dataset.sort = j === i ? (desc ? "desc" : "asc") : ""; });
    }
    sortBy(sortColumn);
  }
  function shareCell(td, share) {
    td.textContent = pct(share, 1);
    const w = pct(Math.min(1, Math.max(0, share)), 1);
    td.style.background = "linear-gradient(90deg, #d6e4f3 " + w + "%, transparent " + w + "%)";
  }
  function opCell(td, op) {
    td.appendChild(swatch(opColours.get(op) || "#999"));
    td.appendChild(document.createTextNode(op));
  }
  function kernelCell(td, n) {
    td.textContent = n.kernel;
    if (n.params) td.appendChild(el("span", n.params, "params"));
  }
  function renderTables() {
    table("nodes", [
      { label: "%run", num: true, cls: "share", key: function (n) { return n.total_ms; }, cell: function (td, n) { shareCell(td, n.share); },
        hint: "share of the timed runs' wall-clock time" },
      { label: "p50 \u00b5s", num: true, key: function (n) { return n.median_us; }, text: function (n) { return fixed(n.median_us, 2); } },
      { label: "p90 \u00b5s", num: true, key: function (n) { return n.p90_us; }, text: function (n) { return fixed(n.p90_us, 2); } },
      { label: "GFLOP/s", num: true, key: function (n) { return n.gflops; }, text: function (n) { return fixed(n.gflops, 1); } },
      { label: "GB/s", num: true, key: function (n) { return n.gbps; }, text: function (n) { return fixed(n.gbps, 1); } },
      { label: "bound", cls: "nowrap", text: function (n) { return n.bound === "compute" ? "compute (" + n.precision + ")" : n.level; },
        hint: "the roof the node sits under: the compute peak of its precision, or the memory level that holds its bytes" },
      { label: "%peak", num: true, key: function (n) { return n.peak_share; }, text: function (n) { return pct(n.peak_share, 0); },
        hint: "achieved rate over that roof" },
      { label: "op", cls: "nowrap", text: function (n) { return n.op; }, cell: function (td, n) { opCell(td, n.op); } },
      { label: "kernel", text: function (n) { return n.kernel + " " + n.params; }, cell: kernelCell },
      { label: "node", mono: true, cls: "wide", text: function (n) { return n.name; } },
      { label: "output", mono: true, text: function (n) { return n.outputs; } },
      { label: "sources", mono: true, cls: "wide", text: function (n) { return n.sources.join(", "); },
        hint: "the ONNX nodes this node came from (several for a fused node)" },
    ], nodes, 0);
    const groupColumns = function (label, cell) {
      return [
        { label: "%run", num: true, cls: "share", key: function (x) { return x.total_ms; }, cell: function (td, x) { shareCell(td, x.share); } },
        { label: "\u00b5s/run", num: true, key: function (x) { return x.total_ms; },
          text: function (x) { return fixed(1e3 * x.total_ms / Math.max(1, iterations), 2); } },
        { label: "nodes", num: true, key: function (x) { return x.nodes; }, text: function (x) { return String(x.nodes); } },
        { label: "GFLOP/s", num: true, key: function (x) { return x.gflops; }, text: function (x) { return fixed(x.gflops, 1); } },
        { label: "GB/s", num: true, key: function (x) { return x.gbps; }, text: function (x) { return fixed(x.gbps, 1); } },
        { label: label, cls: "nowrap", text: function (x) { return x.key; }, cell: cell },
      ];
    };
    table("by-op", groupColumns("op", function (td, x) { opCell(td, x.key); }), byOp, 0);
    table("by-kernel", groupColumns("kernel"), byKernel, 0);
  }

  function renderFooter() {
    const f = document.getElementById("footer");
    f.appendChild(document.createTextNode("kiln " + str(doc.kiln_version, "kiln_version") + ", " + str(doc.created, "created") +
                                          " \u2014 schema " + str(doc.schema, "schema") + " " + num(doc.schema_version, "schema_version") +
                                          "; the whole document is embedded in this page (#profile-data). "));
    f.appendChild(el("code", str(doc.command_line, "command_line")));
  }

  renderSummary();
  renderRoofline();
  renderTimeline();
  renderTables();
  renderFooter();
  document.body.dataset.rendered = "ok";
})();
)js";

}  // namespace

std::string render_html(const json& doc) {
  std::string file;
  if (doc.contains("model") && doc["model"].is_object() && doc["model"].contains("file") && doc["model"]["file"].is_string())
    file = doc["model"]["file"].get<std::string>();
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>kiln profile: " + html_escape(file) + "</title>\n";
  out += "<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  out += "<h1>kiln profile <span class=\"model\" id=\"title-model\"></span></h1>\n";
  out += "<div id=\"errors\" class=\"errors\" role=\"alert\"></div>\n";
  out += "<script>" + std::string(kErrorHook) + "</script>\n";
  out += "<noscript><p class=\"errors\">This report draws itself with JavaScript; the profile is embedded as JSON "
         "(#profile-data).</p></noscript>\n";
  out += R"html(<section id="summary"><h2>Summary</h2><dl class="summary" id="summary-list"></dl></section>
<section id="roofline"><h2>Roofline</h2>
<div class="row"><svg id="roofline-svg" role="img" aria-label="roofline"></svg><div class="side" id="roofline-side"></div></div>
</section>
<section id="timeline"><h2>Timeline of one run</h2><p class="note" id="timeline-note"></p><div class="ops" id="timeline-ops"></div>
<svg id="timeline-svg" role="img" aria-label="timeline"></svg></section>
<section><h2>Nodes</h2><p class="note">Every kernel call site; click a column to sort.</p><table id="nodes"></table></section>
<section><h2>By op type</h2><table id="by-op"></table></section>
<section><h2>By kernel</h2><table id="by-kernel"></table></section>
<footer id="footer"></footer>
)html";
  out += "<script type=\"application/json\" id=\"profile-data\">" + script_json(doc) + "</script>\n";
  out += "<script>" + std::string(kScript) + "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace kiln::profile
