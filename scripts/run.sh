#!/usr/bin/env bash
# The main job: set up (packages, build), then the study: every schedule x predictor on the
# 784-1024-1024-1024-10 MLP over 4 stages (M = 4, 3 epochs), table on stdout, CSV, JSON, plots,
# timelines and Chrome traces in xpipe-out/. Arguments go to xpipe-train (--help lists them).
# Builds xpipe-train alone (not the tests, benchmarks and fuzzers: scripts/test.sh builds those).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh xpipe-train
exec build/tools/xpipe-train --compare "$@"
