#!/usr/bin/env bash
# The sanitizer runs: AddressSanitizer + UBSan over every host test (slow, benchmark and
# allocation-counting tests excepted: the last replaces operator new, which ASan also does), and
# ThreadSanitizer over the executor, pipeline, checkpoint and trace tests (the threaded code);
# the MPI tests without LeakSanitizer (Open MPI's own allocations at exit).
# Any report fails the run. Not part of scripts/test.sh: the two builds take about 20 minutes
# on 2 cores.
# Usage: scripts/sanitize.sh [asan|tsan]   (both when no argument)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh >/dev/null  # the packages (and the release build, which the tool tests use)
kinds=("$@")
((${#kinds[@]})) || kinds=(asan tsan)
for kind in "${kinds[@]}"; do
  case "$kind" in
    asan)
      cmake --preset asan >/dev/null
      cmake --build --preset asan -j "$(nproc)"
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir build-asan -j "$(nproc)" --output-on-failure \
        -LE 'slow|bench|gpu|mpi' -E '^alloc\.|^consumer\.|^compile_fail\.'
      # Open MPI leaves its own allocations (MCA components, argv copies) at exit, which
      # LeakSanitizer reports in every MPI program whose exit code a test checks: the MPI tests
      # run with leak detection off; every other ASan and UBSan check stays on.
      ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir build-asan --output-on-failure -L mpi -LE 'slow|bench|gpu' \
        -E '^compile_fail\.'
      ;;
    tsan)
      cmake --preset tsan >/dev/null
      cmake --build --preset tsan -j "$(nproc)" --target xpipe_tests
      # OpenMP's runtime is not instrumented: one thread per stage keeps it out of the picture.
      OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        build-tsan/tests/xpipe_tests '[pipeline],[checkpoint],[trace],[executor]'
      ;;
    *)
      echo "scripts/sanitize.sh: unknown kind '$kind' (asan or tsan)" >&2
      exit 2
      ;;
  esac
done
echo "sanitize: ${kinds[*]} clean"
