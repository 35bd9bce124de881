#!/usr/bin/env bash
# Set up a virtual environment with the test extra, then lint, type-check and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test,spark]"
# Headless Chromium (Debian's package) for the report's browser tests.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium is not installed and cannot be here; the browser tests will be skipped" >&2
  fi
fi
# Java (Debian's package) for the Spark tests.
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "note: Java is not installed and cannot be here; the Spark tests will be skipped" >&2
  fi
fi
.venv/bin/ruff check forensics replay reports kvforensics tests bench
.venv/bin/mypy
.venv/bin/python -m pytest -q
