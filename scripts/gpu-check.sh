#!/usr/bin/env bash
# The one command to run on a machine with a GPU, from the checkout root: runs every gpu-labelled
# test, the GPU benchmark (bench_gpu) and, where PyTorch is installed, its baseline
# (benchmarks/cuda/torch_step.py), and writes gpu-report.md (device, driver, CUDA, each test's
# result, each ratio, xpipe vs PyTorch samples/s). Uses gpu-bundle/ (scripts/gpu-bundle.sh, run
# on a build machine) when present, else builds from source for this GPU's architecture. Then,
# where Fashion-MNIST is at hand (the bundle's, or --data-dir), the study on the GPU:
# xpipe-train --device cuda --compare --epochs N (its table in the report, its CSV/JSON in the
# logs; N from --train-epochs, 1 by default), then the VGG and the ResNet over 4 stages. Where
# the machine has a core for each of 4 stage threads and more (8 or more cores), the schedules on
# them: xpipe-plan validate on the GPT (its 4 stages balanced within 12%, so the published bubble
# formulas apply) at K = 4, M = 8 (1F1B-flush, ZB-H1, ZB-H2, interleaved 1F1B, ZB-V, DualPipeV;
# each worker thread pinned to a core), measured against the simulator, with each worker's idle
# fraction; its traces go to the logs.
#   scripts/gpu-check.sh [--report gpu-report.md] [--logs gpu-logs | --logs gpu-logs.tar.gz]
#                        [--data-dir DIR] [--train-epochs N]
# --logs names a folder for every log, or a .tar.gz file that gets them all in one (for a tool
# that brings back only a few files).
# Exit: 0 all tests passed or skipped; 1 a test, the benchmark or the study failed, or nothing
# could be built; 2 bad arguments; 77 no GPU here (nothing run, no report written).
set -uo pipefail

usage() {
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
  exit 2
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
report="$root/gpu-report.md"
logs="$root/gpu-logs"
data_dir=""
train_epochs=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --report) [[ $# -ge 2 ]] || usage; report=$2; shift 2 ;;
    --logs) [[ $# -ge 2 ]] || usage; logs=$2; shift 2 ;;
    --data-dir)
      [[ $# -ge 2 && -d "$2" ]] || { echo "gpu-check.sh: --data-dir wants a folder" >&2; usage; }
      data_dir=$(cd "$2" && pwd); shift 2 ;;  # absolute: the study runs from a temporary folder
    --train-epochs)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]{0,2}$ ]] || {
        echo "gpu-check.sh: --train-epochs wants a whole number from 1 to 999" >&2
        usage
      }
      train_epochs=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

logs_archive=""
if [[ "$logs" == *.tar.gz || "$logs" == *.tgz ]]; then
  logs_archive=$logs
fi

# ---- is there a GPU? -------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null; then
  echo "SKIP: no GPU here (no nvidia-smi, so no NVIDIA driver); nothing run, no report written"
  exit 77
fi
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c .)
if [[ "${gpus:-0}" -eq 0 ]]; then
  echo "SKIP: no GPU here (nvidia-smi lists none); nothing run, no report written"
  exit 77
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
arch=${cap//./}
cuda_driver=$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -1 | cut -d' ' -f3)
nvcc_version=$(command -v nvcc >/dev/null && nvcc --version | grep -o 'release [0-9.]*' | cut -d' ' -f2)
[[ -z "$nvcc_version" && -x /usr/local/cuda/bin/nvcc ]] &&
  nvcc_version=$(/usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*' | cut -d' ' -f2)
echo "gpu-check: $gpus GPU(s); $gpu_name, sm_$arch, driver $driver (CUDA $cuda_driver)"

# ---- the executables: the bundle, else a build from source -----------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -n "$logs_archive" ]] && logs="$work/gpu-logs"
bundle="$root/gpu-bundle"
origin=""
if [[ -f "$bundle/bundle.tar.xz" ]]; then
  tar -C "$work" -xJf "$bundle/bundle.tar.xz" || { echo "gpu-check.sh: cannot unpack $bundle/bundle.tar.xz" >&2; exit 1; }
  bundle="$work"
  origin="gpu-bundle/bundle.tar.xz"
elif [[ -f "$bundle/tests.tsv" ]]; then
  origin="gpu-bundle/"
else
  echo "gpu-check: no gpu-bundle/; building from source for sm_$arch"
  missing=()
  for tool in cmake python3; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || missing+=("nvcc (CUDA toolkit)")
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "gpu-check.sh: cannot build from source: missing ${missing[*]}; or run scripts/gpu-bundle.sh" \
      "on a build machine and bring gpu-bundle/ here" >&2
    exit 1
  fi
  if ! "$root/scripts/gpu-bundle.sh" --arch "$arch" --build-dir "$root/build-gpu-sm$arch" \
    --out "$work/bundle" --no-limit; then
    echo "gpu-check.sh: cannot build from source here (above: what is missing); run" \
      "scripts/gpu-bundle.sh on a machine with the dependencies and bring gpu-bundle/ here" >&2
    exit 1
  fi
  bundle="$work/bundle"
  origin="built here for sm_$arch"
fi
built_arch=$(sed -n 's/^arch: sm_//p' "$bundle/manifest.txt")
built_commit=$(sed -n 's/^commit: //p' "$bundle/manifest.txt")
if [[ -n "$built_arch" && "$built_arch" != "$arch" ]]; then
  echo "gpu-check: note: the bundle was built for sm_$built_arch, this GPU is sm_$arch (runs only" \
    "where the embedded PTX can be JIT-compiled for it)"
fi
# The bundled libraries serve the bundled executables only (not python3 / PyTorch).
# The toolkit's own folders follow, for cudart/cuBLAS/NCCL where the RPATH of the build machine
# (its toolkit folder) does not exist here.
# Where the toolkit's libraries came as Python wheels (NVIDIA's nvidia-cublas, nvidia-nccl-cu13,
# ... beside PyTorch), their lib folders come last.
libs="$bundle/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && libs="$libs:$d"
done
while IFS= read -r d; do
  [[ -n "$d" ]] && libs="$libs:$d"
done < <(python3 - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for d in sorted(glob.glob(os.path.join(root, "**", "lib"), recursive=True)):
        if glob.glob(os.path.join(d, "*.so*")):
            print(d)
EOF
)
run_bundled() { LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
# Open MPI: this machine's, or the bundled runtime (scripts/bundle-openmpi.sh), relocated here;
# the 2-rank runs (gpu.mpi_pipeline, xpipe-train --executor mpi) find it as $XPIPE_MPIRUN.
mpi_origin="none: no mpirun here and none bundled"
if command -v mpirun >/dev/null; then
  export XPIPE_MPIRUN=${XPIPE_MPIRUN:-mpirun}
  mpi_origin="this machine's ($(command -v mpirun))"
elif [[ -f "$bundle/openmpi/openmpi-env.sh" ]]; then
  # shellcheck disable=SC1091  # made by bundle-openmpi.sh
  . "$bundle/openmpi/openmpi-env.sh" "$bundle"
  mpi_origin="the bundle's ($(sed -n 's/^mpi: //p' "$bundle/manifest.txt"))"
fi
chmod +x "$bundle"/bin/* 2>/dev/null  # a copy that lost its modes
# Every shared library each executable needs must resolve here; say which do not, once.
unresolved=""
for exe in "$bundle"/bin/*; do
  missing_libs=$(run_bundled ldd "$exe" 2>/dev/null | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
  if [[ -n "$missing_libs" ]]; then
    echo "gpu-check: $(basename "$exe") needs libraries not found here: $missing_libs"
    unresolved="$unresolved $(basename "$exe"): $missing_libs;"
  fi
done

# ---- the gpu tests ---------------------------------------------------------------------------
mkdir -p "$logs"
results="$work/results.tsv"
: >"$results"
# With --logs *.tar.gz the archive is rewritten after each step, so a check stopped from outside
# (a device tool's time limit, which gives no chance to clean up) leaves the logs of every step
# it finished, and the tests' results so far (results.tsv).
save_logs() {
  [[ -n "$logs_archive" ]] || return 0
  cp "$results" "$logs/results.tsv" 2>/dev/null
  mkdir -p "$(dirname "$logs_archive")" &&
    tar -C "$(dirname "$logs")" -czf "$logs_archive.part" "$(basename "$logs")" &&
    mv -f "$logs_archive.part" "$logs_archive"
}
failed=0
while IFS=$'\t' read -r -a row; do
  [[ ${#row[@]} -ge 4 ]] || continue
  name=${row[0]} timeout_s=${row[1]} skip=${row[2]}
  cmd=("$bundle/${row[3]}" "${row[@]:4}")
  start=$(date +%s.%N)
  (cd "$work" && run_bundled timeout "$timeout_s" "${cmd[@]}") >"$logs/$name.log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  if [[ $rc -eq 0 ]]; then
    verdict=pass
  elif [[ $rc -eq $skip ]]; then
    verdict=skip
  elif [[ $rc -eq 124 ]]; then
    verdict="FAIL (timed out after ${timeout_s} s)"; failed=1
  else
    verdict="FAIL (exit $rc)"; failed=1
  fi
  why=$(grep -m1 -iE '^(SKIP|FAIL)|error while loading shared libraries' "$logs/$name.log" | cut -c1-160)
  printf '%s\t%s\t%s\t%s\n' "$name" "$verdict" "$secs" "$why" >>"$results"
  printf 'gpu-check: %-32s %s (%s s)\n' "$name" "$verdict" "$secs"
  save_logs
done <"$bundle/tests.tsv"

# ---- the benchmark (full run) and PyTorch's baseline ----------------------------------------
bench_json="$work/bench.json"
# Bounded, as every step here: a benchmark that runs away must not take the lent machine's time.
(cd "$work" && run_bundled timeout 420 "$bundle/bin/bench_gpu" --gemm-detail --json "$bench_json") \
  >"$logs/bench_gpu.log" 2>&1
bench_rc=$?
echo "gpu-check: bench_gpu exit $bench_rc$([[ $bench_rc -eq 124 ]] && echo ", timed out after 420 s") (log: $logs/bench_gpu.log)"
[[ $bench_rc -eq 0 || $bench_rc -eq 77 ]] || failed=1
save_logs
# ---- the study on the GPU: xpipe-train --device cuda --compare -----------------------------
train_note=""
train_table=""
cnn_rows=""
[[ -z "$data_dir" && -d "$bundle/data/fashion-mnist" ]] && data_dir="$bundle/data/fashion-mnist"
if [[ ! -x "$bundle/bin/xpipe-train" ]]; then
  train_note="xpipe-train is not in the bundle: no study run"
elif [[ -z "$data_dir" ]]; then
  train_note="no Fashion-MNIST here (none bundled, no --data-dir): no study run"
else
  train_out="$work/train-out"
  (cd "$work" && run_bundled timeout 900 "$bundle/bin/xpipe-train" --device cuda --compare \
    --epochs "$train_epochs" --data-dir "$data_dir" --out "$train_out") \
    >"$logs/xpipe-train.log" 2>&1
  train_rc=$?
  echo "gpu-check: xpipe-train --device cuda --compare exit $train_rc (log: $logs/xpipe-train.log)"
  if [[ $train_rc -ne 0 ]]; then
    failed=1
    train_note="xpipe-train --device cuda --compare --epochs $train_epochs FAILED (exit $train_rc)"
  fi
  # The summary table: from its header line ('run ... samples/s ...') to the next blank line.
  train_table=$(awk '/^run .*samples\/s/ {on = 1} on && /^$/ {exit} on && !/^xpipe-train:/' \
    "$logs/xpipe-train.log")
  for f in runs.csv runs.json accuracy.csv loss.csv; do
    [[ -f "$train_out/$f" ]] && cp "$train_out/$f" "$logs/xpipe-train-$f"
  done
  save_logs
  # The CNNs over 4 stages (GPipe, M = 4), a run each on the first 8,192 training and 2,000
  # test images: their CUDA layers trained end to end, samples/s and test accuracy reported.
  for model in vgg resnet; do
    (cd "$work" && run_bundled timeout 300 "$bundle/bin/xpipe-train" --device cuda \
      --model "$model" -K 4 -M 4 --schedule gpipe --predictor latest --epochs "$train_epochs" \
      --train-samples 8192 --test-samples 2000 --data-dir "$data_dir" --out "$work/train-$model") \
      >"$logs/xpipe-train-$model.log" 2>&1
    model_rc=$?
    echo "gpu-check: xpipe-train --device cuda --model $model exit $model_rc" \
      "(log: $logs/xpipe-train-$model.log)"
    if [[ $model_rc -ne 0 ]]; then
      failed=1
      train_note+="${train_note:+; }xpipe-train --device cuda --model $model FAILED (exit $model_rc)"
    fi
    cnn_rows+=$(awk -v m="$model" '/samples\/s/ && /%/ && !/^run/ {print m ": " $0}' \
      "$logs/xpipe-train-$model.log")$'\n'
    save_logs
  done
  # One GPU per MPI rank: 2 ranks sharing this GPU (ZB-V: two stages per rank) against the same
  # run in one process; runs.csv's epoch, loss and test accuracy must be the same text.
  if [[ -n "${XPIPE_MPIRUN:-}" ]]; then
    v=(--device cuda -K 4 -M 4 --schedule zb-v --predictor latest --epochs 1
      --train-samples 8192 --test-samples 2000 --data-dir "$data_dir")
    (cd "$work" && run_bundled timeout 300 "$bundle/bin/xpipe-train" "${v[@]}" \
      --out "$work/train-one") >"$logs/xpipe-train-one-process.log" 2>&1
    one_rc=$?
    (cd "$work" && run_bundled timeout 300 "$XPIPE_MPIRUN" --oversubscribe --allow-run-as-root \
      -np 2 "$bundle/bin/xpipe-train" --executor mpi "${v[@]}" --out "$work/train-mpi") \
      >"$logs/xpipe-train-mpi.log" 2>&1
    mpi_rc=$?
    one=$(cut -d, -f9-11 "$work/train-one/runs.csv" 2>/dev/null | tail -n +2)
    two=$(cut -d, -f9-11 "$work/train-mpi/runs.csv" 2>/dev/null | tail -n +2)
    mpi_rows=$(awk '/samples\/s/ && /%/ && !/^run/ {print "1 process: " $0}' \
      "$logs/xpipe-train-one-process.log"; awk '/samples\/s/ && /%/ && !/^run/ {print "2 ranks:   " $0}' \
      "$logs/xpipe-train-mpi.log")
    if [[ $one_rc -eq 0 && $mpi_rc -eq 0 && -n "$one" && "$one" == "$two" ]]; then
      mpi_verdict="the same epoch, loss and test accuracy (runs.csv): $one"
    else
      failed=1
      mpi_verdict="FAILED: exit $one_rc (1 process) and $mpi_rc (2 ranks); runs.csv '$one' against '$two'"
    fi
    echo "gpu-check: xpipe-train --executor mpi on 2 ranks: $mpi_verdict"
    save_logs
  else
    mpi_verdict="not run: $mpi_origin"
  fi
fi
# The GPT over 4 stages (GPipe, M = 4) on 262,144 training and 65,536 validation tokens of the
# bundled fortunes text: its CUDA attention, embedding and LayerNorm trained end to end.
gpt_row=""
if [[ -x "$bundle/bin/xpipe-train" && -d "$bundle/data/fortunes" ]]; then
  (cd "$work" && run_bundled timeout 300 "$bundle/bin/xpipe-train" --device cuda --model gpt \
    -K 4 -M 4 --schedule gpipe --predictor latest --epochs 1 --train-samples 262144 \
    --test-samples 65536 --data-dir "$bundle/data/fortunes" --out "$work/train-gpt") \
    >"$logs/xpipe-train-gpt.log" 2>&1
  gpt_rc=$?
  echo "gpu-check: xpipe-train --device cuda --model gpt exit $gpt_rc (log: $logs/xpipe-train-gpt.log)"
  if [[ $gpt_rc -ne 0 ]]; then
    failed=1
    train_note+="${train_note:+; }xpipe-train --device cuda --model gpt FAILED (exit $gpt_rc)"
  fi
  gpt_row=$(awk '/samples\/s/ && /%/ && !/^run/ {print "gpt: " $0}' "$logs/xpipe-train-gpt.log")
  save_logs
else
  train_note+="${train_note:+; }no fortunes text in the bundle: no gpt run"
fi
# ---- the schedules on this machine's cores: xpipe-plan validate -------------------------------
validate_table=""
validate_note=""
cores=$(nproc)
if [[ ! -x "$bundle/bin/xpipe-plan" ]]; then
  validate_note="xpipe-plan is not in the bundle: no schedules timed"
elif [[ $cores -lt 8 ]]; then
  validate_note="$cores cores here, fewer than 8: the schedules are not timed (a core per stage thread, and more, is the point)"
else
  (cd "$work" && run_bundled timeout 420 "$bundle/bin/xpipe-plan" validate --model gpt --stages 4 \
    -M 8 --schedules 1f1b-flush,zb-h1,zb-h2,interleaved-1f1b,zb-v,dualpipev --mini-batches 16 \
    --repeats 3 --out "$logs/validate") >"$logs/xpipe-plan-validate.log" 2>&1
  validate_rc=$?
  echo "gpu-check: xpipe-plan validate exit $validate_rc (log: $logs/xpipe-plan-validate.log)"
  if [[ $validate_rc -ne 0 ]]; then
    failed=1
    validate_note="xpipe-plan validate FAILED (exit $validate_rc)"
  fi
  validate_table=$(grep -E '^\|' "$logs/xpipe-plan-validate.log")
  save_logs
fi
skipped=$(awk -F'\t' '$2 == "skip"' "$results" | wc -l)
torch_json="$work/torch.json"
torch_note=""
if python3 -c "import torch" >/dev/null 2>&1; then
  torch_py="$bundle/torch_step.py"
  [[ -f "$torch_py" ]] || torch_py="$root/benchmarks/cuda/torch_step.py"
  timeout 300 python3 "$torch_py" --json "$torch_json" >"$logs/torch_step.log" 2>&1
  torch_rc=$?
  echo "gpu-check: torch_step.py exit $torch_rc (log: $logs/torch_step.log)"
  [[ $torch_rc -eq 0 ]] || torch_note="torch_step.py exited $torch_rc: see torch_step.log"
else
  torch_note="PyTorch is not installed here (python3 -c 'import torch' fails): no PyTorch baseline"
fi
[[ -f "$bench_json" ]] && cp "$bench_json" "$logs/bench_gpu.json"
[[ -f "$torch_json" ]] && cp "$torch_json" "$logs/torch_step.json"

# ---- the report ------------------------------------------------------------------------------
mkdir -p "$(dirname "$report")" 2>/dev/null
{
  echo "# xpipe GPU check"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- device: $gpu_name (sm_$arch), $gpus GPU(s) visible"
  echo "- driver: $driver, CUDA (driver API) $cuda_driver, nvcc here: ${nvcc_version:-none}"
  echo "- executables: $origin, built for sm_${built_arch:-?} from commit ${built_commit:-?}"
  [[ -n "$unresolved" ]] && echo "- libraries not found here (such a test fails at load):$unresolved"
  echo "- command: scripts/gpu-check.sh (logs: ${logs_archive:-$logs})"
  echo
  echo "## gpu tests"
  echo
  echo "| test | result | seconds | first SKIP/FAIL line |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r name verdict secs why; do
    echo "| $name | $verdict | $secs | ${why//|/\\|} |"
  done <"$results"
  echo
  if [[ $skipped -gt 0 ]]; then
    echo "$skipped test(s) skipped although nvidia-smi lists a GPU: their SKIP lines above say why"
    echo "(e.g. a driver older than the CUDA runtime the executables were built with)."
    echo
  fi
  echo "## benchmarks (ratios measured in one run of bench_gpu)"
  echo
  if [[ $bench_rc -ne 0 ]]; then
    echo "bench_gpu $([[ $bench_rc -eq 77 ]] && echo "skipped" || echo "failed") (exit $bench_rc); its output:"
    echo
    echo '```'
    tail -20 "$logs/bench_gpu.log"
    echo '```'
  elif command -v python3 >/dev/null; then
    python3 - "$bench_json" "$torch_json" <<'EOF'
import json, os, sys
bench = json.load(open(sys.argv[1]))
print("| measurement | value | baseline | ratio | aim |")
print("|---|---|---|---|---|")
for r in bench["rows"]:
    if r["baseline"] > 0:
        aim = f">= {r['aim']:g}: {'met' if r['ratio'] >= r['aim'] else 'NOT met'}" if r["aim"] > 0 else "report"
        print(f"| {r['name']} | {r['value']:.4g} {r['unit']} | {r['baseline']:.4g} ({r['against']}) "
              f"| {r['ratio']:.3f} | {aim} |")
val = {r["name"]: r["value"] for r in bench["rows"]}
print()
print("## training step, K = 1, batch 128, fp32 (TF32 off): xpipe vs PyTorch (samples/s)")
print()
torch = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else None
fmt = lambda v: f"{v:,.0f}" if v else "not measured"
print("| | xpipe | PyTorch | xpipe / PyTorch |")
print("|---|---|---|---|")
# (label, bench_gpu's row, torch_step.py's key)
for label, tag, key in (("MLP, eager", "", "eager_samples_per_s"), ("MLP, CUDA graph", "", "graph_samples_per_s"),
                        ("MLP, eager, Dense layers", "dense_", "eager_samples_per_s"),
                        ("MLP, CUDA graph, Dense layers", "dense_", "graph_samples_per_s"),
                        ("ResNet, eager", "resnet_", "resnet_eager_samples_per_s"),
                        ("ResNet, CUDA graph", "resnet_", "resnet_graph_samples_per_s")):
    x = val.get("train_step_" + tag + key.removeprefix("resnet_"))
    t = torch.get(key) if torch else None
    print(f"| {label} | {fmt(x)} | {fmt(t)} | {x / t:.3f} |" if x and t else f"| {label} | {fmt(x)} | {fmt(t)} | - |")
if torch:
    print(f"\nPyTorch {torch['torch']} (Adam fused=True, TF32 off; graph: capturable Adam; the ResNet "
          "on cuDNN with cudnn.benchmark on, aim: xpipe's graph step >= PyTorch's).")
EOF
  else
    echo '```'
    cat "$logs/bench_gpu.log"
    echo '```'
  fi
  [[ -n "$torch_note" ]] && printf '\n%s\n' "$torch_note"
  echo
  echo "## the study on the GPU: xpipe-train --device cuda --compare --epochs $train_epochs"
  echo
  if [[ -n "$train_table" ]]; then
    data_label=$data_dir
    [[ "$data_dir" == "$bundle/"* ]] && data_label="the bundle's data/fashion-mnist"
    echo "Fashion-MNIST from $data_label; mlp over 4 stages, M = 4, batch 128 (stage k on" \
      "device k mod count; samples/s over each epoch's train() call, its upload included)."
    echo
    echo '```'
    echo "$train_table"
    echo '```'
  fi
  if [[ -n "${cnn_rows//$'\n'/}" ]]; then
    echo
    echo "The CNNs, --device cuda -K 4 -M 4 --schedule gpipe, 8,192 training images," \
      "$train_epochs epoch(s) each:"
    echo
    echo '```'
    printf '%s' "$cnn_rows"
    echo '```'
  fi
  if [[ -n "$gpt_row" ]]; then
    echo
    echo "The GPT, --device cuda --model gpt -K 4 -M 4 --schedule gpipe, 262,144 training and" \
      "65,536 validation tokens, 1 epoch (test = next-byte accuracy, its loss in nats/token):"
    echo
    echo '```'
    echo "$gpt_row"
    echo '```'
  fi
  [[ -n "$train_note" ]] && echo "$train_note"
  echo
  echo "One GPU per MPI rank: \`mpirun -np 2 xpipe-train --device cuda --executor mpi -K 4 -M 4" \
    "--schedule zb-v\`, 2 ranks sharing this GPU, 8,192 training images, against one process" \
    "(Open MPI: $mpi_origin): ${mpi_verdict:-not run (no study run above)}"
  if [[ -n "${mpi_rows:-}" ]]; then
    echo
    echo '```'
    echo "$mpi_rows"
    echo '```'
  fi
  echo
  echo "## the schedules on this machine's $cores cores: xpipe-plan validate"
  echo
  if [[ -n "$validate_table" ]]; then
    echo "The reference MLP over 4 stages, batch 128, 16 mini-batches, median of 3; each stage"
    echo "thread pinned to a core of its own (the V and interleaved schedules run 2 workers of 2"
    echo "stages each); idle: each worker's fraction of the run, measured (simulated)."
    echo
    echo "$validate_table"
  fi
  [[ -n "$validate_note" ]] && echo "$validate_note"
  echo
  echo "xpipe's graph row replays one captured step (Adam's bias corrections of that step);"
  echo "see benchmarks/cuda/bench_gpu.cu."
} >"$report"
if [[ -s "$report" ]]; then
  echo "gpu-check: wrote $report"
else
  echo "gpu-check: could not write the report $report (above: why)" >&2
  failed=1
fi
if [[ -n "$logs_archive" ]]; then
  mkdir -p "$(dirname "$logs_archive")"
  if tar -C "$(dirname "$logs")" -czf "$logs_archive" "$(basename "$logs")"; then
    echo "gpu-check: wrote $logs_archive"
    logs=$logs_archive
  else
    echo "gpu-check: could not write $logs_archive" >&2
    failed=1
  fi
fi
if [[ $failed -ne 0 ]]; then
  echo "gpu-check: FAILED (see the report and $logs)"
  exit 1
fi
echo "gpu-check: every gpu test passed or was skipped"
