#!/usr/bin/env bash
# One fault case of the MPI executor: runs the mpirun command line given after "--" and checks
# that it fails (non-zero), within BOUND seconds, printing lines that match every REGEX, and
# that none of its processes is left afterwards (a stopped rank included).
# Usage: fault_case.sh BOUND REGEX... -- mpirun ... xpipe_test_mpi fault KIND TIMEOUT
set -u
bound=$1
shift
regexes=()
while [[ $# -gt 0 && $1 != -- ]]; do regexes+=("$1"); shift; done
shift
tag="xpipe_fault_$$_$RANDOM"  # passed to every rank, to find them afterwards
log=$(mktemp)
start=$(date +%s%N)
timeout -s KILL $((bound + 30)) "$@" "$tag" >"$log" 2>&1
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
cat "$log"
echo "fault_case: exit code $rc after ${elapsed} s (bound ${bound} s)"
status=0
if [[ $rc -eq 0 ]]; then echo "fault_case: FAIL: the job succeeded"; status=1; fi
if ((elapsed_ms > bound * 1000)); then echo "fault_case: FAIL: over the bound (hung?)"; status=1; fi
for regex in "${regexes[@]}"; do
  if ! grep -Eq "$regex" "$log"; then echo "fault_case: FAIL: no line matches '$regex'"; status=1; fi
done
sleep 1
if left=$(pgrep -f "$tag"); then
  echo "fault_case: FAIL: processes left behind: $left"
  kill -KILL $left 2>/dev/null
  status=1
fi
rm -f "$log"
exit $status
