#!/usr/bin/env bash
# xpipe-train loses nothing, case by case: --out checked before any training, failed writes
# reported by file name (and never "wrote to" for them), gnuplot run without a shell, diverged
# runs marked, and SIGINT, SIGTERM and SIGPIPE leaving the finished runs on disk.
# Usage: tool_cases.sh <xpipe-train> <cmake> <scratch folder, emptied> <case>
set -u
tool=$1 cmake=$2 work=$3 case=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
tiny=(--train-samples 512 --test-samples 100)
small=("${tiny[@]}" --epochs 1)

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
# same_epochs <folder> <folder> <what>: the two runs.csv agree on every epoch's number, loss,
# test accuracy and test loss (columns 9-12), or the case fails saying <what> and the diff.
same_epochs() {
  cut -d, -f9-12 "$1/runs.csv" >want.txt
  cut -d, -f9-12 "$2/runs.csv" >got.txt
  cmp -s want.txt got.txt || fail "$3: $(diff want.txt got.txt | tr '\n' ' ')"
}
# epoch_loss <folder> <epoch>: that epoch's training loss in runs.csv.
epoch_loss() { sed -n "$(($2 + 1))p" "$1/runs.csv" | cut -d, -f10; }
# statuses <runs.json>: its run count and each run's status, read by CMake's JSON parser (so the
# file must parse), e.g. "2 ok interrupted".
statuses() { "$cmake" -DFILE="$1" -P "$here/runs_json_statuses.cmake" 2>&1; }
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

# sweep_check <folder> <epochs>: recomputes every configuration of sweep.csv from the per-run
# rows of sweep-runs.csv by an independent route (awk: mean, sample sd, the gap paired by seed
# with the GPipe run of the same K, M and optimizer) and prints each mismatch; nothing when all
# agree. Columns are found by their header names.
sweep_check() {
  awk -F, -v epochs="$2" '
    function near(a, b) {
      return (a == "" && b == "") || (a != "" && b != "" && (a - b) ^ 2 <= (1e-5 * (1 + (a < 0 ? -a : a))) ^ 2)
    }
    function sd(sum, sq, n) { return n < 2 ? "" : sqrt((sq - sum * sum / n) / (n - 1)) }
    # One metric v[cfg, seed, epoch] of this row'"'"'s configuration (cfg, its seeds s[1..n]) at
    # epoch e: its mean and sd over the seeds with a value, and (not for GPipe) its gap to the
    # GPipe run of the same seed, against the named columns. Returns the gap'"'"'s count.
    function check(v, mean_col, sd_col, gap_mean_col, gap_sd_col, e,   i, a, d, sum, sq, m, mean) {
      sum = sq = m = 0
      for (i = 1; i <= n; ++i) { a = v[cfg, s[i], e]; if (a == "") continue; sum += a; sq += a * a; ++m }
      mean = m ? sum / m : ""
      if (!near($col[mean_col], mean)) print what ": " mean_col " " $col[mean_col] ", expected " mean
      if (!near($col[sd_col], sd(sum, sq, m)))
        print what ": " sd_col " " $col[sd_col] ", expected " sd(sum, sq, m)
      if ($col["schedule"] == "gpipe") return 0
      sum = sq = m = 0
      for (i = 1; i <= n; ++i)
        if ((base[key], s[i], e) in v && v[cfg, s[i], e] != "" && v[base[key], s[i], e] != "") {
          d = v[cfg, s[i], e] - v[base[key], s[i], e]
          sum += d; sq += d * d; ++m
        }
      mean = m ? sum / m : ""
      if (!near($col[gap_mean_col], mean))
        print what ": " gap_mean_col " " $col[gap_mean_col] ", expected " mean
      if (!near($col[gap_sd_col], sd(sum, sq, m)))
        print what ": " gap_sd_col " " $col[gap_sd_col] ", expected " sd(sum, sq, m)
      return m
    }
    FNR == 1 { delete col; for (i = 1; i <= NF; ++i) col[$i] = i; file++; next }
    file == 1 {  # sweep-runs.csv
      key = $col["stages"] SUBSEP $col["micro_batches"] SUBSEP $col["optimizer"]
      cfg = key SUBSEP $col["schedule"] SUBSEP $col["predictor"]
      runs[cfg]++
      status[cfg, $col["status"]]++
      if ($col["status"] != "ok") next
      seeds[cfg] = seeds[cfg] " " $col["seed"]
      for (e = 1; e <= epochs; ++e) acc[cfg, $col["seed"], e] = $col["test_accuracy_pct_e" e]
      for (e = 1; e <= epochs; ++e) lss[cfg, $col["seed"], e] = $col["test_loss_e" e]
      if ($col["schedule"] == "gpipe") base[key] = cfg
      next
    }
    {  # sweep.csv: a row per configuration
      key = $col["stages"] SUBSEP $col["micro_batches"] SUBSEP $col["optimizer"]
      cfg = key SUBSEP $col["schedule"] SUBSEP $col["predictor"]
      what = $col["schedule"] "+" $col["predictor"] " K" $col["stages"] " M" $col["micro_batches"]
      rows++
      if ($col["runs"] != runs[cfg]) print what ": runs " $col["runs"] ", expected " runs[cfg]
      if ($col["ok"] != status[cfg, "ok"] + 0) print what ": ok " $col["ok"]
      if ($col["not_run"] != status[cfg, "not-run"] + 0) print what ": not_run " $col["not_run"]
      if ($col["diverged"] != status[cfg, "diverged"] + 0) print what ": diverged " $col["diverged"]
      n = split(seeds[cfg], s, " ")
      for (e = 1; e <= epochs; ++e) {
        m = check(acc, "acc_mean_e" e, "acc_sd_e" e, "gap_mean_e" e, "gap_sd_e" e, e)
        if (e == epochs && $col["schedule"] != "gpipe" && $col["gap_n"] != m)
          print what ": gap_n " $col["gap_n"] ", expected " m
        check(lss, "loss_mean_e" e, "loss_sd_e" e, "loss_gap_mean_e" e, "loss_gap_sd_e" e, e)
      }
    }
    END { if (rows == 0) print "sweep.csv has no configuration" }
  ' "$1/sweep-runs.csv" "$1/sweep.csv"
}
# json_length <file> <key...>: the length of the array there, read by CMake's JSON parser.
json_length() {
  local file=$1
  shift
  cat >len.cmake <<'EOF'
file(READ "${FILE}" text)
string(JSON n LENGTH "${text}" ${KEY})
message("${n}")
EOF
  "$cmake" -DFILE="$file" "-DKEY=$*" -P len.cmake 2>&1
}

# crc32 <file>: its CRC-32 as 8 hex digits (zlib's, as a MANIFEST records it), read from the
# trailer gzip writes (the CRC-32 of its input, little-endian), so no tool of the project computes it.
crc32() { gzip -c <"$1" | tail -c 8 | head -c 4 | od -An -tx4 | tr -d ' \n'; }
# set_field <MANIFEST> <field> <value>: edits a field and writes the MANIFEST's own checksum anew,
# as a writer other than xpipe might (the file then verifies; only its value is wrong).
set_field() {
  grep -v '^manifest-crc32 ' "$1" | sed "s/^field $2 .*/field $2 $3/" >body.txt
  { cat body.txt; echo "manifest-crc32 $(crc32 body.txt)"; } >"$1"
}
# damage <kind> <checkpoint folder>: one way a checkpoint can be hurt after it was committed.
damage() {
  local d=$2
  case $1 in
    truncated_stage) truncate -s 1000 "$d/stage-1.bin" ;;
    flipped_stage_byte)  # one byte in the middle of stage 0's weights, inverted
      local at=$(($(stat -c %s "$d/stage-0.bin") / 2)) b
      b=$(od -An -tu1 -j $at -N1 "$d/stage-0.bin" | tr -d ' ')
      printf "$(printf '\\%03o' $((255 - b)))" |
        dd of="$d/stage-0.bin" bs=1 seek=$at count=1 conv=notrunc status=none ;;
    grown_stage) printf 'x' >>"$d/stage-0.bin" ;;
    deleted_stage) rm "$d/stage-1.bin" ;;
    deleted_records) rm "$d/records.tsv" ;;
    manifest_file_crc) sed -i 's/^\(file stage-0.bin bytes=[0-9]* crc32=\)........$/\100000000/' "$d/MANIFEST" ;;
    manifest_version) sed -i '1s/version=[0-9]*/version=9/' "$d/MANIFEST" ;;
    manifest_field_bit) sed -i 's/^field run.lr 0.00100000005$/field run.lr 0.00100000004/' "$d/MANIFEST" ;;
    manifest_crlf) sed -i 's/$/\r/' "$d/MANIFEST" ;;
    manifest_empty) : >"$d/MANIFEST" ;;
    manifest_no_checksum) sed -i '/^manifest-crc32 /d' "$d/MANIFEST" ;;
    manifest_deleted) rm "$d/MANIFEST" ;;  # looks like a write cut short: passed over, kept
    *) fail "no damage $1" ;;
  esac
}
# same_file <a> <b>: fails unless both exist with the same bytes.
same_file() { cmp -s "$1" "$2" || fail "$1 and $2 differ"; }

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
    says "wrote to out: runs.csv, runs.json, accuracy.csv, loss.csv, accuracy.gp$"
    never_says "accuracy\\.(svg|png)"
    [ ! -e out/accuracy.svg ] && [ ! -e out/accuracy.png ] || fail "a plot was left"
    [ "$(grep -c ',diverged$' out/runs.csv)" -eq 8 ] || fail "runs.csv does not mark 8 runs"
    [ "$(grep -Ec '^[a-z0-9+()-]+ +diverged: epoch 1' out.txt)" -eq 8 ] ||
      fail "the table does not mark 8 runs"
    runs_json out/runs.json "8 diverged diverged diverged diverged diverged diverged diverged diverged"
    ;;
  compare_goes_on_past_a_failed_run)  # a run that cannot start fails alone; the study goes on
    run 0 --compare -M 2 "${small[@]}" --out out  # 2BW needs M >= K = 4
    [ "$(grep -c ',failed$' out/runs.csv)" -eq 1 ] && grep -q '^2bw+2bw(adam),.*,failed$' out/runs.csv ||
      fail "runs.csv does not mark 2BW alone failed: $(cut -d, -f1,14 out/runs.csv | tr '\n' ' ')"
    [ "$(grep -c ',ok$' out/runs.csv)" -eq 7 ] || fail "the other 7 runs did not train"
    ;;
  single_run_diverges)  # the run is recorded; the command failed
    run 1 --lr 10 "${small[@]}" --out out
    says "epoch 1: loss [0-9.e+]+ is above 1e\\+06"
    says "wrote to out: runs.csv, runs.json, accuracy.csv, loss.csv, accuracy.gp$"
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
    # loss, test accuracy and test loss of every epoch (columns 9-12), the resumed run's first two restored
    same_epochs straight resumed "resumed epochs differ"
    [ -d ck/async-1f1b_xpipe_adam/ckpt-000003 ] || fail "no checkpoint after epoch 3"
    # and the prediction errors of every epoch, those of the restored epochs included
    grep -o '"relative_error": [-0-9.e]*' straight/runs.json >want.txt
    grep -o '"relative_error": [-0-9.e]*' resumed/runs.json >got.txt
    [ "$(wc -l <want.txt)" -ge 3 ] || fail "runs.json has no prediction errors per epoch"
    cmp -s want.txt got.txt || fail "resumed prediction errors differ: $(diff want.txt got.txt | tr '\n' ' ')"
    ;;
  cnn_resume_is_exact)  # the ResNet (BatchNorm state) with augmentation: resume = straight
    base=(--model resnet --stages 4 -M 2 --batch 32 --train-samples 256 --test-samples 100
      --executor reference --augment-flip)
    ck=("${base[@]}" --augment-pad 2)
    run 0 "${ck[@]}" --epochs 2 --checkpoint-dir ck-straight --out straight
    run 0 "${ck[@]}" --epochs 1 --checkpoint-dir ck --out first
    [ -f ck/async-1f1b_xpipe_adam/ckpt-000001/stage-0.state.bin ] ||
      fail "the checkpoint lacks stage 0's BatchNorm state"
    run 0 "${ck[@]}" --epochs 2 --checkpoint-dir ck --resume --out resumed
    same_epochs straight resumed "resumed epochs differ"
    grep -Eq '"augment": ?"pad=2,flip=1"' resumed/runs.json || fail "runs.json lacks the augmentation"
    # Another augmentation is another computation: refused, named.
    run 1 "${base[@]}" --augment-pad 1 --epochs 3 --checkpoint-dir ck --resume --out other
    says "run.augment = pad=2,flip=1, this run has pad=1,flip=1"
    # Another model's checkpoint is named by the model first (its augmentation differs too).
    run 1 --model vgg --stages 4 -M 2 --batch 32 --train-samples 256 --test-samples 100 \
      --executor reference --epochs 3 --checkpoint-dir ck --resume --out other-model
    says "it was run with run.model = resnet, this run has vgg"
    ;;
  cnn_executors_agree)  # the VGG over 4 stages: threaded = reference, every epoch's numbers
    v=(--model vgg --stages 4 -M 4 --batch 64 --train-samples 512 --test-samples 100 --epochs 2)
    run 0 "${v[@]}" --executor reference --out ref
    run 0 "${v[@]}" --executor threaded --out thr
    same_epochs ref thr "threaded differs"
    ;;
  zero_bubble_trains_like_1f1b)  # ZB-H1, ZB-H2 and zb-auto print 1F1B-flush's numbers: the MLP
    # and the ResNet's splits (every digit runs.csv prints; the unit tests compare the weights bit for bit)
    m=(--stages 4 -M 4 --predictor latest "${small[@]}")
    run 0 "${m[@]}" --schedule 1f1b-flush --out one
    run 0 "${m[@]}" --schedule zb-h1 --out zb
    same_epochs one zb "zb-h1 differs"
    run 0 "${m[@]}" --schedule zb-h2 --out zb2
    same_epochs one zb2 "zb-h2 differs"
    # zb-auto: fitted to a profile, so its order may vary from run to run; its numbers may not.
    run 0 "${m[@]}" --schedule zb-auto --out auto
    ms='[0-9.e+-]+'
    says "zb-auto fitted to F/I/W ms per stage \\(profiled\\): $ms/$ms/$ms \\| "
    # Under its own profile the fitted order is never slower than ZB-H2's (both dry-run).
    line=$(grep -Eo "dry run $ms ms per mini-batch, ZB-H2's order $ms ms" out.txt) ||
      fail "no dry-run periods in the output"
    awk '{ exit !($3 <= $9) }' <<<"$line" || fail "zb-auto's fit is slower than ZB-H2's: $line"
    same_epochs one auto "zb-auto differs"
    run 2 "${m[@]}" --schedule zb-auto --device cuda --out dev
    says "--schedule zb-auto: it is fitted to F, I and W costs profiled on the host"
    grep -q 'class="I"' zb/timeline-zb-h1_latest_adam.svg &&
      grep -q 'class="W"' zb/timeline-zb-h1_latest_adam.svg || fail "the timeline lacks I or W"
    r=(--model resnet --stages 4 -M 2 --batch 32 --train-samples 256 --test-samples 100 --epochs 1
      --predictor latest)
    run 0 "${r[@]}" --schedule 1f1b-flush --out rone
    run 0 "${r[@]}" --schedule zb-h1 --out rzb
    same_epochs rone rzb "resnet zb-h1 differs"
    ;;
  interleaved_trains_like_1f1b)  # 4 stages on 2 workers print 1F1B-flush's numbers on 4 stages
    m=(--stages 4 -M 4 --predictor latest "${small[@]}")
    run 0 "${m[@]}" --schedule 1f1b-flush --out one
    run 0 "${m[@]}" --schedule interleaved-1f1b --pin-cpus 0 --out v
    # Stages 0 and 2 share worker 0, stages 1 and 3 worker 1: each reports its worker's idle.
    IFS=/ read -r b0 b1 b2 b3 <<<"$(awk '/^interleaved-1f1b\+latest/ { print $5 }' out.txt)"
    [ -n "$b0" ] && [ "$b0" = "$b2" ] && [ "$b1" = "$b3" ] ||
      fail "bubble per stage '$b0/$b1/$b2/$b3' is not per worker"
    same_epochs one v "interleaved differs"
    svg=v/timeline-interleaved-1f1b_latest_adam.svg
    grep -q '>worker 1<' $svg && ! grep -q '>worker 2<' $svg || fail "not a row per worker"
    run 2 --stages 2 --schedule interleaved-1f1b "${small[@]}" --out bad  # named before data
    says "--schedule interleaved-1f1b with -K 2 -M 4: .*even number of stages, at least 4 \\(got 2\\)"
    ;;
  v_schedules_train_like_gpipe)  # ZB-V and DualPipeV on 4 stages print GPipe's numbers
    m=(--stages 4 -M 4 --predictor latest "${small[@]}")
    run 0 "${m[@]}" --schedule gpipe --out one
    for v in zb-v dualpipev; do
      run 0 "${m[@]}" --schedule $v --out $v
      cut -d, -f9-12 one/runs.csv >want.txt
      cut -d, -f9-12 $v/runs.csv >got.txt
      cmp -s want.txt got.txt || fail "$v differs: $(diff want.txt got.txt | tr '\n' ' ')"
    done
    run 2 --stages 4 -M 2 --predictor latest "${small[@]}" --schedule zb-v --out bad  # M < 2P
    says "--schedule zb-v with -K 4 -M 2: .*needs micro_batches >= 2 x workers \\(got M=2, P=2\\)"
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
  predictor_param_recorded)  # --predictor-param reaches the run, runs.json and its checkpoint
    run 0 "${small[@]}" --predictor pipenag --predictor-param momentum=0.9 --checkpoint-dir ck \
      --out out
    grep -Eq '"predictor_params": ?"momentum=0.9,momentum_decay=0"' out/runs.json ||
      fail "runs.json lacks momentum=0.9"
    cp out/runs.csv with.csv
    run 0 "${small[@]}" --predictor pipenag --out def
    grep -Eq '"predictor_params": ?"momentum=0.99,momentum_decay=0"' def/runs.json ||
      fail "the defaults are not momentum 0.99, no momentum decay"
    # The same run but for the momentum: another loss.
    [ "$(cut -d, -f10 with.csv | tail -1)" != "$(cut -d, -f10 def/runs.csv | tail -1)" ] ||
      fail "momentum 0.9 and 0.99 trained the same loss"
    # PyTorch's momentum schedule (psi = 0.004) reaches the NAdam steps: another loss again.
    run 0 "${small[@]}" --predictor pipenag --predictor-param momentum_decay=0.004 --out psi
    grep -Eq '"predictor_params": ?"momentum=0.99,momentum_decay=0.004"' psi/runs.json ||
      fail "runs.json lacks momentum_decay=0.004"
    [ "$(cut -d, -f10 psi/runs.csv | tail -1)" != "$(cut -d, -f10 def/runs.csv | tail -1)" ] ||
      fail "momentum_decay 0.004 and 0 trained the same loss"
    run 1 "${tiny[@]}" --epochs 2 --predictor pipenag --predictor-param momentum=0.95 \
      --checkpoint-dir ck --resume --out out2
    says "cannot resume .*: it was run with run.predictor_params = momentum=0.9,momentum_decay=0, this run has momentum=0.95,momentum_decay=0 \\(differs in momentum\\)"
    # A checkpoint written before PipeNAG had momentum_decay (its params then: momentum=0.9)
    # resumes when the run keeps that parameter's default, and is refused when it does not.
    set_field ck/async-1f1b_pipenag_adam/ckpt-000001/MANIFEST run.predictor_params momentum=0.9
    run 1 "${tiny[@]}" --epochs 2 --predictor pipenag --predictor-param momentum=0.9 \
      --predictor-param momentum_decay=0.004 --checkpoint-dir ck --resume --out out3
    says "it was run with run.predictor_params = momentum=0.9, this run has momentum=0.9,momentum_decay=0.004 \\(differs in momentum_decay\\)"
    run 0 "${tiny[@]}" --epochs 2 --predictor pipenag --predictor-param momentum=0.9 \
      --checkpoint-dir ck --resume --out out4
    says "resumed from ck/async-1f1b_pipenag_adam/ckpt-000001 \\(1 epochs? done\\)"
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
  sweep_summary_matches_runs)  # K 2, M 1, GPipe and 3 predictors (2BW cannot run), 3 seeds
    sw=(--sweep --sweep-stages 2 --sweep-micro-batches 1 --sweep-predictors latest,2bw,xpipe
      --sweep-optimizers adam --seeds 3 --train-samples 384 --test-samples 200 --epochs 2)
    run 0 "${sw[@]}" --out out
    says "^\\[12/12\\] K 2, M 1, seed 3: async-1f1b\\+xpipe\\(adam\\)"
    says "wrote to out: sweep-runs.csv, sweep.csv, sweep.json, sweep.md, sweep-gap.csv, sweep-gap.gp, sweep-gap.svg, sweep-gap.png$"
    says "^ +2 +2bw\\+2bw\\(adam\\) +3 not run: .*micro_batches >= stages"
    says "^ +2 +gpipe\\+latest\\(adam\\) .*\\(baseline\\) .* 1/1$"
    [ "$(wc -l <out/sweep-runs.csv)" -eq 13 ] || fail "sweep-runs.csv: not a header and 12 runs"
    [ "$(grep -c ',not-run,0,' out/sweep-runs.csv)" -eq 3 ] || fail "sweep-runs.csv: not 3 2BW not-run"
    [ "$(grep -c ',ok,2,' out/sweep-runs.csv)" -eq 9 ] || fail "sweep-runs.csv: not 9 ok runs"
    [ "$(wc -l <out/sweep.csv)" -eq 5 ] || fail "sweep.csv: not a header and 4 configurations"
    [ "$(json_length out/sweep.json configurations)" = 4 ] || fail "sweep.json: not 4 configurations"
    [ "$(json_length out/sweep.json 'configurations;3;seed_runs')" = 3 ] ||
      fail "sweep.json: not 3 runs of xpipe"
    grep -Eq '"lr_schedule": ?"constant"' out/sweep.json || fail "sweep.json lacks lr_schedule"
    mismatches=$(sweep_check out 2)
    [ -z "$mismatches" ] || fail "sweep.csv disagrees with sweep-runs.csv: $mismatches"
    # The check can fail: with one xpipe accuracy moved by half a point it must complain.
    mkdir bad && cp out/sweep.csv bad/ &&
      awk -F, -v OFS=, 'FNR > 1 && $5 == "xpipe" && $9 == 2 { $NF += 0.5 } { print }' \
        out/sweep-runs.csv >bad/sweep-runs.csv
    [ -n "$(sweep_check bad 2)" ] || fail "sweep_check does not notice a changed accuracy"
    [ -s out/sweep-gap.svg ] && [ -s out/sweep-gap.png ] || fail "no gap plot"
    [ "$(grep -c '^| 2 | 1 | adam | ' out/sweep.md)" -eq 4 ] || fail "sweep.md: not 4 rows"
    grep -q '^| 2 | 1 | adam | 2bw + 2bw | not run (3 seeds) |' out/sweep.md ||
      fail "sweep.md: 2BW not a not-run row"
    grep -Eq '^\| 2 \| 1 \| adam \| async-1f1b \+ xpipe \| .* \| [0-9.]+ ± [0-9.]+ \| [+-][0-9.]+ ± [0-9.]+ \| [0-9]+ \|' out/sweep.md ||
      fail "sweep.md: no test loss and its gap for xpipe"
    ;;
  sweep_deep_splits_agree)  # the deep model over 2, 4 and 8 stages is one network: GPipe, whose
    # result does not depend on the split, gives the same loss and accuracies at every K
    run 0 --sweep --sweep-micro-batches 2 --sweep-predictors latest --sweep-optimizers adam \
      --seeds 1 --train-samples 256 --test-samples 200 --epochs 2 --out out
    awk -F, 'FNR > 1 && $4 == "gpipe" { print $12 "," $15 "," $16 }' out/sweep-runs.csv >gpipe.txt
    [ "$(wc -l <gpipe.txt)" -eq 3 ] || fail "not 3 GPipe runs: $(cat gpipe.txt)"
    [ "$(sort -u gpipe.txt | wc -l)" -eq 1 ] || fail "GPipe differs across K: $(tr '\n' ' ' <gpipe.txt)"
    # while the asynchronous runs do differ (deeper: staler), so the rows are not all alike
    awk -F, 'FNR > 1 && $4 == "async-1f1b" { print $12 }' out/sweep-runs.csv >async.txt
    [ "$(sort -u async.txt | wc -l)" -eq 3 ] || fail "async runs alike across K: $(tr '\n' ' ' <async.txt)"
    ;;
  sweep_prediction_error)  # --measure-prediction: per s, the error of XPipe's predictions
    run 0 --sweep --sweep-stages 2,4 --sweep-micro-batches 1 --sweep-predictors latest,xpipe \
      --sweep-optimizers adam --seeds 1 --train-samples 512 --test-samples 100 --epochs 1 \
      --measure-prediction --out out
    says "wrote to out: .*sweep-prediction.csv, sweep-prediction.gp, sweep-prediction.svg, sweep-prediction.png$"
    # Async 1F1B with M = 1 over K stages: stage k's weights are K - 1 - k steps stale, so XPipe
    # predicts over s = 1 .. 3 (K = 4; the last stage, s = 0, does not predict); Latest predicts
    # nothing, so only XPipe has a block.
    got=$(awk -F, '/^[0-9]/ { print $1 }' out/sweep-prediction.csv | sort -n | tr '\n' ' ')
    [ "$got" = "1 2 3 " ] || fail "sweep-prediction.csv has s = '$got', expected 1 2 3"
    [ "$(grep -c '^# index' out/sweep-prediction.csv)" -eq 1 ] || fail "not one block (xpipe)"
    grep -q '"relative_error"' out/sweep.json || fail "sweep.json lacks prediction_error"
    ;;
  sweep_refused_is_not_run)  # 2BW and 2BW + EF (both on the 2bw schedule) refuse M < K: "not run"
    # cells, not failures
    run 0 --sweep --sweep-stages 4 --sweep-micro-batches 1 --sweep-predictors 2bw,2bw-ef \
      --sweep-optimizers adam --seeds 1 --train-samples 256 --test-samples 100 --epochs 1 --out out
    says "^ +4 +2bw\\+2bw-ef\\(adam\\) +1 not run: .*micro_batches >= stages"
    says "^ +4 +2bw\\+2bw\\(adam\\) +1 not run: "
    [ "$(grep -c ',not-run,0,' out/sweep-runs.csv)" -eq 2 ] || fail "sweep-runs.csv: not 2 not-run"
    never_says "failed"
    ;;
  sweep_bad_flags)  # exit 2 naming the flag and what it allows, before any data is read
    run 2 --sweep --sweep-stages 2,3
    says "--sweep-stages: '3' is not one of 2, 4, 8 \\(the splits of model deep\\)"
    run 2 --sweep --model mlp --sweep-stages 8
    says "--sweep-stages: '8' is not one of 2, 4 \\(the splits of model mlp\\)"
    run 2 --sweep --sweep-predictors xpipe,foo
    says "--sweep-predictors: 'foo' is not one of latest, stash, 2bw, spectrain, xpipe"
    run 2 --sweep --sweep-optimizers adam,adam
    says "--sweep-optimizers: adam is listed twice"
    run 2 --sweep --sweep-schedules async-1f1b,gpipe
    says "--sweep-schedules: 'gpipe' is not one of async-1f1b, async-zb"
    run 2 --sweep --sweep-micro-batches 1,
    says "--sweep-micro-batches: '' is not a whole number from 1 to 1024"
    run 2 --sweep --sweep-micro-batches 128
    says "--sweep-micro-batches: 128 exceeds --batch \\(64\\)"
    run 2 --sweep --seeds 0
    says "--seeds"
    run 2 --sweep-stages 2
    says "--sweep-stages requires --sweep"
    run 2 --sweep --compare
    says "(--sweep excludes --compare|--compare excludes --sweep)"
    run 2 --sweep --predictor xpipe
    says "--sweep does not take --predictor \\(it uses --sweep-predictors\\)"
    run 2 --sweep -K 4
    says "--sweep does not take --stages \\(it uses --sweep-stages\\)"
    ;;
  sweep_sigint_keeps_runs)  # the runs done stay in the files, their summary consistent
    "$tool" --sweep --sweep-stages 2 --sweep-micro-batches 1 --sweep-predictors latest,xpipe \
      --sweep-optimizers adam --seeds 3 --train-samples 2048 --test-samples 200 --epochs 2 --out out >out.txt 2>&1 &
    pid=$!
    for ((i = 0; i < 1200; ++i)); do  # until 2 runs are in sweep-runs.csv (60 s at most)
      [ -f out/sweep-runs.csv ] && [ "$(wc -l <out/sweep-runs.csv)" -ge 3 ] && break
      kill -0 $pid 2>/dev/null || fail "the sweep ended before a signal was sent"
      sleep 0.05
    done
    kill -INT $pid
    for ((i = 0; i < 200; ++i)); do
      kill -0 $pid 2>/dev/null || break
      sleep 0.05
    done
    kill -0 $pid 2>/dev/null && { kill -KILL $pid; fail "still running 10 s after INT"; }
    wait $pid
    rc=$?
    [ "$rc" -eq 130 ] || fail "exit code $rc after INT, expected 130"
    says "stopped by SIGINT (before|during) run [0-9]+ of 9; the [0-9]+ run\\(s\\) done are in out"
    [ "$(grep -c ',ok,2,' out/sweep-runs.csv)" -ge 2 ] || fail "sweep-runs.csv lacks the runs done"
    mismatches=$(sweep_check out 2)
    [ -z "$mismatches" ] || fail "sweep.csv disagrees with sweep-runs.csv: $mismatches"
    ;;
  damaged_checkpoint_resumes)  # each damage to the newest checkpoint: passed over and set
    # aside, the epoch trained again from the one before, the same numbers as a straight run,
    # and a later resume goes on from the new checkpoint
    ck=(--train-samples 256 --test-samples 200 --stages 2 -M 2 --batch 64 --executor reference)
    run 0 "${ck[@]}" --epochs 3 --out straight
    run 0 "${ck[@]}" --epochs 2 --checkpoint-dir base --out first
    cut -d, -f9-12 straight/runs.csv >want.txt
    for kind in truncated_stage flipped_stage_byte grown_stage deleted_stage deleted_records \
      manifest_file_crc manifest_version manifest_field_bit manifest_crlf manifest_empty \
      manifest_no_checksum manifest_deleted; do
      rm -rf ck && cp -r base ck
      dir=ck/async-1f1b_xpipe_adam
      damage $kind $dir/ckpt-000002
      case=damaged_checkpoint_resumes/$kind
      run 0 "${ck[@]}" --epochs 3 --checkpoint-dir ck --resume --out resumed
      says "passed over $dir/ckpt-000002: "
      says "resumed from $dir/ckpt-000001 \\(1 epochs done\\)"
      if [ $kind = manifest_deleted ]; then  # uncommitted: the next write replaces it
        says "ckpt-000002: uncommitted"
      else
        says "set aside $dir/ckpt-000002 as ckpt-000002.refused"
        [ -d $dir/ckpt-000002.refused ] || fail "the damaged checkpoint was not kept"
      fi
      cut -d, -f9-12 resumed/runs.csv >got.txt
      cmp -s want.txt got.txt || fail "resumed epochs differ: $(diff want.txt got.txt | tr '\n' ' ')"
      [ -f $dir/ckpt-000002/MANIFEST ] && [ -f $dir/ckpt-000003/MANIFEST ] ||
        fail "epochs 2 and 3 were not checkpointed again"
      run 0 "${ck[@]}" --epochs 4 --checkpoint-dir ck --resume --out again
      says "resumed from $dir/ckpt-000003 \\(3 epochs done\\)"
    done
    case=damaged_checkpoint_resumes
    # Every checkpoint damaged: all set aside, the run starts afresh and says so.
    rm -rf ck && cp -r base ck
    damage truncated_stage ck/async-1f1b_xpipe_adam/ckpt-000001
    damage manifest_crlf ck/async-1f1b_xpipe_adam/ckpt-000002
    run 0 "${ck[@]}" --epochs 3 --checkpoint-dir ck --resume --out afresh
    says "passed over ck/async-1f1b_xpipe_adam/ckpt-000001: .*truncated"
    says "set aside ck/async-1f1b_xpipe_adam/ckpt-000001 as ckpt-000001.refused"
    says "no checkpoint verifies in ck/async-1f1b_xpipe_adam; starting afresh"
    cut -d, -f9-12 afresh/runs.csv >got.txt
    cmp -s want.txt got.txt || fail "the fresh run differs from the straight one"
    ;;
  failed_run_keeps_epochs)  # a checkpoint write fails after epoch 2: its 2 epochs are recorded
    mkdir -p ck/async-1f1b_xpipe_adam/latest  # a folder where the 'latest' file goes
    run 1 "${tiny[@]}" --epochs 3 --checkpoint-every 2 --checkpoint-dir ck --out out
    says "failed: epoch 2: .*latest"
    [ "$(grep -c ',failed$' out/runs.csv)" -eq 2 ] || fail "runs.csv lacks the 2 finished epochs"
    runs_json out/runs.json "1 failed"
    [ "$(json_length out/runs.json '0;epochs')" = 2 ] || fail "runs.json lacks the 2 epochs"
    ;;
  manifest_field_not_a_number)  # one run's checkpoint with a bad field fails that run only
    ck=(--compare --train-samples 512 --test-samples 100 --epochs 1 --checkpoint-dir ck)
    run 0 "${ck[@]}" --out first
    set_field ck/gpipe_latest_adam/ckpt-000001/MANIFEST result.weight_copies.0 x
    run 0 "${ck[@]}" --resume --out out
    says "gpipe\\+latest\\(adam\\) failed: .*field 'result.weight_copies.0' is 'x'"
    runs_json out/runs.json "8 failed ok ok ok ok ok ok ok"
    for value in 99999999999 1e999 -1 0x3; do
      set_field ck/gpipe_latest_adam/ckpt-000001/MANIFEST result.weight_copies.0 $value
      run 0 "${ck[@]}" --resume --out out
      says "field 'result.weight_copies.0' is '$value'"
    done
    # every run refused (another batch): the command fails, and out keeps the study before
    run 1 "${ck[@]}" --resume --batch 64 --out out
    says "every run of the study failed"
    says "no run of this study finished an epoch, so out keeps the earlier study's files"
    runs_json out/runs.json "8 failed ok ok ok ok ok ok ok"
    run 1 "${ck[@]}" --resume --batch 64 --out fresh  # a new folder gets the failures
    runs_json fresh/runs.json "8 failed failed failed failed failed failed failed failed"
    ;;
  resume_refuses_other_data)  # the same counts, one label changed: refused, naming the field
    data=${XPIPE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
    mkdir other && cp "$data"/*.gz other/
    zcat "$data/train-labels-idx1-ubyte.gz" >labels
    first=$(od -An -tu1 -j 8 -N1 labels | tr -d ' ')
    printf "$(printf '\\%03o' $(((first + 1) % 10)))" | dd of=labels bs=1 seek=8 conv=notrunc status=none
    gzip -c labels >other/train-labels-idx1-ubyte.gz
    run 0 "${small[@]}" --checkpoint-dir ck --out out
    grep -q '^field run.dp 1$' ck/async-1f1b_xpipe_adam/ckpt-000001/MANIFEST ||
      fail "the MANIFEST does not record run.dp"
    run 1 "${tiny[@]}" --epochs 2 --checkpoint-dir ck --resume --data-dir other --out out
    says "cannot resume .*ckpt-000001: it was run with run.train_data_crc32 = [0-9a-f-]+, this run has"
    cp -r "$data" same  # the same files elsewhere: the same data, resumed
    cp -r ck ck-older
    run 0 "${tiny[@]}" --epochs 2 --checkpoint-dir ck --resume --data-dir same --out out
    says "resumed from ck/async-1f1b_xpipe_adam/ckpt-000001"
    # A checkpoint of the previous xpipe-train (MANIFEST format 1, no run.dp, no data CRCs)
    # still resumes, saying that the data cannot be checked.
    m=ck-older/async-1f1b_xpipe_adam/ckpt-000001/MANIFEST
    grep -Ev '^(manifest-crc32|field run\.(dp|train_data_crc32|test_data_crc32)) ' $m |
      sed '1s/version=2/version=1/' >older.txt
    cp older.txt $m
    run 0 "${tiny[@]}" --epochs 2 --checkpoint-dir ck-older --resume --out out
    says "an older checkpoint without 'run.train_data_crc32': the data it was trained on cannot be checked"
    says "resumed from ck-older/async-1f1b_xpipe_adam/ckpt-000001"
    ;;
  rerun_keeps_earlier_study)  # a second study into a used --out: the first one's files stay
    # until its first run is recorded; then the first study's timelines go
    run 0 --compare "${small[@]}" --out out
    cp -r out first
    "$tool" --compare --train-samples 4096 --test-samples 100 --epochs 2 --out out >out.txt 2>&1 &
    pid=$!
    for ((i = 0; i < 600; ++i)); do  # until it has started training (30 s at most)
      grep -q "results go to" out.txt && break
      sleep 0.05
    done
    sleep 0.5
    kill -KILL $pid
    wait $pid
    for f in runs.csv runs.json accuracy.csv accuracy.gp accuracy.svg timeline-gpipe_latest_adam.svg \
      trace-async-1f1b_xpipe_adam.json; do
      same_file first/$f out/$f
    done
    # SIGINT before the first run ends: nothing recorded, the folder as it was
    "$tool" --compare --train-samples 4096 --test-samples 100 --epochs 2 --out out >out.txt 2>&1 &
    pid=$!
    for ((i = 0; i < 600; ++i)); do
      grep -q "results go to" out.txt && break
      sleep 0.05
    done
    kill -INT $pid
    wait $pid
    rc=$?
    [ "$rc" -eq 130 ] || fail "exit code $rc after INT, expected 130"
    says "before any run of this study was recorded; out holds what it held before"
    same_file first/runs.csv out/runs.csv
    same_file first/runs.json out/runs.json
    # a run that trains nothing (refused: --resume with another batch) keeps the earlier study
    run 0 "${small[@]}" --checkpoint-dir ck --out other
    run 1 "${small[@]}" --batch 64 --checkpoint-dir ck --resume --out out
    says "no run of this study finished an epoch, so out keeps the earlier study's files"
    never_says "wrote to"
    same_file first/runs.csv out/runs.csv
    same_file first/runs.json out/runs.json
    # a new study of one run replaces it all, the earlier timelines and traces included
    run 0 "${small[@]}" --predictor stash --out out
    runs_json out/runs.json "1 ok"
    [ "$(ls out/timeline-*.svg out/trace-*.json | tr '\n' ' ')" = \
      "out/timeline-async-1f1b_stash_adam.svg out/trace-async-1f1b_stash_adam.json " ] ||
      fail "the earlier study's timelines stayed: $(ls out)"
    ;;
  one_writer_per_folder)  # a second xpipe-train on a folder in use: exit 2 naming the holder
    "$tool" --train-samples 8192 --test-samples 100 --epochs 5 --checkpoint-dir ck --out out \
      >first.txt 2>&1 &
    pid=$!
    for ((i = 0; i < 600; ++i)); do
      grep -q "results go to" first.txt && break
      sleep 0.05
    done
    run 2 "${small[@]}" --out out
    says "--out 'out' is in use by another xpipe-train \\(pid $pid on "
    run 2 "${small[@]}" --checkpoint-dir ck --resume --out other
    says "the checkpoint folder 'ck/async-1f1b_xpipe_adam' is in use by another xpipe-train \\(pid $pid "
    [ ! -e other/runs.csv ] || fail "the refused run wrote into its --out"
    run 0 "${small[@]}" --predictor stash --checkpoint-dir ck --out other  # another run's folder
    kill -KILL $pid
    wait $pid
    # a killed holder holds nothing (its first epoch may be checkpointed: then resumed as done)
    run 0 --train-samples 8192 --test-samples 100 --epochs 1 --checkpoint-dir ck --resume --out out
    # launched by mpirun as several ranks without --executor mpi (its variables, as it sets them)
    OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 run 2 "${small[@]}" --out out2
    says "started by mpirun as 2 ranks, but --executor is threaded"
    [ ! -e out2 ] || fail "the refused launch made its --out"
    ;;
  checkpoint_flags)  # flags that would quietly turn checkpoints off, or be ignored
    run 2 "${small[@]}" --checkpoint-dir "" --out out
    says "--checkpoint-dir: is empty"
    run 2 "${small[@]}" --checkpoint-every 2 --out out
    says "--checkpoint-every requires --checkpoint-dir"
    mkdir ck && touch ck/async-1f1b_xpipe_adam  # the run's folder is a file: found before training
    run 2 "${small[@]}" --checkpoint-dir ck --out out
    says "the run folder 'ck/async-1f1b_xpipe_adam' exists and is not a directory"
    never_says "epoch 1 +loss"
    run 0 "${small[@]}" --checkpoint-dir ck2 --resume --out out
    says "no checkpoint to resume in ck2/async-1f1b_xpipe_adam; starting afresh"
    run 0 "${tiny[@]}" --epochs 2 --checkpoint-dir ck3 --out out
    # Fewer --epochs than the checkpoint holds: said; nothing trains, so no timeline is claimed,
    # and the one the run drew into this --out before stays.
    run 0 "${tiny[@]}" --epochs 1 --checkpoint-dir ck3 --resume --out out
    says "resumed from ck3/async-1f1b_xpipe_adam/ckpt-000002 \\(2 epochs done; more than --epochs 1, so none trains and the run reports the checkpoint's 2\\)"
    never_says "timeline"
    grep -q '"timeline_svg"' out/runs.json && fail "runs.json claims a timeline the run did not draw"
    [ -f out/timeline-async-1f1b_xpipe_adam.svg ] && [ -f out/trace-async-1f1b_xpipe_adam.json ] ||
      fail "resuming a finished run removed its timeline or trace: $(ls out | tr '\n' ' ')"
    ;;
  planted_temporary_link)  # a link planted as a checkpoint's temporary is not written through
    mkdir -p ck/async-1f1b_xpipe_adam
    echo "keep me" >victim
    ln -s ../../victim ck/async-1f1b_xpipe_adam/latest.tmp
    run 0 "${small[@]}" --checkpoint-dir ck --out out
    [ "$(cat victim)" = "keep me" ] || fail "the planted link was written through"
    [ "$(cat ck/async-1f1b_xpipe_adam/latest)" = ckpt-000001 ] || fail "latest not written"
    ;;
  sighup_keeps_finished_runs)
    # Under nohup SIGHUP is ignored, and xpipe-train leaves it so: nothing to test then.
    if (($(printf '%d' 0x"$(awk '/^SigIgn/ { print $2 }' /proc/$$/status)") & 1)); then
      echo "skipped: $case: SIGHUP is ignored by whoever started the tests (nohup)"
      exit 77  # CTest's SKIP_RETURN_CODE for this test
    fi
    stop_study_after_first_run HUP 129
    ;;
  lr_schedule_malformed)  # exit 2 quoting the text and saying what is expected, before any work
    run 2 "${small[@]}" --lr-schedule step:5,3 --data-dir /nonexistent --out out
    says "--lr-schedule: .*'step:5,3': milestone 3 does not follow 5; expected constant, cosine, st"
    never_says "cannot open IDX"
    [ ! -e out ] || fail "the refused command made its --out"
    run 2 "${small[@]}" --lr-schedule linear --out out
    says "--lr-schedule: .*'linear': unknown schedule"
    ;;
  lr_schedule_resume_is_exact)  # cosine over 3 epochs: stopped in epoch 3, resumed = straight
    base=(--train-samples 1024 --test-samples 200 --stages 2 -M 2 --batch 64 --executor reference
      --epochs 3)
    ck=("${base[@]}" --lr-schedule cosine)
    dir=ck/async-1f1b_xpipe_adam
    run 0 "${ck[@]}" --checkpoint-dir ck --out straight
    grep -Eq '"lr_schedule": ?"cosine"' straight/runs.json || fail "runs.json lacks cosine"
    grep -q '^field run.lr_schedule cosine$' $dir/ckpt-000003/MANIFEST ||
      fail "the MANIFEST does not record run.lr_schedule"
    # Epoch 1 trains at --lr under both; epochs 2 and 3 at less under cosine: another loss.
    run 0 "${base[@]}" --out constant
    grep -Eq '"lr_schedule": ?"constant"' constant/runs.json || fail "runs.json lacks constant"
    [ "$(epoch_loss straight 1)" = "$(epoch_loss constant 1)" ] || fail "cosine changed epoch 1"
    [ "$(epoch_loss straight 3)" != "$(epoch_loss constant 3)" ] || fail "cosine and constant trained alike"
    # Stopped in epoch 3 before its checkpoint was committed: resumed from epoch 2, epoch 3 at
    # its own rate (a checkpoint does not store the rate; each epoch sets it)
    rm $dir/ckpt-000003/MANIFEST
    run 0 "${ck[@]}" --checkpoint-dir ck --resume --out resumed
    says "resumed from $dir/ckpt-000002 \\(2 epochs done\\)"
    same_epochs straight resumed "resumed epochs differ"
    [ -f $dir/ckpt-000003/MANIFEST ] || fail "epoch 3 was not checkpointed again"
    # Another schedule is another computation: refused, named.
    run 1 "${base[@]}" --lr-schedule step:2 --checkpoint-dir ck --resume --out other
    says "cannot resume .*ckpt-000003: .*run.lr_schedule = cosine, this run has step:2$"
    # A checkpoint from before --lr-schedule (no such field) trained at a constant rate.
    m=$dir/ckpt-000003/MANIFEST
    grep -Ev '^(manifest-crc32|field run\.lr_schedule) ' $m >body.txt
    { cat body.txt; echo "manifest-crc32 $(crc32 body.txt)"; } >$m
    run 1 "${ck[@]}" --checkpoint-dir ck --resume --out other2
    says "it was run with run.lr_schedule = constant, this run has cosine"
    run 0 "${base[@]}" --checkpoint-dir ck --resume --out older
    says "resumed from $dir/ckpt-000003 \\(3 epochs done\\)"
    ;;
  gpt_trains)  # the gpt: K = 2 trains on text, reference = threaded to the bit, test loss
    # recorded; batches that would cut a sequence, and the GPU, refused with the reason (exit 2)
    base=(--model gpt -K 2 -M 2 --batch 512 --train-samples 4096 --test-samples 1024)
    run 0 "${base[@]}" --epochs 1 --executor reference --out ref
    run 0 "${base[@]}" --epochs 1 --out thr
    says "test [0-9.]+% \\(loss [0-9.]+\\)"
    same_epochs ref thr "executors differ"
    # Below the initial loss (about 6.5 nats) after 8 steps, above 0.
    awk -F, 'FNR == 2 { exit !($12 > 0 && $12 < 6) }' ref/runs.csv ||
      fail "test loss out of range: $(tail -1 ref/runs.csv)"
    grep -q '"test_loss"' ref/runs.json || fail "runs.json lacks test_loss"
    # Resumed from its checkpoint after epoch 1 = two epochs straight, test loss included.
    run 0 "${base[@]}" --epochs 2 --checkpoint-dir ck-straight --out straight
    run 0 "${base[@]}" --epochs 1 --checkpoint-dir ck --out first
    run 0 "${base[@]}" --epochs 2 --checkpoint-dir ck --resume --out resumed
    same_epochs straight resumed "resumed epochs differ"
    # A sweep of the gpt trains and records its default batch: 16 sequences (2048 tokens).
    run 0 --sweep --model gpt --sweep-stages 2 --sweep-micro-batches 1 --sweep-predictors latest \
      --sweep-optimizers adam --seeds 1 --train-samples 2048 --test-samples 128 --epochs 1 --out sweep
    grep -Eq '"batch": ?2048' sweep/sweep.json || fail "sweep.json records another batch"
    [ "$(cut -d, -f8 sweep/sweep-runs.csv | tail -n +2 | sort -u)" = 2048 ] ||
      fail "sweep-runs.csv records another batch: $(cut -d, -f8 sweep/sweep-runs.csv | tr '\n' ' ')"
    run 2 --model gpt --batch 100 "${small[@]}"
    says "--batch 100: the gpt trains on whole sequences of 128 tokens"
    run 2 --model gpt -K 2 -M 32 "${small[@]}"
    says "--micro-batches \\(32\\) exceeds the 16 sequences of a mini-batch"
    run 2 --model gpt --augment-flip "${small[@]}"
    says "the gpt trains on text"
    run 2 --model gpt --batch 768 --dp 2 -M 2 "${small[@]}"
    says "--dp 2 with --micro-batches 2: the gpt's 6 sequences a mini-batch must split evenly into 4"
    run 2 --model gpt -K 2 -M 2 --batch 512 --train-samples 4096 --test-samples 100 --epochs 1
    says "--test-samples: 100 tokens hold no whole sequence of 128 to evaluate on"
    run 2 --model gpt -K 2 -M 2 --batch 512 --train-samples 200 --test-samples 1024 --epochs 1
    says "--train-samples: 1 sequences of 128 tokens to train on \\(cut to whole sequences\\), but"
    # Over 4 stages the gpt runs on a device (not here: none, or no CUDA in the build); over 2
    # it is refused naming the splits a device runs.
    run 2 --model gpt -K 4 --device cuda "${small[@]}"
    says "--device cuda: (no CUDA device|this xpipe-train was built without CUDA)"
    run 2 --model gpt -K 2 --device cuda "${small[@]}"
    says "--device cuda: (runs the mlp, vgg, resnet or gpt over 4 stages only \\(got gpt over 2\\)|this xpipe-train was built without CUDA)"
    ;;
  warmup_cosine_resume_is_exact)  # per-step rates: resumed mid-run = straight; too long refused
    base=(--train-samples 1024 --test-samples 200 --stages 2 -M 2 --batch 64 --executor reference
      --epochs 3)
    ck=("${base[@]}" --lr-schedule warmup-cosine:10)
    dir=ck/async-1f1b_xpipe_adam
    run 0 "${ck[@]}" --checkpoint-dir ck --out straight
    grep -Eq '"lr_schedule": ?"warmup-cosine:10"' straight/runs.json ||
      fail "runs.json lacks warmup-cosine:10"
    grep -q '^field run.lr_schedule warmup-cosine:10$' $dir/ckpt-000003/MANIFEST ||
      fail "the MANIFEST does not record run.lr_schedule"
    # The warmup's low rates change epoch 1 already (unlike the per-epoch cosine).
    run 0 "${base[@]}" --out constant
    [ "$(epoch_loss straight 1)" != "$(epoch_loss constant 1)" ] || fail "the warmup did not change epoch 1"
    # Stopped in epoch 3: resumed from epoch 2's checkpoint, its steps' rates from the step count.
    rm $dir/ckpt-000003/MANIFEST
    run 0 "${ck[@]}" --checkpoint-dir ck --resume --out resumed
    says "resumed from $dir/ckpt-000002 \\(2 epochs done\\)"
    same_epochs straight resumed "resumed epochs differ"
    # 16 mini-batches an epoch, 3 epochs: 48 steps, so a warmup of 48 cannot fit.
    run 1 "${base[@]}" --lr-schedule warmup-cosine:48 --out long
    says "'warmup-cosine:48': the warmup \\(48 steps\\) must be shorter than the run \\(48 optimizer"
    run 2 "${small[@]}" --lr-schedule warmup-cosine:-3 --out bad
    says "'warmup-cosine:-3': warmup '-3' is not a whole number of steps >= 0"
    ;;
  clip_norm_executors_agree)  # --clip-norm: threaded = reference, recorded; bad bounds refused
    base=(--train-samples 1024 --test-samples 200 --stages 2 -M 2 --batch 64 --epochs 2
      --clip-norm 0.25)
    run 0 "${base[@]}" --executor reference --checkpoint-dir ck --out ref
    run 0 "${base[@]}" --out thr
    same_epochs ref thr "executors differ"
    grep -Eq '"clip_norm": ?0.25' ref/runs.json || fail "runs.json lacks clip_norm"
    grep -q '^field run.clip_norm 0.25$' ck/async-1f1b_xpipe_adam/ckpt-000002/MANIFEST ||
      fail "the MANIFEST does not record run.clip_norm"
    run 0 --train-samples 1024 --test-samples 200 --stages 2 -M 2 --batch 64 --epochs 2 --out free
    cut -d, -f9-12 free/runs.csv >free.txt
    cmp -s want.txt free.txt && fail "clipping at 0.25 trained as no clipping"
    run 2 "${small[@]}" --clip-norm -1
    says "--clip-norm"
    ;;
  threads_per_stage)  # --threads: both executors train the same bits, recorded, resumed alike
    base=(--model resnet --train-samples 256 --test-samples 100 --stages 2 -M 2 --batch 64)
    run 0 "${base[@]}" --threads 2 --epochs 1 --executor reference --checkpoint-dir ck --out ref
    run 0 "${base[@]}" --threads 2 --epochs 1 --out thr
    same_epochs ref thr "executors differ at --threads 2"
    grep -Eq '"threads": ?2' ref/runs.json || fail "runs.json lacks threads 2"
    grep -q '^field run.threads 2$' ck/async-1f1b_xpipe_adam/ckpt-000001/MANIFEST ||
      fail "the MANIFEST does not record run.threads"
    # The flag reaches the stages: oneDNN splits a convolution's weight-gradient sums by thread
    # (backend/host_conv.hpp), so one thread per stage trains other bits.
    run 0 "${base[@]}" --epochs 1 --executor reference --out one
    cut -d, -f9-12 one/runs.csv >one.txt
    cmp -s want.txt one.txt && fail "--threads 2 trained the bits of --threads 1"
    # So a resume on another thread count is refused.
    run 1 "${base[@]}" --epochs 2 --threads 1 --executor reference --checkpoint-dir ck --resume \
      --out again
    says "cannot resume .*ckpt-000001: it was run with run.threads = 2, this run has 1"
    run 2 "${tiny[@]}" --threads 2 --pin-cpus 0
    says "--pin-cpus with --threads 2: a pinned stage thread's OpenMP threads would share its one CPU"
    run 2 "${tiny[@]}" --threads 0
    says "--threads: Value 0 not in range 1 to 256"
    ;;
  *) fail "no such case" ;;
esac
echo "ok: $case"
