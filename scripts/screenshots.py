"""The pictures docs/README.md shows: investigate's last screen and the report's first page, for
the shipped sample (canonical logs with page records) and for the same run as SGLang 0.5.19 printed
it (request-level evidence: the replay names the victims).

    .venv/bin/python scripts/screenshots.py [--out docs/images]

Each case runs `kvforensics investigate ... --out REPORT` as a user would (the console script, a
100-column terminal); the last screen is kept as an SVG (rich's export: text, not pixels), the
report's first page as a PNG from headless Chromium (Debian's `chromium`).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
KVF = str(Path(sys.executable).with_name("kvforensics"))
CASES = {
    "sample": [str(ROOT / "sample_logs" / "glm53-incident")],
    "sglang": [str(ROOT / "sample_logs" / "glm53-incident-sglang"),
               "--tenant-map", str(ROOT / "sample_logs" / "glm53-incident-sglang" / "tenants.json")],
}
WIDTH = 100


def last_screen(printed: str) -> str:
    """investigate's last screen: from the verdict on."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("verdict:"))
    return "\n".join(lines[start:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory(prefix="kvforensics-screens-") as work:
        for name, inputs in CASES.items():
            report = Path(work) / f"{name}.html"
            done = subprocess.run([KVF, "investigate", *inputs, "--db", f"{name}.duckdb", "--out", report.name,
                                   "--generated-at", "2026-12-05T00:00:00Z"],
                                  env=env, capture_output=True, text=True, check=True, cwd=work)
            console = Console(record=True, width=WIDTH, file=io.StringIO())
            console.print(last_screen(done.stdout), markup=False, highlight=False)
            console.save_svg(str(args.out / f"investigate-{name}.svg"),
                             title=f"kvforensics investigate ({name})")
            subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=1100,1400", f"--screenshot={args.out / f'report-{name}.png'}",
                            report.as_uri()], check=True, capture_output=True, timeout=120)
            print(f"{name}: {args.out / f'investigate-{name}.svg'}, {args.out / f'report-{name}.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
