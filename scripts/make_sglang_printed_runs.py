"""Runs of the independent generator as SGLang releases print them: fixtures for the whole chain
(the SGLang adapter, then the replay) on lines that SGLang's own code printed, from runs that share
no code with ``replay/`` (tests/independent_logs.py).

    python scripts/make_sglang_printed_runs.py WHEEL... [--out tests/adapters/printed]

For each run of :data:`RUNS` whose release is among the wheels (``pip download --no-deps
sglang==X``): the generator makes the canonical log set (its seed, requests and layout, page
records and all), and ``replay.sglang_print`` prints it through the wheel's code as that release's
servers log (each server in a process of its own, text form, gzipped) into ``OUT/<run>/``, with
``RUN.json`` (what the generator was asked), ``SOURCE.json`` (the release, its wheel's SHA-256, the
source line behind each line type) and ``tenants.json``. The same bytes on every run. Needs
uvicorn (``pip install -e '.[sglang]'``), not torch.

tests/replay/test_cache_flush.py (the flush runs) and tests/replay/test_certainty.py (the retraction
runs) make each run's canonical log set again and hold what the printed logs give to its page records.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from replay.sglang_print.release import Release
from replay.sglang_print.run import write

ROOT = Path(__file__).resolve().parents[1]

#: Each run: the release that prints it, the generator's seed and requests, its layout. In the flush
#: runs every node's caches are flushed halfway (``flush``); 0.5.11 prints ``Cache flushed
#: successfully!`` on every scheduler, 0.5.19 on each DP rank's first only. Both hand a
#: length-rejected prompt off (the generator's placeholder runs: from 0.5.21 no release does, and the
#: printer refuses them). tests/replay/test_cache_flush.py reads the flush runs,
#: tests/replay/test_certainty.py the retraction runs.
RUNS: dict[str, tuple[str, int, int, dict[str, Any]]] = {
    "0.5.11-flush-step-records": ("0.5.11", 3, 160, {"flush": True, "step_log": 40}),
    "0.5.19-flush-prefix-cache": ("0.5.19", 11, 160, {"flush": True, "prefix_cache": True}),
    # each decode node retracts a request at its 1,500th step (its finish's meta_info says so:
    # total_retractions to 0.5.11, num_retractions from 0.5.12)
    "0.5.11-retract": ("0.5.11", 14, 200, {"retract": True}),
    "0.5.19-retract-step-records": ("0.5.19", 12, 200, {"retract": True, "step_log": 40}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "adapters" / "printed")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))  # (the generator is the tests' own module, not the package's)
    from independent_logs import Layout, generate

    wheels = {Release(w).version: w for w in args.wheels}
    for name, (version, seed, requests, layout) in RUNS.items():
        if version not in wheels:
            print(f"{name}: no wheel of sglang {version} given, left as it is")
            continue
        folder = args.out / name
        shutil.rmtree(folder, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tmp:
            logs = generate(Path(tmp) / "logs", seed=seed, requests=requests, layout=Layout(**layout))
            write(logs, folder, version, wheel=wheels[version], gzip=True,
                  made_by=f"scripts/make_sglang_printed_runs.py (run {name}) through sglang {version}'s code")
        (folder / "RUN.json").write_text(json.dumps({
            "made_by": "scripts/make_sglang_printed_runs.py", "generator": "tests/independent_logs.py",
            "release": version, "seed": seed, "requests": requests, "layout": layout}, indent=2) + "\n")
        print(f"{name}: {', '.join(sorted(p.name for p in folder.iterdir()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
