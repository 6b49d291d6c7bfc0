#!/usr/bin/env bash
# The main job: for now, the AMLA paper's accuracy sweep (Base vs AMLA vs fp64 golden).
set -euo pipefail
cd "$(dirname "$0")/.."
exec build/bin/mlaserve-bench accuracy "$@"
