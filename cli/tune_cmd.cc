// `kiln tune show FILE [--json]`, `kiln tune merge A B... -o OUT`, `kiln tune prune FILE`: read,
// combine and clean the tuning database of `kiln compile --mode max-autotune`
// (compile/tuning_db.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/app.h"
#include "compile/tuning_db.h"

namespace kiln::cli {

namespace {

using tuning::TuningDb;
using tuning::TuningRecord;

struct TuneArgs {
  std::string file;                 ///< show, prune
  bool json = false;                ///< show
  std::vector<std::string> inputs;  ///< merge
  std::string output;               ///< merge
};

std::string param_text(const KernelParam& p) {
  if (const auto* i = std::get_if<int64_t>(&p)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&p)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", *d);
    return buf;
  }
  return std::get<std::string>(p);
}

// `kiln.gemm_f32_avx512 mr=6 nr=64 kc=256`.
std::string kernel_text(const KernelChoice& k) {
  std::string s = k.name;
  for (const auto& [name, value] : k.params) s += " " + name + "=" + param_text(value);
  return s;
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string machine_text(const tuning::MachineFingerprint& m) {
  return m.model_name + " [" + m.id() + (m == tuning::MachineFingerprint::host() ? ", this machine]" : "]");
}

// The table: one row per record, columns padded to their widest cell.
void print_table(const TuningDb& db, const std::string& file) {
  const tuning::TuningVersions& now = tuning::TuningVersions::current();
  std::vector<std::vector<std::string>> rows = {{"problem", "machine", "winner", "time us", "runner-up", "versions"}};
  for (const TuningRecord* r : db.records()) {
    std::optional<double> margin = r->runner_up_margin();
    rows.push_back({r->problem.str(), machine_text(r->machine), kernel_text(r->winner.kernel), fixed(r->winner.time_us, 2),
                    margin ? (*margin < 0 ? "" : "+") + fixed(*margin * 100, 1) + "%" : "-",  // below 0: faster, not kept
                    r->versions == now ? "current"
                                       : "stale (kernels " + std::to_string(r->versions.kernel_templates) + ", oneDNN " +
                                             r->versions.onednn + ")"});
    for (std::string& cell : rows.back()) cell = escape_controls(cell);  // a database is a file anyone may have edited
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      // Times right-aligned, the rest left-aligned; no padding after the last column.
      const std::string pad(width[c] - row[c].size(), ' ');
      line += c == 3 ? pad + row[c] : (c + 1 == row.size() ? row[c] : row[c] + pad);
      if (c + 1 < row.size()) line += "  ";
    }
    std::cout << line << "\n";
  }
  std::cout << db.size() << " record" << (db.size() == 1 ? "" : "s") << " in " << file << "; this kiln: kernel templates "
            << now.kernel_templates << ", oneDNN " << now.onednn << "\n";
}

// {"file", "versions": this kiln's, "records": [each line as stored, plus what show adds]}.
void print_json(const TuningDb& db, const std::string& file) {
  const tuning::TuningVersions& now = tuning::TuningVersions::current();
  nlohmann::ordered_json records = nlohmann::ordered_json::array();
  for (const TuningRecord* r : db.records()) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(tuning::serialize_tuning_record(*r));
    std::optional<double> margin = r->runner_up_margin();
    j["machine_id"] = r->machine.id();
    j["this_machine"] = r->machine == tuning::MachineFingerprint::host();
    j["current_versions"] = r->versions == now;
    j["runner_up_margin"] = margin ? nlohmann::ordered_json(*margin) : nlohmann::ordered_json(nullptr);
    records.push_back(std::move(j));
  }
  nlohmann::ordered_json out = {{"file", file},
                                {"versions", {{"kernel_templates", now.kernel_templates}, {"onednn", now.onednn}}},
                                {"records", std::move(records)}};
  std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

int show(const TuneArgs& args) {
  Result<TuningDb> db = tuning::load_tuning_db(args.file);
  if (!db.ok()) return report("tune", db.error());
  if (args.json) print_json(*db, args.file);
  else print_table(*db, args.file);
  return 0;
}

int merge(const TuneArgs& args) {
  if (Status s = check_output_paths({&args.output}); !s.ok()) return report("tune", s);
  TuningDb merged;
  size_t read = 0;
  for (const std::string& in : args.inputs) {
    Result<TuningDb> db = tuning::load_tuning_db(in);
    if (!db.ok()) return report("tune", db.error());
    read += db->size();
    merged.merge(*db);
  }
  Status s = args.output == "-" ? write_output("-", merged.serialize()) : tuning::save_tuning_db(merged, args.output);
  if (!s.ok()) return report("tune", s);
  std::cerr << "kiln tune: merged " << read << " record" << (read == 1 ? "" : "s") << " from " << args.inputs.size() << " file"
            << (args.inputs.size() == 1 ? "" : "s") << " into " << merged.size() << " in " << args.output << "\n";
  return 0;
}

int prune(const TuneArgs& args) {
  Result<tuning::PruneCounts> counts = tuning::prune_tuning_db_file(args.file);
  if (!counts.ok()) return report("tune", counts.error());
  const tuning::TuningVersions& now = tuning::TuningVersions::current();
  std::cout << "kiln tune: dropped " << counts->dropped << " record" << (counts->dropped == 1 ? "" : "s")
            << " of other versions than this kiln's (kernel templates " << now.kernel_templates << ", oneDNN " << now.onednn << "), kept "
            << counts->kept << " in " << args.file << "\n";
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TuneArgs>();
  CLI::App* cmd = app.add_subcommand("tune", "Show, merge and prune the tuning database of compile --mode max-autotune");
  cmd->require_subcommand(1);
  cmd->footer("compile --mode max-autotune reads and adds to $XDG_CACHE_HOME/kiln/tuning.jsonl, else ~/.cache/kiln/tuning.jsonl");

  CLI::App* show_cmd = cmd->add_subcommand("show", "Print a tuning database: problem, machine, winner, time, runner-up margin");
  show_cmd->add_option("file", args->file, "the database (.jsonl)")->required();
  show_cmd->add_flag("--json", args->json, "machine-readable output");
  show_cmd->callback([args, &exit_code] { exit_code = show(*args); });

  CLI::App* merge_cmd = cmd->add_subcommand("merge", "Combine tuning databases, keeping the fastest winner per problem and machine");
  merge_cmd->add_option("inputs", args->inputs, "the databases to combine")->required();
  merge_cmd->add_option("-o,--output", args->output, "the merged database (- for stdout); may be one of the inputs")->required();
  merge_cmd->callback([args, &exit_code] { exit_code = merge(*args); });

  CLI::App* prune_cmd = cmd->add_subcommand("prune", "Drop the records of other kernel-template or oneDNN versions than this kiln's");
  prune_cmd->add_option("file", args->file, "the database, rewritten in place")->required();
  prune_cmd->callback([args, &exit_code] { exit_code = prune(*args); });
}

}  // namespace kiln::cli
