"""Shared fixtures: tiny log sets and fresh cases."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import forensics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from typer.testing import Result

    from kvforensics.job import JobResult

sys.path.insert(0, str(Path(__file__).parent))

#: The tests replay every decode node the compiled kernel covers through it, whatever the node's size
#: (replay/decode_fast.py; a replay of an operator's case does so from 4,096 records on): each test's
#: expectations hold for it, and tests/replay/test_decode_kernel.py holds it to the Python's replay.
os.environ.setdefault("KVFORENSICS_DECODE_KERNEL", "always")


def pytest_configure(config: pytest.Config) -> None:
    """The kernel compiled (where nothing is cached yet) once, here, before pytest-xdist starts its
    workers, which then load it: not in each worker at once."""
    if not hasattr(config, "workerinput"):
        from replay import decode_fast

        decode_fast.load_kernel()

#: The spec's examples, when ../shared is beside the checkout (it is in CI).
SHARED = Path(__file__).resolve().parents[2] / "shared"
SPEC_EXAMPLES = SHARED / "spec" / "examples"
#: The project's own copy of the spec examples, so the suite means something without ../shared.
FIXTURES = Path(__file__).parent / "fixtures"
#: The spec's placeholder example (one exposure), and the shipped sample incident.
PLACEHOLDER = FIXTURES / "examples" / "placeholder" / "events.jsonl"
SAMPLE = Path(__file__).resolve().parents[1] / "sample_logs" / "glm53-incident"
#: The page that shows the command investigating the SGLang sample (the README's last command).
ADAPTERS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return path


def example_dirs() -> list[Path]:
    """Example log sets: ../shared's when present, the project's fixtures always."""
    dirs = sorted(p for p in (FIXTURES / "examples").iterdir() if p.is_dir())
    if SPEC_EXAMPLES.is_dir():
        dirs += sorted(p for p in SPEC_EXAMPLES.iterdir() if p.is_dir())
    return dirs


@pytest.fixture
def case_path(tmp_path: Path) -> Path:
    return tmp_path / "case.duckdb"


@pytest.fixture(scope="session")
def _investigated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """The case of a log set, investigated the first time it is asked for in a session: never
    handed to a test (each gets a copy), so that no test sees another's changes."""
    made: dict[Path, Path] = {}

    def case_of(logs: Path) -> Path:
        if logs not in made:
            db = tmp_path_factory.mktemp("case") / "case.duckdb"
            forensics.investigate([logs], db)
            assert not db.with_name(db.name + ".wal").exists()  # (closed whole: the file is the case)
            made[logs] = db
        return made[logs]

    return case_of


@pytest.fixture
def sample_case(_investigated: Callable[[Path], Path], tmp_path: Path) -> Path:
    """``forensics.investigate([SAMPLE], tmp_path / "case.duckdb")``, run once a session."""
    return Path(shutil.copy(_investigated(SAMPLE), tmp_path / "case.duckdb"))


@pytest.fixture
def placeholder_case(_investigated: Callable[[Path], Path], tmp_path: Path) -> Path:
    """``forensics.investigate([PLACEHOLDER], tmp_path / "case.duckdb")``, run once a session."""
    return Path(shutil.copy(_investigated(PLACEHOLDER), tmp_path / "case.duckdb"))


@dataclass(frozen=True)
class CommandRun:
    """A ``kvforensics`` command run as written: its argv, the folder it ran from, what it printed
    and the whole job it ran (kvforensics.job.run's result, as the command had it)."""

    argv: list[str]
    folder: Path
    result: Result
    job: JobResult


@pytest.fixture(scope="session")
def adapters_page_run(tmp_path_factory: pytest.TempPathFactory) -> CommandRun:
    """docs/adapters.md's command (the whole job on sample_logs/glm53-incident-sglang, its tenant
    map read, the report written), run once a session as written, from a folder where
    ``sample_logs/`` is the checkout's: its case and report are in ``folder``, never changed."""
    (block,) = re.findall(r"```sh\n(.*?)```", ADAPTERS_PAGE.read_text(), re.S)
    folder = tmp_path_factory.mktemp("adapters-page")
    (folder / "sample_logs").symlink_to(SAMPLE.parent)
    return invoked(shlex.split(block.replace("\\\n", " ")), folder, env={"COLUMNS": "100"})


def invoked(argv: list[str], folder: Path, env: dict[str, str] | None = None) -> CommandRun:
    """``argv`` (``kvforensics investigate ... --out ...``) run through the CLI from ``folder``, to
    its end: what it printed, and the whole job it ran, kept."""
    from typer.testing import CliRunner

    import kvforensics.job
    from kvforensics.cli import app

    jobs: list[JobResult] = []
    real = kvforensics.job.run

    def run(*args: Any, **kwargs: Any) -> JobResult:
        jobs.append(real(*args, **kwargs))
        return jobs[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(kvforensics.job, "run", run)  # (watched, not replaced: the command runs it)
        result = CliRunner().invoke(app, argv[1:], env=env)
    assert result.exit_code == 0, result.output
    (job,) = jobs
    return CommandRun(argv, folder, result, job)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One Spark session in local mode (two cores, two shuffle partitions) for every Spark test:
    its JVM starts, and warms to its first job, once a session."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
    if shutil.which("java") is None:
        pytest.skip("no Java here (Debian: openjdk-17-jre-headless)")
    from forensics.spark import spark_session

    session = spark_session("local[2]", partitions=2)
    yield session
    session.stop()


@contextmanager
def unreadable(*paths: Path) -> Iterator[None]:
    """``paths`` (files or folders) that the system will not open or list. As root, where
    permissions stop nothing, the system's refusal is made where the toolkit asks for them."""
    if os.geteuid() != 0:
        for p in paths:
            p.chmod(0)
        try:
            yield
        finally:
            for p in paths:
                p.chmod(0o755)
        return
    denied = {os.path.abspath(p) for p in paths}
    real_open, real_scandir = os.open, os.scandir

    def check(path: Any) -> None:
        if isinstance(path, int):  # (a descriptor: opened already)
            return
        if os.path.abspath(os.fsdecode(path)) in denied:
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))

    def opened(path: Any, *args: Any, **kwargs: Any) -> int:
        check(path)
        return real_open(path, *args, **kwargs)

    def listed(path: Any = ".") -> Any:
        check(path)
        return real_scandir(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "open", opened)
        patch.setattr(os, "scandir", listed)
        yield


#: A line the whole job writes to stderr as each phase ends, where stderr is not a terminal.
PHASE_LINE = re.compile(r"^[a-z][\w ,()-]*: [\d,]+\.\d s$")


def said(stderr: str | list[str]) -> list[str]:
    """What a command said on stderr besides its progress: the lines that are not a phase's
    (each of which is checked to be one: a phase's name and its time)."""
    lines = stderr.strip().splitlines() if isinstance(stderr, str) else stderr
    phases = [x for x in lines if PHASE_LINE.match(x) and not x.startswith("kvforensics:")]
    return [x for x in lines if x not in phases]
