#!/usr/bin/env bash
# Set up a virtual environment with the test extra, then lint, type-check and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/ruff check forensics replay reports kvforensics tests bench
.venv/bin/mypy
.venv/bin/python -m pytest -q
