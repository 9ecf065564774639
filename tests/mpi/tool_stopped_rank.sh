#!/usr/bin/env bash
# xpipe-train --executor mpi with rank 1 stopped (SIGSTOP) once epoch 1 is done: the job must end
# within 30 s, failing, with a line naming rank 1 as the stuck rank and none naming another;
# runs.csv must keep the finished epoch 1 with the run's status `failed`, and runs.json the one
# run, failed; no process of the job may be left, nor a rank's private folder in its TMPDIR
# (ctest gives each test one, a .../tmpdir/NAME folder made anew here; by hand, WORKDIR/tmp).
# Usage: tool_stopped_rank.sh XPIPE_TRAIN WORKDIR CMAKE mpirun [flags...]
set -uo pipefail
train=$1 work=$2 cmake=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
shift 3
rm -rf "$work" && mkdir -p "$work"
case ${TMPDIR:-} in
  */tmpdir/*) ;;
  *) export TMPDIR=$work/tmp ;;
esac
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
out=$work/out-$$-$RANDOM  # on every rank's command line: how its processes are found
log=$work/job.log
status=0
fail() { echo "tool_stopped_rank: FAIL: $*"; status=1; }
# The job's processes left (mpirun and the ranks), continued and killed.
cleanup() {
  local left
  if left=$(pgrep -f -- "$out"); then
    kill -CONT $left 2>/dev/null
    kill -KILL $left 2>/dev/null
  fi
}
trap cleanup EXIT

touch "$work/started"
"$@" -np 2 "$train" --executor mpi -K 2 --train-samples 4096 --test-samples 200 --epochs 3 \
  --batch 64 -M 2 --wait-timeout 3 --out "$out" >"$log" 2>&1 &
job=$!

# Epoch 1 done (rank 0 prints it), then rank 1 stopped: the xpipe-train process whose
# environment says OMPI_COMM_WORLD_RANK=1 (mpirun's own command line names --out too).
for ((i = 0; i < 600; ++i)); do
  grep -Eq 'epoch 1 +loss' "$log" && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if ! grep -Eq 'epoch 1 +loss' "$log"; then
  cat "$log"
  echo "tool_stopped_rank: FAIL: epoch 1 never finished"
  exit 1
fi
# Looked for again for up to 5 s: a read of /proc can miss a process (once in a CI run here).
rank1=
for ((i = 0; i < 50; ++i)); do
  for pid in $(pgrep -f -- "$out"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
      rank1=$pid
    fi
  done
  [[ -n $rank1 ]] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if [[ -z $rank1 ]]; then
  cat "$log"
  echo "tool_stopped_rank: FAIL: no process of rank 1 found"
  exit 1
fi
kill -STOP "$rank1"
stopped=$(date +%s%N)
echo "tool_stopped_rank: stopped rank 1 (pid $rank1) after epoch 1"

# The job must end by itself within 30 s.
for ((i = 0; i < 300; ++i)); do
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if kill -0 $job 2>/dev/null; then
  fail "the job did not end within 30 s of the stop"
  cleanup
fi
wait $job
rc=$?
elapsed_ms=$((($(date +%s%N) - stopped) / 1000000))
cat "$log"
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
echo "tool_stopped_rank: exit code $rc, $elapsed s after the stop"
[[ $rc -ne 0 ]] || fail "the job succeeded"

grep -Eq 'rank 1 \(stage 1\) is stuck' "$log" || fail "no line names rank 1 as the stuck rank"
if lines=$(grep -E 'rank (0|-1) \(stage (0|-1)\) is stuck|rank -1' "$log"); then
  fail "lines blame another rank than rank 1:"$'\n'"$lines"
fi

# The run's files (rank 0 writes them): epoch 1 kept, the run failed.
if [[ ! -f $out/runs.csv ]]; then
  fail "no $out/runs.csv"
else
  # run,schedule,predictor,optimizer,lr,model,stages,micro_batches,epoch,loss,...,status
  if ! awk -F, 'NR > 1 && $9 == 1 && $NF == "failed" { found = 1 } END { exit !found }' \
    "$out/runs.csv"; then
    fail "runs.csv holds no epoch 1 row with status failed:"$'\n'"$(cat "$out/runs.csv")"
  fi
fi
if [[ ! -f $out/runs.json ]]; then
  fail "no $out/runs.json"
else
  runs=$("$cmake" -DFILE="$out/runs.json" -P "$here/../runs_json_statuses.cmake" 2>&1)
  [[ $runs == "1 failed" ]] || fail "runs.json: expected one run, failed; got '$runs'"
fi

sleep 1
if left=$(pgrep -f -- "$out"); then
  fail "processes of the job left behind: $left"
  cleanup
fi
# No rank leaves a private folder, in its TMPDIR nor in /tmp (where xpipe-train once made them
# whatever TMPDIR said): none newer than this job's start.
left=$(find "$TMPDIR" /tmp -maxdepth 1 -name 'xpipe-train-rank-*' -newer "$work/started" 2>/dev/null)
[[ -z $left ]] || fail "a rank left its private output folder behind: $left"

[[ $status -ne 0 ]] || echo "tool_stopped_rank: ok"
exit $status
