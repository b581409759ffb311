#!/usr/bin/env bash
# test.sh — the whole test run on a fresh Debian 12 machine: installs missing packages, builds,
# runs the unit and end-to-end tests, the same tests under ASan/UBSan, and the fuzzers for a fixed
# number of iterations from a fixed seed. Prints each stage's time. GPU tests (label gpu) run only
# on a machine with a GPU: scripts/gpu-check.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t0=$(date +%s)
stage() { local s=$(date +%s); echo "=== $1"; shift; "$@"; echo "=== stage took $(( $(date +%s) - s ))s"; }
jobs=$(nproc)

stage "deps" scripts/deps.sh
stage "layout (the include graph of docs/layout.md)" scripts/check-layout
stage "build (gcc, -Werror, CUDA for one architecture if a toolkit is present)" \
  scripts/build.sh build -DSTRATA_WERROR=ON
stage "tests" ctest --test-dir build -LE gpu --output-on-failure -j"$jobs"
stage "llama.cpp parity" tests/llamacpp/run.sh build
stage "build (ASan+UBSan, no CUDA)" \
  scripts/build.sh build-asan -DSTRATA_SANITIZE=address,undefined -DSTRATA_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
stage "tests under ASan+UBSan" env ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$root/tests/lsan.supp \
  ctest --test-dir build-asan -LE "gpu|slow" --output-on-failure -j"$jobs"
if command -v clang >/dev/null; then
  fuzz_targets=$(find . -name '*_fuzz.c' -not -path './build*' -not -path './.*' -exec basename {} .c \;)
  build_fuzzers() {
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSTRATA_FUZZ=ON -DSTRATA_CUDA=OFF \
          -DSTRATA_SANITIZE=address,undefined >/dev/null
    cmake --build build-fuzz -j"$jobs" --target $fuzz_targets
  }
  stage "build fuzzers (clang libFuzzer)" build_fuzzers
  run_fuzzers() {
    for n in $fuzz_targets; do
      f=build-fuzz/$n
      # a fixed count from a fixed seed over a fresh corpus copy, so every CI run tests the same inputs
      rm -rf "build-fuzz/corpus-$n" && mkdir -p "build-fuzz/corpus-$n"
      LSAN_OPTIONS=suppressions=$root/tests/lsan.supp "$f" -runs="${STRATA_FUZZ_RUNS:-20000}" -seed=1 \
        "build-fuzz/corpus-$n" "tests/corpus/$n" 2>&1 | tail -n 2
    done
  }
  stage "fuzzers (fixed count, seed 1)" run_fuzzers
fi
echo "=== all stages: $(( $(date +%s) - t0 ))s"
