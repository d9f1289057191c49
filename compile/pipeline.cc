// The compile pipeline: pass order, verification after each pass, timings, provenance.
#include "compile/pipeline.h"

#include <chrono>
#include <cstdio>
#include <unordered_set>
#include <utility>
#include <vector>

#include "formats/serialize.h"
#include "formats/text.h"
#include "formats/verify.h"

namespace kiln {

namespace {

// Where the constants of `g` of 64 KiB or more lie: the bytes, not the tensors, so that a
// weight a pass replaces is freed when the pass lets go of it.
std::vector<std::pair<const void*, size_t>> large_constants(const Graph& g) {
  std::vector<std::pair<const void*, size_t>> out;
  for (const Value& v : g.values) {
    if (v.constant.defined() && v.constant.nbytes() >= (size_t{64} << 10))
      out.emplace_back(v.constant.raw(), v.constant.nbytes());
  }
  return out;
}

// Gives back the pages of the constants in `before` that the graph no longer holds, where they
// lie in the mapped model file (release_file_pages): a pass that replaces a weight (BatchNorm
// folded into it, lowered to bf16) read it, so its file pages stayed in the process beside the
// new one.
void release_replaced(const std::vector<std::pair<const void*, size_t>>& before, const Graph& g) {
  std::unordered_set<const void*> kept;
  for (const Value& v : g.values)
    if (v.constant.defined()) kept.insert(v.constant.raw());
  for (const auto& [data, bytes] : before)
    if (!kept.count(data)) release_file_pages(data, bytes);
}

std::string known_pass_list() {
  std::string s;
  for (const PassInfo& p : all_passes()) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

Status unknown_pass(const std::string& flag, const std::string& name) {
  return user_error("", flag + ": unknown pass '" + name + "' (known passes: " + known_pass_list() + ")");
}

}  // namespace

Status check_pass_names(const CompileOptions& options) {
  for (const std::string& name : options.passes)
    if (!find_pass(name)) return unknown_pass("--passes", name);
  for (const std::string& name : options.print_after)
    if (name != "all" && !find_pass(name)) return unknown_pass("--print-after", name);
  return {};
}

std::optional<std::string> precision_speed_warning(DType precision, const CpuFeatures& cpu, const std::map<std::string, double>& peaks) {
  if (precision != DType::bf16 || cpu.amx || peaks.empty()) return std::nullopt;
  const auto f32 = peaks.find("f32"), bf16 = peaks.find("bf16");
  if (f32 == peaks.end()) return std::nullopt;
  const double b = bf16 == peaks.end() ? 0 : bf16->second;
  if (b > f32->second) return std::nullopt;
  char text[200];
  std::snprintf(text, sizeof text, "bf16 will not be faster than f32 on this CPU: its probed bf16 peak is %.0f GFLOP/s against f32's %.0f "
                "(no AMX); the weights take half the bytes", b, f32->second);
  std::string out = text;
  // AVX512-FP16 without AMX (a virtual machine not granted the tile state, say): fp16 is the
  // lower precision that runs faster there.
  if (const auto f16 = peaks.find("f16"); cpu.avx512_fp16 && f16 != peaks.end() && f16->second > f32->second) {
    std::snprintf(text, sizeof text, "; --precision fp16 can be (its probed f16 peak is %.0f GFLOP/s)", f16->second);
    out += text;
  }
  return out;
}

Result<CompileReport> compile_model(Model& model, const CompileOptions& options) {
  KILN_RETURN_IF_ERROR(check_pass_names(options));
  std::vector<const PassInfo*> order;
  if (options.passes.empty()) {
    for (const PassInfo& p : all_passes()) order.push_back(&p);
  } else {
    for (const std::string& name : options.passes) order.push_back(find_pass(name));
  }
  // A compiled model compiled again: its packed weights become plain, the form every pass reads
  // (prepack_weights packs them again for the kernels chosen this time).
  for (Value& v : model.graph.values)
    if (v.constant.is_packed()) v.constant = unpack(v.constant);
  PassContext ctx{options.target, options.input_shapes, &options.tuning, options.precision, options.lower_output_layers};
  const bool print_all = options.print_after.count("all") > 0;
  CompileReport report;
  for (const PassInfo* pass : order) {
    PassRecord rec;
    rec.name = std::string(pass->name);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::pair<const void*, size_t>> before = large_constants(model.graph);
    Result<PassResult> r = pass->run(model, ctx);
    release_replaced(before, model.graph);
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) {
      Error e = r.error();
      if (e.kind == ErrorKind::internal) e.what = "pass " + rec.name + ": " + e.what;
      return e;
    }
    rec.result = std::move(*r);
    rec.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    // Verifying costs about as much as one shape inference: cheap next to any real pass, and
    // it catches a broken rewrite at the pass that made it rather than at load time.
    if (Status v = verify_model(model); !v.ok()) {
      Error e = v.error();
      e.kind = ErrorKind::internal;
      e.what = "pass " + rec.name + " left an invalid graph: " + e.what;
      return e;
    }
    if (rec.result.changed && (print_all || options.print_after.count(rec.name))) {
      rec.has_text = true;
      rec.text_after = model_to_text(model);
    }
    if (options.after_pass) options.after_pass(rec);
    report.passes.push_back(std::move(rec));
  }
  model.stage = Stage::compiled;
  Provenance p;
  p.tool = "kiln compile";
  p.version = std::string(kiln_version());
  p.command = options.command_line;
  p.input_file = options.input_file;
  p.input_sha256 = options.input_sha256;
  model.provenance.push_back(std::move(p));
  return report;
}

}  // namespace kiln
