#!/usr/bin/env bash
# test.sh — the whole test run on a fresh Debian 12 machine: installs missing packages, builds,
# runs the unit and end-to-end tests, the same tests under ASan/UBSan, and the fuzzers for a fixed
# number of iterations from a fixed seed. GPU tests (label gpu) run only on a machine with a GPU:
# scripts/gpu-check.
#
# Every stage runs even when an earlier one failed (a stage whose build failed is skipped, and says
# so); the run fails at the end, naming the failed stages. At the end: each stage's time and
# result, the slowest tests, and a litter check: the tests run with TMPDIR and the XDG directories
# pointing into a scratch directory of this run, which must be empty afterwards (a test that leaves
# files there did not clean up, or wrote outside its own temporary directory).
#
# The machine this must pass on: 2 cores with other work on them. Check's timeouts, and the time
# bounds of tests that measure (tests/testutil.h test_slowdown), are stretched by
# STRATA_TEST_SLOWDOWN (default 2) for the unsanitized tests and twice that under ASan+UBSan.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t0=$(date +%s)
jobs=$(nproc)
slow=${STRATA_TEST_SLOWDOWN:-2}
export ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$root/tests/lsan.supp
summary=()
failed=()
declare -A stage_rc

# stage KEY TITLE CMD...: runs CMD, prints its time, records the result under KEY.
stage() {
  local key=$1 title=$2 s rc
  shift 2
  s=$(date +%s)
  echo "=== $title"
  "$@"
  rc=$?
  stage_rc[$key]=$rc
  local took=$(( $(date +%s) - s ))
  if [ "$rc" -eq 0 ]; then
    echo "=== $title: ok, ${took}s"
    summary+=("$(printf '%6ss  ok      %s' "$took" "$title")")
  else
    echo "=== $title: FAILED (exit $rc), ${took}s"
    summary+=("$(printf '%6ss  FAILED  %s' "$took" "$title")")
    failed+=("$title")
  fi
}

# skip TITLE WHY: a stage that cannot run.
skip() {
  echo "=== $1: skipped ($2)"
  summary+=("$(printf '%6s   skipped %s (%s)' "-" "$1" "$2")")
  failed+=("$1 (skipped: $2)")
}

# The scratch directory the tests write into, and what a person's own directories held before.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/strata-testsh-XXXXXX")
mkdir -p "$scratch/tmp" "$scratch/state" "$scratch/run" "$scratch/cache" "$scratch/config" "$scratch/data"
# traversable as /tmp is: a test that acts as another uid (ipc_test) must reach the paths it is given
chmod 0711 "$scratch" "$scratch/tmp"
chmod 0700 "$scratch/run"
uid=$(id -u)
count() { find "$@" -maxdepth 1 -mindepth 1 2>/dev/null | wc -l; }
home_state=${XDG_STATE_HOME:-$HOME/.local/state}/strata
before_state=$(count "$home_state")
before_tmp=$(count "${TMPDIR:-/tmp}" -name 'strata-test-*')
shm_list() { find /dev/shm -maxdepth 1 -name "strata-$uid-*" 2>/dev/null | sort; }
before_shm=$(shm_list)

# ctest_stage DIR LOG MULT [ctest args]: the tests of build DIR with the scratch directories, Check's
# timeouts times MULT, the output kept in LOG for the timing table; $matrix is passed as
# STRATA_TEST_MATRIX ("short" under the sanitizers: suites leave out the repeats of one code path
# over more architectures, which scripts/check-full runs).
matrix=
ctest_stage() {
  local dir=$1 log=$2 mult=$3
  shift 3
  env TMPDIR="$scratch/tmp" XDG_STATE_HOME="$scratch/state" XDG_RUNTIME_DIR="$scratch/run" \
    XDG_CACHE_HOME="$scratch/cache" XDG_CONFIG_HOME="$scratch/config" \
    XDG_DATA_HOME="$scratch/data" CK_TIMEOUT_MULTIPLIER="$mult" STRATA_TEST_SLOWDOWN="$mult" \
    STRATA_TEST_MATRIX="$matrix" \
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$log"
}

stage deps "deps" scripts/deps.sh
stage layout "layout (the include graph of docs/layout.md)" scripts/check-layout
stage build "build (gcc, -Werror, CUDA for one architecture if a toolkit is present)" \
  scripts/build.sh build -DSTRATA_WERROR=ON
if [ "${stage_rc[build]}" -eq 0 ]; then
  stage tests "tests" ctest_stage build build/ctest.log "$slow" -LE gpu
  stage parity "llama.cpp parity" tests/llamacpp/run.sh build
else
  skip "tests" "the build failed"
  skip "llama.cpp parity" "the build failed"
fi
# The Windows side of the shared-memory seam, cross-built and run under Wine (skipped, not failed,
# where mingw-w64 or Wine could not be installed).
if scripts/wine-test build-win >build-win.log 2>&1; then
  cat build-win.log
  stage_rc[wine]=0
  summary+=("$(printf '%6s   ok      %s' "-" "Windows shm shim under Wine ($(tail -n 1 build-win.log))")")
else
  rc=$?
  cat build-win.log
  if [ "$rc" -eq 2 ]; then
    summary+=("$(printf '%6s   skipped %s' "-" "Windows shm shim under Wine (no mingw-w64 or Wine)")")
  else
    summary+=("$(printf '%6s   FAILED  %s' "-" "Windows shm shim under Wine")")
    failed+=("Windows shm shim under Wine")
  fi
fi
rm -f build-win.log
# Debug (assertions on) at -O1, as ASan advises: side by side on 2 idle cores, -O0 took engine_test
# 74 s and fwd_test 32 s against 33 s and 13 s; the whole sanitized run took 229 s at -O1.
stage build_asan "build (ASan+UBSan at -O1, no CUDA)" \
  scripts/build.sh build-asan -DSTRATA_SANITIZE=address,undefined -DSTRATA_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_C_FLAGS_DEBUG=-g -O1"
if [ "${stage_rc[build_asan]}" -eq 0 ]; then
  matrix=short
  stage tests_asan "tests under ASan+UBSan (STRATA_TEST_MATRIX=short)" \
    ctest_stage build-asan build-asan/ctest.log $((slow * 2)) -LE "gpu|slow"
else
  skip "tests under ASan+UBSan" "the sanitizer build failed"
fi
if command -v clang >/dev/null; then
  fuzz_targets=$(find . -name '*_fuzz.c' -not -path './build*' -not -path './.*' -exec basename {} .c \;)
  build_fuzzers() {
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSTRATA_FUZZ=ON -DSTRATA_CUDA=OFF \
          -DSTRATA_SANITIZE=address,undefined >/dev/null &&
    cmake --build build-fuzz -j"$jobs" --target $fuzz_targets
  }
  stage build_fuzz "build fuzzers (clang libFuzzer)" build_fuzzers
  run_fuzzers() {
    local bad=0
    for n in $fuzz_targets; do
      f=build-fuzz/$n
      # a fixed count from a fixed seed over a fresh corpus copy, so every CI run tests the same inputs
      rm -rf "build-fuzz/corpus-$n" && mkdir -p "build-fuzz/corpus-$n"
      "$f" -runs="${STRATA_FUZZ_RUNS:-20000}" -seed=1 \
        "build-fuzz/corpus-$n" "tests/corpus/$n" 2>&1 | tail -n 2 || { echo "fuzzer $n failed"; bad=1; }
    done
    return $bad
  }
  if [ "${stage_rc[build_fuzz]}" -eq 0 ]; then
    stage fuzz "fuzzers (fixed count, seed 1)" run_fuzzers
  else
    skip "fuzzers (fixed count, seed 1)" "the fuzzer build failed"
  fi
else
  echo "=== fuzzers: not run (no clang; scripts/deps.sh installs it)"
fi

echo
echo "=== stages"
printf '%s\n' "${summary[@]}"
for log in build/ctest.log build-asan/ctest.log; do
  [ -f "$log" ] && [ "$log" -nt "$scratch" ] || continue
  echo "=== slowest tests ($log)"
  # ctest's lines: "  1/60 Test  #7: fe_e2e_test ......   Passed   125.31 sec"
  grep -E 'Test +#[0-9]+: ' "$log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) [ *.]*([A-Za-z* ]+[A-Za-z]) +([0-9.]+) sec.*/\3 \1 \2/' |
    sort -rn | head -n 8 | awk '{ t=$1; n=$2; $1=""; $2=""; printf "%8.1fs  %-28s %s\n", t, n, $0 }'
done

echo "=== litter"
litter=0
left=$(find "$scratch/tmp" "$scratch/state" "$scratch/run" "$scratch/cache" "$scratch/config" \
  "$scratch/data" -mindepth 1 -maxdepth 1 2>/dev/null)
if [ -n "$left" ]; then
  echo "the tests left these behind (a test binary keeps its root when one of its tests failed;"
  echo "anything else is a test that does not clean up, or writes outside its root):"
  echo "$left" | head -n 20
  litter=1
else
  echo "scratch TMPDIR and XDG directories: empty after the suite"
fi
after_state=$(count "$home_state")
after_tmp=$(count "${TMPDIR:-/tmp}" -name 'strata-test-*')
echo "outside the scratch directory (every process of this user counts, not only this run's):" \
  "$home_state: $before_state entries before, $after_state after;" \
  "${TMPDIR:-/tmp}/strata-test-*: $before_tmp before, $after_tmp after"
new_shm=$(comm -13 <(echo "$before_shm") <(shm_list) | grep -v '^$')
if [ -n "$new_shm" ]; then
  # /dev/shm is shared with every process of this user: listed, not counted as this run's failure
  echo "new shared-memory segments of uid $uid since the start (this run's or another process's):"
  echo "$new_shm" | head -n 20
fi
[ "$litter" -eq 0 ] && rm -rf "$scratch" || echo "kept $scratch for a look"
[ "$litter" -eq 0 ] || failed+=("litter check")

echo "=== all stages: $(( $(date +%s) - t0 ))s"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "=== FAILED: $(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
  exit 1
fi
echo "=== all passed"
