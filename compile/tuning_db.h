// The tuning database of `kiln compile --mode max-autotune`: which kernel (and with which
// parameters) was fastest for one problem on one machine, so that a later compile on the same
// machine reuses it without timing again. One JSON object per line (docs: README, `kiln tune`);
// `kiln tune show|merge|prune` read and rewrite it.
//
// A record is keyed by (problem, machine, versions). A record is used only on a machine with the
// same fingerprint and by a kiln whose versions (kernel templates, oneDNN) are the same: a
// timing says nothing about another CPU, and a new kernel template or oneDNN changes the race.
// Records of other versions stay in the file (a database shared by two kiln versions serves
// both) until `kiln tune prune` drops them.
//
// Writers never lose a record: an add takes an flock on `<db>.lock`, re-reads the file, merges
// and renames a complete new file into place (formats/atomic_file.h), so two compiles adding at
// once both land, and a writer killed at any point leaves the old file or the new one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"
#include "formats/status.h"

namespace kiln::tuning {

/// The version of the record format, written in every line as "format_version". A reader
/// refuses lines of a later version rather than guess at them.
inline constexpr int kFormatVersion = 1;

/// The version of kiln's kernel templates (runtime/cpu/gemm/ and friends): bump it when a
/// template changes what a set of parameters does or how fast it runs, so that old timings are
/// no longer used. It is not kiln's release number: a release that leaves the kernels alone
/// keeps the database. 2: kiln's Winograd convolution became a candidate. 3: kiln's f32 GEMM
/// fetches each next K slice's first panel ahead (products of several slices run faster), and
/// its default Kc and Winograd's default rule changed for a few rows by a streaming weight.
/// 4: kiln's f16 GEMM's blocking (Mc, Kc, the threads' split) became candidates. 5: kiln's
/// Winograd convolution on several threads lets each thread take its own tiles (by default
/// where U is under half of L2), and how the threads share it became a candidate; kiln's int8
/// GEMM folds the output's scale into the columns' where its epilogue clamps the codes.
inline constexpr int kKernelTemplateVersion = 5;

/// One input of a tuned problem.
struct TuningInput {
  std::vector<int64_t> shape;
  std::string dtype;  ///< dtype_name(), e.g. "f32"
  bool operator==(const TuningInput&) const = default;
};

/// What was timed: the op and everything about its operands that changes which kernel wins.
struct TuningProblem {
  std::string op;                   ///< e.g. "MatMul", "Conv"
  std::vector<TuningInput> inputs;  ///< in the op's input order
  std::string layout;               ///< e.g. "b_packed", "nhwc"; empty for the plain layout
  std::string epilogue;             ///< fused tail, e.g. "bias+relu"; empty for none
  int threads = 1;

  /// One line: `MatMul(64x256 f32, 256x512 f32) b_packed +bias+relu t4`.
  std::string str() const;
  bool operator==(const TuningProblem&) const = default;
};

/// What identifies a CPU for timing purposes. Virtual machines often report a generic model
/// name, so the family/model/stepping, the ISA features, the cores and the caches are part of
/// it too: two fingerprints match only when every field is equal.
struct MachineFingerprint {
  std::string model_name;  ///< CPUID brand string, e.g. "Intel(R) Xeon(R) Platinum 8480+"
  std::string vendor;      ///< CPUID vendor, e.g. "GenuineIntel"
  int family = 0, model = 0, stepping = 0;
  std::vector<std::string> features;  ///< CpuFeatures::names() of the CPU
  int physical_cores = 0;
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  ///< one cache of each level, whole

  /// This machine, read once (cpuinfo and CPUID).
  static const MachineFingerprint& host();
  /// A short stable name: the first 12 hex digits of the SHA-256 of the canonical JSON.
  std::string id() const;
  bool operator==(const MachineFingerprint&) const = default;
};

/// The versions the timings depend on.
struct TuningVersions {
  int kernel_templates = kKernelTemplateVersion;
  std::string onednn;  ///< "major.minor.patch" of dnnl_version()

  /// This kiln's: kKernelTemplateVersion and the oneDNN it runs with.
  static const TuningVersions& current();
  bool operator==(const TuningVersions&) const = default;
};

/// One timed kernel: its name ("kiln.gemm_f32_avx512", "onednn.matmul"), its parameters as a
/// flat object, and its median time.
struct TimedKernel {
  KernelChoice kernel;
  double time_us = 0;
  bool operator==(const TimedKernel&) const = default;
};

/// One line of the database.
struct TuningRecord {
  TuningProblem problem;
  MachineFingerprint machine;
  TuningVersions versions;
  TimedKernel winner;
  std::vector<TimedKernel> candidates;  ///< the runners-up, fastest first (not the winner)

  /// The fraction by which the first runner-up is slower than the winner; nullopt without one.
  std::optional<double> runner_up_margin() const;
  bool operator==(const TuningRecord&) const = default;
};

/// `r` in canonical form: parameters sorted by name (duplicates: the last), candidates sorted
/// by time (then by name and parameters). Serialization and the database store this form.
TuningRecord canonical(TuningRecord r);

/// Parses one line. Errors are user errors whose `what` says which field is wrong; the caller
/// adds the file and the line number.
Result<TuningRecord> parse_tuning_record(std::string_view line);
/// One line of JSON (no newline), in canonical form and key order.
std::string serialize_tuning_record(const TuningRecord& r);

/// A set of records, at most one per (problem, machine, versions), kept in canonical order.
class TuningDb {
 public:
  /// Adds `r`; of it and a record with the same key, the faster winner stays (on equal times,
  /// the one whose line sorts first), so that adding is commutative and idempotent.
  void add(TuningRecord r);
  /// Adds every record of `other`: merge(A, B) == merge(B, A), merge(A, A) == A.
  void merge(const TuningDb& other);
  /// The record for `problem` on `machine` with `versions`, or null. A record of another
  /// machine or of other versions is never returned.
  const TuningRecord* lookup(const TuningProblem& problem, const MachineFingerprint& machine = MachineFingerprint::host(),
                             const TuningVersions& versions = TuningVersions::current()) const;
  /// Why lookup() finds nothing for these arguments, for an error message: the problem's
  /// records are of other kernel versions, or for other thread counts on this machine, or for
  /// other machines only (the first named), or there is none.
  std::string miss_reason(const TuningProblem& problem, const MachineFingerprint& machine = MachineFingerprint::host(),
                          const TuningVersions& versions = TuningVersions::current()) const;
  /// Drops the records whose versions are not `versions`; returns how many it dropped.
  size_t prune(const TuningVersions& versions = TuningVersions::current());

  /// The records in canonical order: by problem, then machine, then versions.
  std::vector<const TuningRecord*> records() const;
  size_t size() const { return records_.size(); }
  bool empty() const { return records_.empty(); }
  /// JSON lines in canonical order, each ending in a newline.
  std::string serialize() const;
  bool operator==(const TuningDb&) const = default;

 private:
  std::map<std::string, TuningRecord> records_;  ///< by canonical key
};

/// Parses a whole database. Errors name `file` and the line: `db.jsonl: line 3: ...`. Empty
/// lines are skipped.
Result<TuningDb> parse_tuning_db(std::string_view text, const std::string& file);

/// What load_tuning_db does when the file does not exist.
enum class IfMissing { error, empty };
/// Reads and parses a database file.
Result<TuningDb> load_tuning_db(const std::string& path, IfMissing if_missing = IfMissing::error);
/// Replaces a database file with `db`, atomically, under the database's lock.
Status save_tuning_db(const TuningDb& db, const std::string& path);
/// Adds records to a database file (created, with its folder, when missing) without losing
/// records that another process adds at the same time: under the lock, re-read, merge, write a
/// temporary, rename.
Status add_tuning_records(const std::string& path, const std::vector<TuningRecord>& records);
/// What prune_tuning_db_file did.
struct PruneCounts {
  size_t dropped = 0, kept = 0;
};
/// Drops the records of `path` whose versions are not `versions`, rewriting the file atomically
/// under the lock (the file is left untouched when none is dropped).
Result<PruneCounts> prune_tuning_db_file(const std::string& path, const TuningVersions& versions = TuningVersions::current());

/// The lock file next to a database: `<path>.lock`.
std::string lock_path(const std::string& path);
/// $XDG_CACHE_HOME/kiln/tuning.jsonl, else $HOME/.cache/kiln/tuning.jsonl; empty when neither
/// is set.
std::string default_tuning_db_path();

}  // namespace kiln::tuning
