"""The independent check: SGLang logs of releases and runs that are not in the repo, read as the fixtures are.

    python scripts/check_sglang_releases.py WHEEL... [--seeds 1 2 3]

For each seed, scripts/make_sglang_fixtures.py prints another run of the same shape (other
request ids, prompt and output lengths, DP ranks and times) through each wheel's own code into
a scratch folder, and the release tests (tests/adapters/test_sglang_releases.py: every line
read, none quarantined, each request's outcome, roles, config and findings as the release
behaves, and the replay confirming the logs with no disagreement) run on it. Wheels:
``pip download --no-deps sglang==X``. Prints one line per seed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    args = parser.parse_args(argv)
    failed = 0
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "releases"
            made = subprocess.run([sys.executable, str(HERE / "make_sglang_fixtures.py"), "--out", str(out),
                                   "--seed", str(seed), *map(str, args.wheels)], capture_output=True, text=True)
            if made.returncode:
                print(f"seed {seed}: the fixtures could not be made\n{made.stdout}{made.stderr}")
                return 1
            env = {**os.environ, "KVFORENSICS_SGLANG_RELEASES": str(out)}
            test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   str(HERE.parent / "tests" / "adapters" / "test_sglang_releases.py"),
                                   "-k", "every_line or each_request or format_era or replay_of_each"],
                                  env=env, capture_output=True, text=True, cwd=HERE.parent)
            releases = sorted(p.name for p in out.iterdir())
            summary = test.stdout.strip().splitlines()[-1] if test.stdout.strip() else test.stderr[-400:]
            print(f"seed {seed}: releases {', '.join(releases)}: {summary}")
            if test.returncode:
                failed += 1
                print(test.stdout[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
