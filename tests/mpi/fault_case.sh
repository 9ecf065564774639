#!/usr/bin/env bash
# One fault case of the MPI executor: runs the mpirun command line given after "--" RUNS times
# (1 unless --runs) and checks that each run fails (non-zero), within BOUND seconds, printing
# lines that match every REGEX and none that matches a !REGEX, and that none of its processes is
# left afterwards (a stopped rank included). The faults of a stopped rank race with the
# deadlines, so one run passing says little: --runs repeats it.
# Ranks get a fresh TMPDIR: ctest gives each test its own (a .../tmpdir/NAME folder, made anew
# here); run by hand, a temporary one is made and removed.
# Usage: fault_case.sh BOUND [--runs N] REGEX... [!REGEX...] -- mpirun ... fault KIND TIMEOUT
set -u
bound=$1
shift
runs=1
if [[ ${1:-} == --runs ]]; then runs=$2; shift 2; fi
regexes=()
while [[ $# -gt 0 && $1 != -- ]]; do regexes+=("$1"); shift; done
shift
case ${TMPDIR:-} in
  */tmpdir/*) rm -rf "$TMPDIR" && mkdir -p "$TMPDIR" ;;
  *) TMPDIR=$(mktemp -d) && export TMPDIR && trap 'rm -rf "$TMPDIR"' EXIT ;;
esac
log=$TMPDIR/fault_case.log
status=0
for ((run = 1; run <= runs; ++run)); do
  tag="xpipe_fault_$$_${run}_$RANDOM"  # passed to every rank, to find them afterwards
  start=$(date +%s%N)
  timeout -s KILL $((bound + 30)) "$@" "$tag" >"$log" 2>&1
  rc=$?
  elapsed_ms=$((($(date +%s%N) - start) / 1000000))
  elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
  echo "fault_case: run $run of $runs:"
  cat "$log"
  echo "fault_case: run $run: exit code $rc after ${elapsed} s (bound ${bound} s)"
  if [[ $rc -eq 0 ]]; then echo "fault_case: FAIL: the job succeeded"; status=1; fi
  if ((elapsed_ms > bound * 1000)); then
    echo "fault_case: FAIL: over the bound (hung?)"
    status=1
  fi
  for regex in "${regexes[@]}"; do
    if [[ $regex == !* ]]; then
      if lines=$(grep -E -- "${regex#!}" "$log"); then
        echo "fault_case: FAIL: lines match '${regex#!}', which none may:"
        echo "$lines"
        status=1
      fi
    elif ! grep -Eq -- "$regex" "$log"; then
      echo "fault_case: FAIL: no line matches '$regex'"
      status=1
    fi
  done
  sleep 1
  if left=$(pgrep -f "$tag"); then
    echo "fault_case: FAIL: processes left behind: $left"
    kill -CONT $left 2>/dev/null
    kill -KILL $left 2>/dev/null
    status=1
  fi
done
rm -f "$log"
exit $status
