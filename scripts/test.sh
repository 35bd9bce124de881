#!/usr/bin/env bash
# Set up a virtual environment with the test extra, then lint, type-check and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test.sh: a virtual environment in .venv, with the test and spark extras of pyproject.toml (pip)" >&2
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test,spark]"
# Headless Chromium (Debian's package) for the report's browser tests.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Debian's chromium for the report's browser and print tests (apt-get; a few minutes)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium is not installed and cannot be here; the browser tests will be skipped" >&2
  fi
fi
# Java (Debian's package) for the Spark tests.
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Debian's openjdk-17-jre-headless for the Spark tests (apt-get; a few minutes)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "note: Java is not installed and cannot be here; the Spark tests will be skipped" >&2
  fi
fi
echo "test.sh: ruff, mypy, then the tests (pytest)" >&2
.venv/bin/ruff check forensics replay reports kvforensics tests bench
.venv/bin/mypy
# two workers (pytest-xdist): CI has 2 cores; each worker has its own session fixtures (Spark, the sample)
.venv/bin/python -m pytest -q -n 2 --durations=10
