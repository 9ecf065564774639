#!/usr/bin/env bash
# Builds every gpu-labelled test, the GPU benchmark, xpipe-train (for its --device cuda run) and
# xpipe-plan (the schedules timed on the machine's many cores) for one GPU architecture and packs
# them, with the shared libraries a bare machine with only the CUDA toolkit lacks, Open MPI's
# runtime (scripts/bundle-openmpi.sh) and the Fashion-MNIST files (when found), into gpu-bundle/
# (ignored by git),
# for scripts/gpu-check.sh to run on a lent GPU machine (docs/guide.md, "Checking on a GPU"). Runs here,
# without a GPU.
#   scripts/gpu-bundle.sh [--arch 90] [--build-dir build-gpu-sm90] [--out gpu-bundle] [--compress]
#                         [--no-limit] [--data-dir DIR | --no-data]
# --data-dir: the four Fashion-MNIST .gz files (default: xpipe-train's, $XPIPE_DATA_DIR or else
# the Debian package's /usr/share/datasets/fashion-mnist); without them, or with --no-data,
# gpu-check.sh skips the xpipe-train run. The fortunes text ($XPIPE_TEXT_DIR or Debian's
# /usr/share/games/fortunes) is bundled too when found, for the gpt's run (--no-data: neither).
# The bundle must fit the device tool's 64 MiB carry limit together with the checkout: it is
# stored plain when it fits (or --compress is not given), else as bundle.tar.xz; over the limit
# even compressed, it fails.
set -euo pipefail

usage() {
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
  exit 2
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
arch=90
build=""
out="$root/gpu-bundle"
limit=1
compress=0
data_dir=${XPIPE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
text_dir=${XPIPE_TEXT_DIR:-/usr/share/games/fortunes}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --arch) [[ $# -ge 2 ]] || usage; arch=$2; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || usage; build=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || usage; out=$2; shift 2 ;;
    --no-limit) limit=0; shift ;;
    --compress) compress=1; shift ;;
    --data-dir) [[ $# -ge 2 ]] || usage; data_dir=$2; shift 2 ;;
    --no-data) data_dir=""; text_dir=""; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-bundle.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
if ! [[ "$arch" =~ ^[0-9]{2,3}[af]?$ ]]; then
  echo "gpu-bundle.sh: --arch wants a CUDA architecture number such as 80 or 90, got '$arch'" >&2
  exit 2
fi
[[ -n "$build" ]] || build="$root/build-gpu-sm$arch"
for tool in cmake ctest python3 ldd; do
  command -v "$tool" >/dev/null || { echo "gpu-bundle.sh: needs $tool" >&2; exit 1; }
done

# ---- configure and build the gpu-labelled tests' executables ---------------------------------
log="$build/gpu-bundle-configure.log"
mkdir -p "$build"
echo "gpu-bundle: configuring $build for sm_$arch"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DXPIPE_ENABLE_CUDA=ON >"$log" 2>&1; then
  echo "gpu-bundle.sh: configuring failed; what cmake could not find or said (full log: $log):" >&2
  grep -E "Could NOT find|not found|NOT FOUND|CMake Error|Could not find" "$log" | sort -u | head -20 >&2
  exit 1
fi
nvcc=$(sed -n 's/^CUDAToolkit_NVCC_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")
if [[ -z "$nvcc" || ! -f "$build/tests/cuda/CTestTestfile.cmake" ]]; then
  echo "gpu-bundle.sh: CUDA was not found (nvcc, CUDA toolkit); nothing to bundle" >&2
  exit 1
fi

# The gpu tests as CTest lists them; executables not built yet have no command in the JSON, so
# their targets are read off the CTestTestfile.cmake files (add_test(<name> "<exe>" ...)).
tests_json() { (cd "$build" && ctest -L gpu --show-only=json-v1); }
targets=$(tests_json | python3 -c '
import json, os, re, sys
build = sys.argv[1]
names = [t["name"] for t in json.load(sys.stdin)["tests"]]
exe = {}
for d, _, files in os.walk(build):
    if "CTestTestfile.cmake" in files:
        for m in re.finditer(r"add_test\(\[=\[(.*?)\]=\] \"([^\"]+)\"",
                             open(os.path.join(d, "CTestTestfile.cmake")).read()):
            exe[m.group(1)] = m.group(2)
for n in names:
    if n not in exe:
        sys.exit(f"gpu-bundle.sh: no command found for gpu test {n}")
    if not exe[n].startswith(build + "/"):
        sys.exit(f"gpu-bundle.sh: gpu test {n} runs {exe[n]}, outside the build tree: cannot bundle it")
    print(os.path.basename(exe[n]))
' "$(cd "$build" && pwd)" | sort -u)
if [[ -z "$targets" ]]; then
  echo "gpu-bundle.sh: CTest lists no gpu-labelled test in $build" >&2
  exit 1
fi
# xpipe-train, built with its --device cuda unit where CUDA is found (tools/CMakeLists.txt), and
# xpipe-plan (host only: gpu-check.sh's validate on a machine with a core per worker).
targets="$targets
xpipe-train
xpipe-plan"
echo "gpu-bundle: building $(echo "$targets" | tr '\n' ' ')"
# shellcheck disable=SC2086  # one target per word
cmake --build "$build" -j"$(nproc)" --target $targets

# ---- stage: executables, their libraries, the torch script, the manifest ---------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
tests_json | python3 -c '
import json, os, shutil, sys
build, stage = sys.argv[1], sys.argv[2]
rows = []
for t in json.load(sys.stdin)["tests"]:
    cmd, name = t.get("command"), t["name"]
    if not cmd:
        sys.exit(f"gpu-bundle.sh: gpu test {name} still has no executable after the build")
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    exe = os.path.basename(cmd[0])
    shutil.copy2(cmd[0], os.path.join(stage, "bin", exe))
    for a in cmd[1:]:
        if a.startswith(build):
            sys.exit(f"gpu-bundle.sh: gpu test {name} reads {a} from the build tree: not bundled")
    timeout = int(float(props.get("TIMEOUT", 600)))
    skip = props.get("SKIP_RETURN_CODE", 77)
    rows.append("\t".join([name, str(timeout), str(skip), "bin/" + exe] + cmd[1:]))
open(os.path.join(stage, "tests.tsv"), "w").write("\n".join(rows) + "\n")
' "$(cd "$build" && pwd)" "$stage"
# bench_gpu is a gpu test (bench.gpu, --short); gpu-check.sh also runs it in full from bin/.
[[ -x "$stage/bin/bench_gpu" ]] || { echo "gpu-bundle.sh: bench_gpu not among the gpu tests" >&2; exit 1; }
cp "$root/benchmarks/cuda/torch_step.py" "$root/benchmarks/torch_cnn.py" "$stage/"
cp "$build/tools/xpipe-train" "$build/tools/xpipe-plan" "$stage/bin/"
data_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz
  t10k-labels-idx1-ubyte.gz)
data_note="none (gpu-check.sh skips the xpipe-train run)"
if [[ -n "$data_dir" ]]; then
  have=0
  for f in "${data_files[@]}"; do [[ -f "$data_dir/$f" ]] && have=$((have + 1)); done
  if [[ $have -eq ${#data_files[@]} ]]; then
    mkdir -p "$stage/data/fashion-mnist"
    for f in "${data_files[@]}"; do cp "$data_dir/$f" "$stage/data/fashion-mnist/"; done
    data_note="Fashion-MNIST from $data_dir"
  else
    echo "gpu-bundle: note: $data_dir lacks the four Fashion-MNIST .gz files; no data bundled" \
      "(gpu-check.sh will skip the xpipe-train run)"
  fi
fi
# The gpt's corpus: the plain-text files load_text_corpus reads (not the .dat indexes, not the
# .u8 links), about 2.5 MB.
if [[ -n "$text_dir" && -d "$text_dir" ]]; then
  mkdir -p "$stage/data/fortunes"
  find "$text_dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cp {} "$stage/data/fortunes/" \;
  data_note+="; the fortunes text from $text_dir ($(ls "$stage/data/fortunes" | wc -l) files)"
else
  echo "gpu-bundle: note: no fortunes text at '${text_dir}'; gpu-check.sh will skip the gpt run"
fi

# Libraries: everything ldd resolves except what a machine with the CUDA toolkit and a driver
# has anyway: glibc's own libraries, the driver (libcuda, libnvidia-*) and the toolkit's (under
# the CUDA library folder: cudart, cuBLAS, cuBLASLt, NCCL).
cuda_root=$(readlink -f "$(dirname "$nvcc")/..")
for exe in "$stage"/bin/*; do
  if ldd "$exe" | grep -q "not found"; then
    echo "gpu-bundle.sh: $(basename "$exe") has unresolved libraries here:" >&2
    ldd "$exe" | grep "not found" >&2
    exit 1
  fi
  ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  case "$name" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*) continue ;;
    libnvidia-*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*) continue ;;
  esac
  real=$(readlink -f "$path")
  case "$real" in "$cuda_root"/*) continue ;; esac
  cp "$real" "$stage/lib/$name"  # under the soname the executables ask for
done

# Open MPI's runtime (the lent machines have none), for the runs of 2 ranks sharing the GPU
# (gpu.mpi_pipeline, xpipe-train --executor mpi): scripts/bundle-openmpi.sh, about 10 MiB.
mpi_note="none (no orterun here: gpu-check.sh skips the 2-rank runs)"
if command -v orterun >/dev/null; then
  "$root/scripts/bundle-openmpi.sh" "$stage"
  mpi_note="Open MPI $(orterun --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*' || echo '?')"
fi

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | head -1)
{
  echo "xpipe gpu bundle"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)"
  echo "commit: $commit${dirty:+ (with uncommitted changes)}"
  echo "arch: sm_$arch"
  echo "nvcc: $("$nvcc" --version | grep -o 'release [0-9.]*')"
  echo "data: $data_note"
  echo "mpi: $mpi_note"
  echo "tests (name, timeout s, skip code, command):"
  sed 's/^/  /' "$stage/tests.tsv"
  echo "files:"
  folders=(bin lib)
  [[ -d "$stage/data" ]] && folders+=(data)
  [[ -d "$stage/openmpi" ]] && folders+=(openmpi)
  (cd "$stage" && find "${folders[@]}" -type f -printf '  %p %s bytes\n' | sort)
} >"$stage/manifest.txt"

# ---- size: the carry limit is 64 MiB for the checkout and the bundle together ----------------
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
checkout=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 du -cb 2>/dev/null) | tail -1 | cut -f1)
budget=$((64 * 1048576 - ${checkout:-0}))
plain=$(du -sb "$stage" | cut -f1)
rm -rf "$out"
mkdir -p "$out"
if [[ $compress -eq 0 && ($limit -eq 0 || $plain -le $budget) ]]; then
  cp -a "$stage"/. "$out"/
  chmod 755 "$out"
  echo "gpu-bundle: $out holds $(mib "$plain") uncompressed (limit with the checkout: $(mib "$budget"))"
else
  echo "gpu-bundle: $(mib "$plain") uncompressed (limit with the checkout: $(mib "$budget"));" \
    "compressing (xz)"
  tar -C "$stage" -cJf "$out/bundle.tar.xz" .
  cp "$stage/manifest.txt" "$out/"
  packed=$(du -sb "$out" | cut -f1)
  echo "gpu-bundle: $out holds $(mib "$packed") (bundle.tar.xz; $(mib "$plain") unpacked)"
  if [[ $limit -eq 1 && $packed -gt $budget ]]; then
    echo "gpu-bundle.sh: the bundle is $(mib "$packed") compressed, over the $(mib "$budget") left" \
      "of the 64 MiB carry limit; it cannot be carried to the GPU machine" >&2
    exit 1
  fi
fi
echo "gpu-bundle: done: $out (on the GPU machine: scripts/gpu-check.sh)"
