#!/usr/bin/env bash
# measure-efficiency keeps what it finished: killed (SIGTERM; a background job of a script
# ignores SIGINT) during its second run, the E(B) file it leaves holds the first run's result
# and lists the second batch as pending.
#   efficiency_interrupted.sh XPIPE_PLAN OUT_DIR
set -uo pipefail
plan=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
file="$out/efficiency.json"
# B = 4096 runs one epoch (14 steps, never reaching 99%), then B = 32 one epoch (1875 steps).
"$plan" measure-efficiency --batches 4096,32 --target 0.99 --max-epochs 1 --evals-per-epoch 1 \
  --out "$file" >"$out/log" 2>&1 &
pid=$!
for _ in $(seq 600); do  # up to 60 s for the first run to be written
  grep -q '"pending"' "$file" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if ! kill -TERM "$pid" 2>/dev/null; then
  echo "FAIL: measure-efficiency ended before the interrupt (its second run should take seconds)"
  cat "$out/log"
  exit 1
fi
wait "$pid"
rc=$?
if [[ $rc -ne 143 ]]; then
  echo "FAIL: exit $rc after SIGTERM, expected 143 (killed while measuring)"
  exit 1
fi
fail=0
grep -q '"pending"' "$file" || { echo "FAIL: no pending list in $file"; fail=1; }
# The finished run: B = 4096 did not reach 99%, with its seed and last accuracy recorded.
tr -d ' \n' <"$file" | grep -q '"not_reached":\[{"batch":4096,"per_seed":\[{"epochs":null,"last_accuracy":0\.[0-9]*,"seed":1}\]}\]' ||
  { echo "FAIL: the finished B = 4096 run is not in not_reached"; fail=1; }
tr -d ' \n' <"$file" | grep -q '"pending":\[{"batch":32,"per_seed":\[\]}\]' ||
  { echo "FAIL: B = 32 is not pending with no seed done"; fail=1; }
[[ $fail -eq 0 ]] || { cat "$file"; exit 1; }
echo "ok: the interrupted measurement kept its finished run, B = 32 pending"
