#!/usr/bin/env bash
# The whole test suite: set up (packages, build), then every CTest test. GPU tests report
# "Skipped" on machines without a CUDA device. Extra arguments go to ctest (e.g. -L gpu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
ctest --preset release -j "$(nproc)" "$@"
