#!/usr/bin/env bash
# Set up a virtual environment and run the main job on the shipped sample incident.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
mkdir -p out
rm -rf out/sample-case.duckdb out/sample-case.replay-*
.venv/bin/kvforensics investigate sample_logs/glm53-incident/ --db out/sample-case.duckdb \
  --out out/sample-report.html "$@"
