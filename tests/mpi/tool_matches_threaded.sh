#!/usr/bin/env bash
# xpipe-train --executor mpi against the threaded executor on the same flags (--clip-norm too):
# the per-epoch loss and test accuracy of runs.csv must be the same text (the same bits, printed
# to 6 digits), and rank 0 alone must write (the files exist once, in --out). With --dp 2 (and
# --clip-norm), the loss must agree with one process within 1% (the gradient sums run in another
# order; see below and docs/results.md, "MPI"). The runs get a TMPDIR of their own, where no
# rank may leave a private folder (xpipe-train-rank-*): ctest gives each test one (a
# .../tmpdir/NAME folder, made anew here); run by hand, WORKDIR/tmp.
# Usage: tool_matches_threaded.sh XPIPE_TRAIN WORKDIR mpirun [flags...]
set -euo pipefail
train=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work"
case ${TMPDIR:-} in
  */tmpdir/*) ;;
  *) export TMPDIR=$work/tmp ;;
esac
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
common=(--train-samples 1024 --test-samples 500 --epochs 2 --batch 64 -M 2)
"$train" -K 2 "${common[@]}" --out "$work/threaded" >"$work/threaded.log" 2>&1
"$@" -np 2 "$train" --executor mpi -K 2 "${common[@]}" --out "$work/mpi" >"$work/mpi.log" 2>&1
"$@" -np 4 "$train" --executor mpi --dp 2 -K 2 --schedule gpipe --predictor latest \
  "${common[@]}" --out "$work/dp" >"$work/dp.log" 2>&1
"$train" -K 2 --schedule gpipe --predictor latest "${common[@]}" --out "$work/one" \
  >"$work/one.log" 2>&1
# Clipped with replicas: the norm of the gradient averaged over them, as one process's.
"$@" -np 4 "$train" --executor mpi --dp 2 -K 2 --schedule gpipe --predictor latest \
  "${common[@]}" --clip-norm 0.25 --out "$work/dp-clip" >"$work/dp-clip.log" 2>&1
"$train" -K 2 --schedule gpipe --predictor latest "${common[@]}" --clip-norm 0.25 \
  --out "$work/one-clip" >"$work/one-clip.log" 2>&1
# Global gradient-norm clipping: the ranks share each stage's norm of every mini-batch.
"$train" -K 2 "${common[@]}" --clip-norm 0.25 --out "$work/clip-threaded" \
  >"$work/clip-threaded.log" 2>&1
"$@" -np 2 "$train" --executor mpi -K 2 "${common[@]}" --clip-norm 0.25 --out "$work/clip-mpi" \
  >"$work/clip-mpi.log" 2>&1
# zb-auto: rank 0 profiles and sends the costs, so both ranks run one fitted order (GPipe's bits).
"$@" -np 2 "$train" --executor mpi -K 2 --schedule zb-auto --predictor latest "${common[@]}" \
  --out "$work/auto-mpi" >"$work/auto-mpi.log" 2>&1
# A CNN with BatchNorm: rank 0 evaluates with every stage's running statistics, which the other
# rank trained (shared after the run like the weights), so the test accuracy is the threaded one.
cnn=(--model resnet -K 2 --train-samples 256 --test-samples 200 --epochs 1 --batch 32 -M 2)
"$train" "${cnn[@]}" --out "$work/cnn-threaded" >"$work/cnn-threaded.log" 2>&1
"$@" -np 2 "$train" --executor mpi "${cnn[@]}" --out "$work/cnn-mpi" >"$work/cnn-mpi.log" 2>&1
# Two stages per rank: DualPipeV's 4 stages on 2 ranks (worker 1's middle stages linked in its
# own memory).
v=(-K 4 --schedule dualpipev --predictor latest --train-samples 512 --test-samples 200
  --epochs 1 --batch 64 -M 4)
"$train" "${v[@]}" --out "$work/v-threaded" >"$work/v-threaded.log" 2>&1
"$@" -np 2 "$train" --executor mpi "${v[@]}" --out "$work/v-mpi" >"$work/v-mpi.log" 2>&1
# The GPT (a row per token, sequences kept whole across the ranks' links), its test loss too.
gpt=(--model gpt -K 2 -M 2 --batch 512 --train-samples 4096 --test-samples 1024 --epochs 1)
"$train" "${gpt[@]}" --out "$work/gpt-threaded" >"$work/gpt-threaded.log" 2>&1
"$@" -np 2 "$train" --executor mpi "${gpt[@]}" --out "$work/gpt-mpi" >"$work/gpt-mpi.log" 2>&1
fields() { cut -d, -f9-11 "$1/runs.csv" | tail -n +2; }  # epoch,loss,test_accuracy
with_test_loss() { cut -d, -f9-12 "$1/runs.csv" | tail -n +2; }
echo "gpt threaded: $(with_test_loss "$work/gpt-threaded" | tr '\n' ' ')"
echo "gpt mpi:      $(with_test_loss "$work/gpt-mpi" | tr '\n' ' ')"
if [[ "$(with_test_loss "$work/gpt-threaded")" != "$(with_test_loss "$work/gpt-mpi")" ]]; then
  echo "FAIL: --executor mpi differs from threaded on the gpt"; exit 1
fi
echo "zb-auto mpi: $(fields "$work/auto-mpi" | tr '\n' ' ')"
echo "gpipe:       $(fields "$work/one" | tr '\n' ' ')"
if [[ "$(fields "$work/auto-mpi")" != "$(fields "$work/one")" ]] ||
  ! grep -q "zb-auto fitted to F/I/W ms per stage" "$work/auto-mpi.log"; then
  echo "FAIL: --schedule zb-auto under --executor mpi differs from GPipe (or fitted nothing)"; exit 1
fi
echo "threaded: $(fields "$work/threaded" | tr '\n' ' ')"
echo "mpi:      $(fields "$work/mpi" | tr '\n' ' ')"
if [[ "$(fields "$work/threaded")" != "$(fields "$work/mpi")" ]]; then
  echo "FAIL: --executor mpi differs from threaded"; exit 1
fi
echo "clipped threaded: $(fields "$work/clip-threaded" | tr '\n' ' ')"
echo "clipped mpi:      $(fields "$work/clip-mpi" | tr '\n' ' ')"
if [[ "$(fields "$work/clip-threaded")" != "$(fields "$work/clip-mpi")" ||
  "$(fields "$work/clip-threaded")" == "$(fields "$work/threaded")" ]]; then
  echo "FAIL: --clip-norm under --executor mpi differs from threaded (or clipped nothing)"; exit 1
fi
echo "resnet threaded: $(fields "$work/cnn-threaded" | tr '\n' ' ')"
echo "resnet mpi:      $(fields "$work/cnn-mpi" | tr '\n' ' ')"
if [[ "$(fields "$work/cnn-threaded")" != "$(fields "$work/cnn-mpi")" ]]; then
  echo "FAIL: --executor mpi differs from threaded on the ResNet (its BatchNorm state)"; exit 1
fi
echo "dualpipev threaded: $(fields "$work/v-threaded" | tr '\n' ' ')"
echo "dualpipev mpi:      $(fields "$work/v-mpi" | tr '\n' ' ')"
if [[ "$(fields "$work/v-threaded")" != "$(fields "$work/v-mpi")" ]]; then
  echo "FAIL: --executor mpi differs from threaded on 4 stages over 2 ranks (dualpipev)"; exit 1
fi
# dp 2 against one process: the gradient sums run in another grouping, so the bits differ and
# Adam carries the difference on (chaotically: measured 1e-3 relative in the second epoch's loss
# on an AVX2 EPYC, where oneDNN's kernels round otherwise than on AVX-512; rounding both to 3
# digits, the earlier check, failed there). 1% is far inside what a broken split gives (a replica
# that skipped the all-reduce trains on half the rows at half the batch).
loss() { cut -d, -f10 "$1/runs.csv" | tail -n +2; }
within_1pc() {
  paste -d' ' <(loss "$1") <(loss "$2") |
    awk 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (!(d <= 0.01 * $2)) bad = 1 }
         END { exit bad || NR == 0 }'
}
echo "dp 2:     $(loss "$work/dp" | tr '\n' ' ')  one process: $(loss "$work/one" | tr '\n' ' ')"
if ! within_1pc "$work/dp" "$work/one"; then
  echo "FAIL: --dp 2 loss differs from one process at the same global batch by more than 1%"
  exit 1
fi
echo "dp 2 clipped: $(loss "$work/dp-clip" | tr '\n' ' ')" \
  " one process: $(loss "$work/one-clip" | tr '\n' ' ')"
if [[ "$(loss "$work/one-clip")" == "$(loss "$work/one")" ]] ||
  ! within_1pc "$work/dp-clip" "$work/one-clip"; then
  echo "FAIL: --dp 2 --clip-norm loss differs from one process by more than 1% (or clipped nothing)"
  exit 1
fi
left=$(find "$TMPDIR" -maxdepth 1 -name 'xpipe-train-rank-*')
if [[ -n $left ]]; then
  echo "FAIL: a rank left its private output folder behind in its TMPDIR: $left"; exit 1
fi
echo "tool_matches_threaded: ok"
