// Command-line entry point and the pieces the subcommands share.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/ir.h"
#include "formats/serialize.h"
#include "formats/status.h"

namespace CLI {
class App;
class Validator;
}

namespace kiln::cli {

/// Parses the command line, runs the subcommand and returns kiln's exit code.
int main(int argc, char** argv);

/// Prints `kiln <verb>: error: <message>` on stderr and returns the error's exit code.
int report(const std::string& verb, const Error& e);
int report(const std::string& verb, const Status& s);

/// The whole command line, for provenance records.
std::string command_line(int argc, char** argv);

/// Reads a file, or stdin for "-".
Result<std::string> read_input(const std::string& path);
/// Loads and verifies a .kiln model from a file, or from stdin for "-".
Result<Model> load_model_arg(const std::string& path);
/// A model argument loaded with the hex SHA-256 of its bytes (the provenance of what compile and
/// quant write), from a file (mapped, as load_model maps it) or stdin for "-".
struct HashedModel {
  Model model;
  std::string sha256;
};
Result<HashedModel> load_model_arg_hashed(const std::string& path);
/// Whether files can be written at these paths (flags' outputs; empty and "-" pass): each one's
/// folder exists and is writable, and the path is not a folder. Checked before the work that
/// leads to them (a calibration, an autotuning search), which the late error would waste.
Status check_output_paths(std::initializer_list<const std::string*> paths);
/// Writes bytes atomically (temporary file in the same folder, then rename), or to stdout for "-".
Status write_output(const std::string& path, const std::string& bytes);
/// Saves a model (save_model: atomically, a sidecar past 2 GB), or serializes it to stdout for "-".
Status write_model_output(const Model& model, const std::string& path, const SaveOptions& options = {});

/// Adds `--max-memory SIZE` to a subcommand that loads or runs a model: parsing it sets kiln's
/// memory budget (formats/memory.h); a malformed size is a usage error.
void add_max_memory_option(CLI::App* cmd);

/// The number a flag's text starts with and the unit after it ("500ms" → 500, "ms"); nullopt
/// when it does not start with a number.
std::optional<std::pair<double, std::string>> number_and_unit(const std::string& text);
/// "5s", "500ms", "2m" or plain seconds (more than 0, at most a day); nullopt for anything else.
std::optional<double> parse_seconds(const std::string& text);

/// Checks for a count flag's text: a whole number from `least` to `most` ("--top: 0 is not a
/// whole number from 1 up"; CLI11's own PositiveNumber names a range up to DBL_MAX). A text
/// that is not a whole number ("2.5") fails the check before CLI11 tries to convert it.
CLI::Validator whole_number(int64_t least, int64_t most = INT32_MAX);
/// `--threads`: a whole number from 1 to kMaxThreads.
CLI::Validator thread_count();
/// The thread count for `--threads`' value (0: not given): the one given, else the cores kiln
/// may use here (available_cores). Where one is given above those and `runs_here` (the verb runs
/// kernels at that count on this machine, not only compiles for it), a warning on stderr says
/// so: the threads would take turns on the cores, and every parallel region waits for its last.
int thread_arg(const std::string& verb, int requested, bool runs_here = true);
/// A finite number above 0 (a tolerance).
CLI::Validator positive_number();

/// Parses a --input-shape NAME=SHAPE flag (`example` shows the form in the error message).
Result<std::pair<std::string, Shape>> parse_input_shape_flag(const std::string& spec, std::string_view example);

// Subcommand set-up: each adds its options to `app` and returns the callback's exit code slot.
void add_export_command(CLI::App& app, int& exit_code, const std::string& cmdline);
void add_quant_command(CLI::App& app, int& exit_code, const std::string& cmdline);
void add_compile_command(CLI::App& app, int& exit_code, const std::string& cmdline);
void add_run_command(CLI::App& app, int& exit_code);
void add_profile_command(CLI::App& app, int& exit_code, const std::string& cmdline);
void add_inspect_command(CLI::App& app, int& exit_code);
void add_tune_command(CLI::App& app, int& exit_code);

}  // namespace kiln::cli
