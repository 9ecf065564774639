#!/usr/bin/env bash
# xpipe-plan check-mpi end to end: profile the reference MLP on this machine (the planner's
# inputs must come from the machine it is checked on), then check the planner's step times for
# two devices (2 x 1 data parallelism, 1 x 2 pipelines) against the MPI executor on 2 ranks.
# Usage: plan_check_mpi.sh XPIPE_PLAN WORKDIR MPIRUN [mpirun flags...]
set -euo pipefail
plan=$1 dir=$2
shift 2
rm -rf "$dir" && mkdir -p "$dir"
"$plan" profile --out "$dir/mlp.json" --repeats 3
# Loose on purpose (quiet, docs/results.md, check-mpi: within 16%): it catches a planner or a run
# wrong by half (both ranks' work counted on one core, a plan run on another split), not a busy
# machine's noise, nor a missing all-reduce alone (about a tenth of this step).
"$@" -np 2 "$plan" check-mpi --model "$dir/mlp.json" --mini-batches 8 --repeats 2 \
  --max-error 0.5 --out "$dir" | tee "$dir/out.txt"
for row in '2x1 M=1 b=128 gpipe' '1x2 M=4 b=128 1f1b-flush' 'largest |error|'; do
  grep -qF "$row" "$dir/out.txt" || { echo "plan_check_mpi: no '$row' in the output"; exit 1; }
done
test -s "$dir/check-mpi.json"
echo "plan_check_mpi: ok"
