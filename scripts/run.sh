#!/usr/bin/env bash
# The main job: set up (packages, build), then train. Arguments go to the trainer (--help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
exec build/examples/train_sequential "$@"
