"""The independent check: SGLang logs of releases and runs that are not in the repo, read as the fixtures are.

    python scripts/check_sglang_releases.py WHEEL... [--seeds 1 2 3]

For each seed, scripts/make_sglang_fixtures.py prints another run of the same shape (other
request ids, prompt and output lengths, DP ranks and times) through each wheel's own code into
a scratch folder, and the release tests (tests/adapters/test_sglang_releases.py: every line
read, none quarantined, each request's outcome, roles, config and findings as the release
behaves, and the replay confirming the logs with no disagreement) run on it. Wheels:
``pip download --no-deps sglang==X``. Prints one line per seed.

With ``--simulated N``, each wheel also prints N simulated runs (``kvforensics simulate
--sglang-version``: 300 requests, a fifth of the prompts over-long, a seed per run; the
engine the release really has, the placeholder up to 0.5.19 and the hardened one from 0.5.21;
0.5.20, which runs the stub's forward and then aborts it, is a behaviour no engine of the replay
models, so its simulated runs are skipped, said so), and
each is investigated twice: its canonical page logs, and the SGLang logs alone. Each run's
line says whether the replay of the SGLang logs gives the page logs' eight figures, with how
many disagreements and quarantined lines.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the release tests run on each seed's sets (by name)
TESTS = ("every_line", "each_request", "format_era", "replay_of_each", "capacity_check", "counted_back")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--seeds", nargs="*", type=int, default=[1], help="(none: only --simulated)")
    parser.add_argument("--simulated", type=int, default=0, metavar="N", help="also N simulated runs per wheel")
    args = parser.parse_args(argv)
    failed = 0
    for wheel in args.wheels:
        for seed in range(1, args.simulated + 1):
            line, ok = simulated(wheel, seed)
            print(line, flush=True)
            failed += not ok
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
                                   "-k", " or ".join(TESTS)],
                                  env=env, capture_output=True, text=True, cwd=HERE.parent)
            releases = sorted(p.name for p in out.iterdir())
            summary = test.stdout.strip().splitlines()[-1] if test.stdout.strip() else test.stderr[-400:]
            print(f"seed {seed}: releases {', '.join(releases)}: {summary}")
            if test.returncode:
                failed += 1
                print(test.stdout[-4000:])
    return 1 if failed else 0


def simulated(wheel: Path, seed: int) -> tuple[str, bool]:
    """One simulated run printed through ``wheel``: its line, and whether it was exact."""
    import json

    from replay.sglang_print.release import Release
    from replay.sglang_print.servers import aborts_after_forward

    version = wheel.name.split("-")[1]
    if aborts_after_forward(Release(wheel)):
        return (f"{version} run {seed}: skipped: the release aborts a length-rejected prompt after its forward, "
                "which no engine of the replay models"), True
    kvf = [sys.executable, "-m", "kvforensics.cli"]
    engine = "sglang-placeholder" if tuple(map(int, version.split("."))) < (0, 5, 21) else "sglang-hardened"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        made = subprocess.run([*kvf, "simulate", "--out", str(d / "logs"), "--requests", "300", "--seed", str(seed),
                               "--over-long", "0.2", "--engine", engine, "--sglang-logs", str(d / "sg"),
                               "--sglang-version", version, "--sglang-wheel", str(wheel)],
                              capture_output=True, text=True)
        if made.returncode:
            return f"{version} run {seed}: not printed: {made.stdout[-300:]}{made.stderr[-300:]}", False
        page = subprocess.run([*kvf, "investigate", str(d / "logs"), "--db", str(d / "a.duckdb"), "--json"],
                              capture_output=True, text=True)
        logs = subprocess.run([*kvf, "investigate", str(d / "sg"), "--db", str(d / "b.duckdb"), "--tenant-map",
                               str(d / "sg" / "tenants.json"), "--json"], capture_output=True, text=True)
        want, got = json.loads(page.stdout)["exposure"], json.loads(logs.stdout)
        replayed = got["replays"][0]
        quarantined = got["records"]["quarantined"]
        disagreements = replayed["disagreements"]["count"]
        ok = replayed["exposure"] == want and disagreements == 0 and quarantined == 0
        figures = ", ".join(f"{k} {v}" for k, v in want.items())
        return (f"{version} run {seed} ({engine}): {'exact' if ok else 'DIFFERENT'}; page logs: {figures}; "
                f"{disagreements} disagreements, {quarantined} quarantined"
                + ("" if ok else f"; replay: {replayed['exposure']}")), ok


if __name__ == "__main__":
    raise SystemExit(main())
