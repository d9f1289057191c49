#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (in the CMake preset `asan`'s build-asan/: clang, ASan + UBSan,
# the build the sanitizer tests use too) and runs them.
#   scripts/fuzz.sh --smoke              every target for 30 s (as many at once as CPUs) from its committed corpus and
#                                        the inputs of past findings (tests/fuzz/findings) (CI)
#   scripts/fuzz.sh TARGET [SECONDS] [-jobs N]
#                                        a long campaign: a work corpus in build-asan/fuzz/corpus/TARGET
#                                        seeded from tests/fuzz/corpus/TARGET, findings in
#                                        build-asan/fuzz/findings/TARGET/, executions, exec/s and
#                                        coverage printed at the end
#   scripts/fuzz.sh --list               the targets
# Every run uses a 10 s per-input time-out and libFuzzer's RSS and malloc limits; the targets
# themselves run under kiln's 256 MiB memory budget. A crash, leak, time-out, out-of-memory or
# sanitizer report fails the run and leaves the reproducer in the findings folder.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(fuzz_kiln_load fuzz_npy fuzz_npz fuzz_onnx_export fuzz_run fuzz_profile_compare fuzz_quant_config fuzz_tuning_db fuzz_smaps)
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

if [ "${1:-}" = "--list" ]; then printf '%s\n' "${targets[@]}"; exit 0; fi

cmake --preset asan >/dev/null
cmake --build build-asan -j "$(nproc)" --target "${targets[@]}"
out=build-asan/fuzz
mkdir -p "$out"

# Runs one target; $1 target, $2 seconds, $3 work corpus, the rest extra libFuzzer flags.
run_target() {
  local target=$1 seconds=$2 work=$3
  shift 3
  local findings=$out/findings/$target
  mkdir -p "$work" "$findings"
  cp -n tests/fuzz/corpus/"$target"/* tests/fuzz/findings/"$target"/* "$work"/ 2>/dev/null || true
  local log=$out/$target.log
  local rc=0
  build-asan/tests/fuzz/"$target" "$work" "${limits[@]}" -max_total_time="$seconds" \
      -artifact_prefix="$findings/" "$@" >"$log" 2>&1 || rc=$?
  local execs cov
  execs=$(grep -ho 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
  echo "fuzz: $target: rc $rc, $execs executions in ${seconds} s ($((execs / seconds)) exec/s), ${cov:-no coverage line}"
  if [ $rc -ne 0 ]; then
    grep -E 'ERROR|SUMMARY|runtime error|kiln fuzz' "$log" | head -20
    echo "fuzz: $target: see $log; reproducers in $findings/"
  fi
  return $rc
}

if [ "${1:-}" = "--smoke" ]; then
  # As many targets at once as there are CPUs (each is one process), each 30 s from its corpus.
  failed=0
  parallel=$(nproc)
  for ((i = 0; i < ${#targets[@]}; i += parallel)); do
    batch=("${targets[@]:i:parallel}")
    pids=()
    for t in "${batch[@]}"; do
      (work=$(mktemp -d); rc=0; run_target "$t" 30 "$work" >"$out/$t.smoke" 2>&1 || rc=$?; rm -rf "$work"; exit $rc) &
      pids+=($!)
    done
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}" || failed=$((failed + 1))
      cat "$out/${batch[$k]}.smoke"
    done
  done
  echo "fuzz: $(( ${#targets[@]} - failed )) passed, $failed failed"
  exit $(( failed > 0 ))
fi

target=${1:?usage: scripts/fuzz.sh --smoke | TARGET [SECONDS] [-jobs N]}
seconds=${2:-600}
shift $(( $# >= 2 ? 2 : 1 ))
if [[ ! " ${targets[*]} " == *" $target "* ]]; then echo "fuzz: unknown target '$target' (scripts/fuzz.sh --list)"; exit 2; fi
run_target "$target" "$seconds" "$out"/corpus/"$target" "$@"
