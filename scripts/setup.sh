#!/usr/bin/env bash
# Installs the Debian packages xpipe needs (only those missing), then configures and builds the
# release preset: everything, or only the targets named as arguments (scripts/run.sh builds
# xpipe-train alone). Safe to run again: installed packages and an up-to-date build are skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  g++ make cmake            # toolchain (CMake >= 3.25: Debian 12 ships 3.25)
  catch2                    # tests (Catch2 v2)
  libbenchmark-dev          # benchmarks (Google Benchmark)
  libdnnl-dev               # host GEMM (oneDNN; found by cmake/FindOneDNN.cmake, no OpenCL headers)
  zlib1g-dev                # gzip'd IDX files
  dataset-fashion-mnist     # the data, under /usr/share/datasets/fashion-mnist
  fortunes                  # the text corpus (plain text), under /usr/share/games/fortunes
  libcli11-dev              # command-line flags of the examples and tools
  nlohmann-json3-dev        # JSON output of xpipe-train
  gnuplot-nox               # xpipe-train's accuracy plots
  clang-format              # the style.format test (Debian 12: clang-format 14)
  clang libclang-rt-14-dev  # the fuzz tests (libFuzzer, ASan, UBSan runtimes of clang 14)
  libopenmpi-dev openmpi-bin  # the MPI executor, its tests and xpipe-train --executor mpi
)

missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "xpipe setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

if [[ ! -f build/CMakeCache.txt ]]; then
  cmake --preset release
fi
if (($#)); then
  cmake --build --preset release -j "$(nproc)" --target "$@"
else
  cmake --build --preset release -j "$(nproc)"
fi
