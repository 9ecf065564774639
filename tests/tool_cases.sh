#!/usr/bin/env bash
# xpipe-train loses nothing, case by case: --out checked before any training, failed writes
# reported by file name (and never "wrote to" for them), gnuplot run without a shell, diverged
# runs marked, and SIGINT, SIGTERM and SIGPIPE leaving the finished runs on disk.
# Usage: tool_cases.sh <xpipe-train> <cmake> <scratch folder, emptied> <case>
set -u
tool=$1 cmake=$2 work=$3 case=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
small=(--train-samples 512 --test-samples 100 --epochs 1)

fail() {
  echo "FAIL ($case): $*"
  echo "--- output:"
  cat out.txt 2>/dev/null
  exit 1
}
# run <expected exit code> <flags...>: runs the tool, both streams in out.txt.
run() {
  local want=$1
  shift
  "$tool" "$@" >out.txt 2>&1
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "exit code $rc, expected $want"
}
says() { grep -Eq -- "$1" out.txt || fail "output does not match '$1'"; }
never_says() { grep -Eq -- "$1" out.txt && fail "output matches '$1'"; }
# statuses <runs.json>: its run count and each run's status, read by CMake's JSON parser (so the
# file must parse), e.g. "2 ok interrupted".
statuses() {
  cat >json.cmake <<'EOF'
file(READ "${FILE}" text)
string(JSON n LENGTH "${text}")
set(out "${n}")
if(n GREATER 0)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON s GET "${text}" ${i} status)
    string(APPEND out " ${s}")
  endforeach()
endif()
message("${out}")
EOF
  "$cmake" -DFILE="$1" -P json.cmake 2>&1
}
runs_json() {
  local got
  got=$(statuses "$1")
  [ "$got" = "$2" ] || fail "$1 holds '$got', expected '$2'"
}
# A study long enough to be stopped after its first run: 8 runs of 2 epochs over 2048 samples.
# Waits for runs.csv's first row, sends the signal, and expects the exit code within 10 s.
stop_study_after_first_run() {
  local signal=$1 want=$2
  "$tool" --compare --train-samples 2048 --test-samples 200 --epochs 2 --out out >out.txt 2>&1 &
  local pid=$! i
  for ((i = 0; i < 1200; ++i)); do  # 60 s
    [ -f out/runs.csv ] && [ "$(wc -l <out/runs.csv)" -ge 2 ] && break
    kill -0 $pid 2>/dev/null || fail "the study ended before a signal was sent"
    sleep 0.05
  done
  kill -s "$signal" $pid
  for ((i = 0; i < 200; ++i)); do  # 10 s: an epoch of 2048 samples takes about 1 s here
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  kill -0 $pid 2>/dev/null && { kill -KILL $pid; fail "still running 10 s after $signal"; }
  wait $pid
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "exit code $rc after $signal, expected $want"
  says "stopped by SIG$signal (before|during) run [2-8] of 8"
  says "the [1-7] run\\(s\\) done are in out"
  # The finished runs are whole on disk; the run the signal cut (if any) is marked.
  [ "$(grep -c ',ok$' out/runs.csv)" -ge 2 ] || fail "runs.csv lacks the first run's 2 rows"
  local got
  got=$(statuses out/runs.json)
  [[ "$got" =~ ^[1-8]\ ok(\ ok)*(\ interrupted)?$ ]] || fail "runs.json holds '$got'"
  [ -s out/timeline-gpipe_latest_adam.svg ] || fail "the first run's timeline is missing"
}

case $case in
  out_is_a_file)
    touch results
    run 2 --out results
    says "--out 'results': exists and is not a directory"
    [ -f results ] && [ ! -s results ] || fail "the file in the way was changed"
    ;;
  out_parent_is_a_file)  # fails for root too, unlike a chmod'ed folder
    touch file
    run 2 --out file/results
    says "--out 'file/results': cannot create the folder: Not a directory"
    ;;
  out_under_proc)
    run 2 --out /proc/xpipe-out
    says "--out '/proc/xpipe-out': cannot create the folder"
    ;;
  runs_json_is_a_directory)  # found when the study starts, before any training
    mkdir -p out/runs.json
    run 1 "${small[@]}" --out out
    says "cannot write 'out/runs.json': Is a directory"
    never_says "wrote to|epoch 1 +loss"
    ;;
  full_device)
    mkdir out && ln -s /dev/full out/runs.csv
    run 1 "${small[@]}" --out out
    says "cannot write 'out/runs.csv': No space left on device"
    never_says "wrote to"
    ;;
  write_fails_after_a_run)  # the run's results stay in runs.csv and runs.json
    mkdir -p out/timeline-async-1f1b_xpipe_adam.svg
    run 1 "${small[@]}" --out out
    says "cannot write 'out/timeline-async-1f1b_xpipe_adam.svg': Is a directory"
    never_says "wrote to"
    [ "$(grep -c ',1,.*,ok$' out/runs.csv)" -eq 1 ] || fail "runs.csv lacks the run"
    runs_json out/runs.json "1 ok"
    ;;
  quote_space_dollar_in_out)  # a shell would run the touch; gnuplot gets an argument vector
    dir="it's a \$HOME; touch pwned; '"
    run 0 "${small[@]}" --out "$dir"
    says "wrote to it's a .*accuracy\\.svg, accuracy\\.png"
    [ -s "$dir/accuracy.svg" ] && [ -s "$dir/accuracy.png" ] || fail "no plots in '$dir'"
    [ ! -e pwned ] && [ ! -e "$dir/pwned" ] || fail "a shell ran part of the folder name"
    runs_json "$dir/runs.json" "1 ok"
    ;;
  every_run_diverges)  # a result, not an error; no plot claimed
    run 0 --compare --lr 10 --sgd-lr 10 "${small[@]}" --out out
    says "no run trained to the end, so there is no accuracy plot"
    says "wrote to out: runs.csv, runs.json, accuracy.csv, accuracy.gp$"
    never_says "accuracy\\.(svg|png)"
    [ ! -e out/accuracy.svg ] && [ ! -e out/accuracy.png ] || fail "a plot was left"
    [ "$(grep -c ',diverged$' out/runs.csv)" -eq 8 ] || fail "runs.csv does not mark 8 runs"
    [ "$(grep -Ec '^[a-z0-9+()-]+ +diverged: epoch 1' out.txt)" -eq 8 ] ||
      fail "the table does not mark 8 runs"
    runs_json out/runs.json "8 diverged diverged diverged diverged diverged diverged diverged diverged"
    ;;
  single_run_diverges)  # the run is recorded; the command failed
    run 1 --lr 10 "${small[@]}" --out out
    says "epoch 1: loss [0-9.e+]+ is above 1e\\+06"
    says "wrote to out: runs.csv, runs.json, accuracy.csv, accuracy.gp$"
    runs_json out/runs.json "1 diverged"
    ;;
  sigint_keeps_finished_runs) stop_study_after_first_run INT 130 ;;
  sigterm_keeps_finished_runs) stop_study_after_first_run TERM 143 ;;
  sigpipe_keeps_the_files)  # stdout closed after one line; the study goes on and writes all
    "$tool" --compare "${small[@]}" --out out 2>out.txt | head -1 >head.txt
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || fail "exit code $rc with stdout closed, expected 0"
    grep -q "^xpipe-train: model mlp" head.txt || fail "head -1 got '$(cat head.txt)'"
    runs_json out/runs.json "8 ok ok ok ok ok ok ok ok"
    [ "$(grep -c ',ok$' out/runs.csv)" -eq 8 ] || fail "runs.csv lacks runs"
    [ -s out/accuracy.png ] || fail "no accuracy.png"
    ;;
  resume_is_exact)  # 3 epochs straight = 2 epochs, then --resume to 3: the same numbers
    ck=(--train-samples 1024 --test-samples 200 --stages 2 -M 2 --batch 64 --executor reference
      --measure-prediction)
    run 0 "${ck[@]}" --epochs 3 --checkpoint-dir ck-straight --out straight
    run 0 "${ck[@]}" --epochs 2 --checkpoint-dir ck --out first
    run 0 "${ck[@]}" --epochs 3 --checkpoint-dir ck --resume --out resumed
    says "resumed from ck/async-1f1b_xpipe_adam/ckpt-000002 \\(2 epochs done\\)"
    # loss and test accuracy of every epoch (columns 9-11), the resumed run's first two restored
    cut -d, -f9-11 straight/runs.csv >want.txt
    cut -d, -f9-11 resumed/runs.csv >got.txt
    cmp -s want.txt got.txt || fail "resumed epochs differ: $(diff want.txt got.txt | tr '\n' ' ')"
    [ -d ck/async-1f1b_xpipe_adam/ckpt-000003 ] || fail "no checkpoint after epoch 3"
    # and the prediction errors of every epoch, those of the restored epochs included
    grep -o '"relative_error": [-0-9.e]*' straight/runs.json >want.txt
    grep -o '"relative_error": [-0-9.e]*' resumed/runs.json >got.txt
    [ "$(wc -l <want.txt)" -ge 3 ] || fail "runs.json has no prediction errors per epoch"
    cmp -s want.txt got.txt || fail "resumed prediction errors differ: $(diff want.txt got.txt | tr '\n' ' ')"
    ;;
  checkpoints_never_overwritten)  # a folder with checkpoints needs --resume; --resume needs one
    run 0 "${small[@]}" --checkpoint-dir ck --out out
    run 2 "${small[@]}" --checkpoint-dir ck --out out
    says "ck/async-1f1b_xpipe_adam already holds checkpoints.*pass --resume"
    run 2 "${small[@]}" --resume --out out
    says "--resume needs --checkpoint-dir"
    touch file
    run 2 "${small[@]}" --checkpoint-dir file --out out
    says "--checkpoint-dir 'file': exists and is not a directory"
    ;;
  resume_refuses_another_run)  # a changed flag that changes the computation is named
    run 0 --train-samples 512 --test-samples 100 --epochs 1 --checkpoint-dir ck --out out
    run 1 --train-samples 512 --test-samples 100 --epochs 2 --lr 0.002 --checkpoint-dir ck \
      --resume --out out
    says "cannot resume .*ckpt-000001: it was run with run.lr = 0.00100000005, this run has 0.00200000009"
    ;;
  kill_then_resume)  # kill -9 mid-study; --resume finishes it with every run whole
    ck=(--compare --train-samples 1024 --test-samples 100 --epochs 2 --checkpoint-dir ck)
    "$tool" "${ck[@]}" --out out >out.txt 2>&1 &
    pid=$!
    for ((i = 0; i < 1200; ++i)); do  # until the second run has a checkpoint (60 s at most)
      ls ck/1f1b-flush_latest_adam/ckpt-000001/MANIFEST >/dev/null 2>&1 && break
      kill -0 $pid 2>/dev/null || fail "the study ended before the kill"
      sleep 0.05
    done
    kill -KILL $pid
    wait $pid
    run 0 "${ck[@]}" --resume --out out
    says "resumed from ck/gpipe_latest_adam/ckpt-000002 \\(2 epochs done\\)"
    says "resumed from ck/1f1b-flush_latest_adam/ckpt-00000[12]"
    runs_json out/runs.json "8 ok ok ok ok ok ok ok ok"
    [ "$(grep -c ',ok$' out/runs.csv)" -eq 16 ] || fail "runs.csv lacks epochs"
    ;;
  *) fail "no such case" ;;
esac
echo "ok: $case"
