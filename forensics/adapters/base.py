"""What every adapter shares: operator options, notes, outcomes, the line-format protocol, the
Adapter record, and the Arrow shape of the lines it hands to the validator."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from forensics.errors import BadOption, InputNotFound

#: Lines read from a file's head to recognise its format.
SNIFF_LINES = 64
#: Records (and quarantined lines) per Arrow chunk handed to the validator.
_CHUNK_ROWS = 100_000
ROLES = ("prefill", "decode", "unified")
_COMPRESSION = re.compile(r"\.(gz|zst|zstd)$", re.I)
_ROTATION = re.compile(r"\.(\d{4}-\d\d-\d\d([_T-]\d\d){0,3}|\d+)$")
_EXTENSION = re.compile(r"\.(log|txt|out|jsonl|ndjson|json)$", re.I)
#: Files inside folders offered to the sniffs: log-like names (rotated too) or no suffix at all.
_LOG_LIKE = re.compile(r"(\.(log|txt|out|jsonl|ndjson)(\.(\d{4}-\d\d-\d\d([_T-]\d\d){0,3}|\d+))?|^[^.]+)$", re.I)


@dataclass(frozen=True)
class Options:
    """What an operator tells the adapters that the engine's logs do not say."""

    node: str | None = None  # the node the files are from (default: from each file's name)
    role: str | None = None  # prefill, decode or unified (default: from the file, else unified)
    tenants: Mapping[str, str] | None = None  # request id -> tenant id (--tenant-map)
    tenant_from: str | None = None  # dotted path of a field in the logged request (--tenant-from)
    year: int | None = None  # for log timestamps written without a year
    #: how the two sides of a request are tied: ``rid`` (the request id both servers log, the
    #: client's or the router's), ``room`` (SGLang's bootstrap room, for servers that each
    #: assign their own rid: records then name the request ``room-B``), or ``auto``: ``room`` for
    #: a file whose every request id is one its server assigned (a uuid4 hex) and has a room,
    #: ``rid`` otherwise (--request-ids)
    request_ids: str = "auto"

    def node_for(self, path: Path) -> str:
        """The node a file is from: ``--node``, else its name."""
        return self.node or node_of(path)

    def __post_init__(self) -> None:
        if self.role is not None and self.role not in ROLES:
            raise BadOption(f"--role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if self.request_ids not in ("auto", "rid", "room"):
            raise BadOption(f"--request-ids must be auto, rid or room, not {self.request_ids!r}")


class Untranslatable(ValueError):
    """A line the adapter recognised as an event but cannot turn into canonical records."""


class Unreadable(Untranslatable):
    """A line that could not be read at all (too long to hold): quarantined as ``unreadable``."""


#: How a line the validator is handed marks, in its ``doc``, a verdict already reached: the
#: marker, then why. The stage SQL checks these first (forensics.ingestion.validate).
UNTRANSLATABLE_MARK = "\x01"
UNREADABLE_MARK = "\x02"


@dataclass
class Notes:
    """What an adapter wants the operator to know about a file (unknown tenants, roles)."""

    counts: dict[str, int] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, text: str, n: int = 1) -> None:
        """Count one more (or ``n``) of ``key``, whose text says what it means."""
        self.counts[key] = self.counts.get(key, 0) + n
        self.texts[key] = text

    def lines(self) -> list[str]:
        """The notes as lines for the terminal, each with its count."""
        return [text for _, _, text in self.rows()]

    def rows(self) -> list[tuple[str, int, str]]:
        """The notes as ``(key, count, text)`` rows, for the case's ``file_notes``."""
        return [(k, self.counts[k], self.texts[k].format(n=self.counts[k])) for k in sorted(self.counts)]


#: One source line's outcome: (line_no, raw, records), records a list of canonical records
#: (without ``node``/``boot``, which the adapter sets), or an :class:`Untranslatable`, or
#: ``None`` for an ignored line.
Outcome = tuple[int, str, "list[dict[str, Any]] | Untranslatable | None"]
#: The lines of a file, re-readable: each call gives ``(line_no, text)`` from the start.
Lines = Callable[[], Iterator[tuple[int, str]]]
#: The files an adapter reads along with the one it translates, found by the ingest where the
#: adapter's :class:`Beside` of that name says: each with its lines. Asked for by name, when the
#: adapter needs them (finding them reads the heads of the files around).
Companions = Callable[[str], "list[tuple[Path, Lines]]"]


def no_companions(name: str) -> list[tuple[Path, Lines]]:
    """A file read alone: no companion of any name."""
    return []


#: A place beside a file (:class:`Beside`).
Place = Literal["node", "up", "here"]


@dataclass(frozen=True)
class Beside:
    """Where the files an adapter reads along with its file lie, for the ingest to find them: the
    files that ``adapters`` read in ``places`` (by name), each place relative to the file: ``node``
    the folder named after the file's node beside it (``prefill-0.log``, ``prefill-0/``), ``up``
    the folder above the file's, its files of the node that the file's folder is named after,
    ``here`` the file's own folder. With ``one``, the file of the first place that holds exactly one."""

    places: tuple[Place, ...]
    adapters: tuple[str, ...]
    one: bool = False


class Translate(Protocol):
    """An adapter's translation: each line of a file, read with its companions, to its outcome
    (without them, the file is read alone)."""

    def __call__(self, lines: Lines, path: Path, options: Options, notes: Notes,
                 companions: Companions = no_companions, /) -> Iterator[Outcome]: ...


#: A line as an adapter splits it (its time, its message), what the adapter learns of a whole
#: file, and what a format reads of one of its lines.
LineT = TypeVar("LineT", contravariant=True)
StateT = TypeVar("StateT", contravariant=True)
ValueT = TypeVar("ValueT")


class LineFormat(Protocol[LineT, StateT, ValueT]):
    """One format of line in an engine's log, as an adapter offers it each line of a file read
    twice: the first pass ``read``s a line and ``learn``s from it what lines elsewhere in the file
    need (a prompt's length, the node's role), the second ``translate``s it with all the file taught."""

    #: text only lines of this format hold: a file with one in its first lines is the engine's
    signs: tuple[str, ...]

    def read(self, line: LineT, options: Options, /) -> ValueT | Untranslatable | None:
        """What the line says in this format; None for a line of another; why not, for a broken one."""
        ...

    def learn(self, value: ValueT, line: LineT, state: StateT, options: Options, /) -> ValueT:
        """First pass: what the line tells of the file, into ``state``; what of it the second pass reads."""
        ...

    def translate(self, value: ValueT, line: LineT, state: StateT, options: Options, notes: Notes,
                  /) -> list[dict[str, Any]]:
        """Second pass: the line's canonical records (raises :class:`Untranslatable`)."""
        ...


@dataclass(frozen=True)
class Adapter:
    """A log format: how to recognise it, and how to translate its lines."""

    name: str
    reads: str  # what it reads, one line, for --help and docs
    evidence: str  # the evidence tier its records give
    sniff: Callable[[Sequence[str]], bool]
    translate: Translate | None
    #: the files it reads along with its file, by name (what ``translate``'s companions find)
    companions: Mapping[str, Beside] = field(default_factory=dict)


def table(*adapters: Adapter) -> dict[str, Adapter]:
    """The registry: adapters by name, in sniffing order; a name given twice is refused."""
    out: dict[str, Adapter] = {}
    for adapter in adapters:
        if adapter.name in out:
            raise ValueError(f"two adapters are named {adapter.name!r}")
        out[adapter.name] = adapter
    return out


def node_of(path: Path) -> str:
    """A node name from a log file's name: ``prefill-0.log.2026-09-14_08.gz`` is ``prefill-0``."""
    name = _COMPRESSION.sub("", path.name)
    name = _ROTATION.sub("", name)
    name = _EXTENSION.sub("", name)
    return name or path.name


def log_like(path: Path) -> bool:
    """Whether a file found in a folder looks like a log by its name (READMEs do not)."""
    return _LOG_LIKE.search(_COMPRESSION.sub("", path.name)) is not None


def read_tenant_map(path: Path) -> dict[str, str]:
    """Request id -> tenant id from a CSV file with the header ``request_id,tenant_id`` or a
    JSON object; a clear error for anything else."""
    if not path.is_file():
        raise InputNotFound(f"{path}: no such tenant map")
    text = path.read_text(encoding="utf-8-sig")
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise BadOption(f"{path}: not a JSON object of request id to tenant ({exc})") from None
        if not all(isinstance(v, (str, int)) for v in data.values()):
            raise BadOption(f"{path}: tenant ids must be strings")
        return {str(k): str(v) for k, v in data.items()}
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip() for c in rows[0]] != ["request_id", "tenant_id"]:
        raise BadOption(f"{path}: a tenant map is CSV with the header request_id,tenant_id (or a JSON object)")
    out: dict[str, str] = {}
    for n, row in enumerate(rows[1:], 2):
        if not row:
            continue
        if len(row) != 2:
            raise BadOption(f"{path}:{n}: expected request_id,tenant_id")
        out[row[0].strip()] = row[1].strip()
    return out


def first_object(head: Sequence[str]) -> dict[str, Any] | None:
    """The JSON object on the first non-blank line, None if that line is not one."""
    for line in head:
        text = line.strip().lstrip("\ufeff")
        if not text:
            continue
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):  # (a JSON value nested past Python's stack)
            return None
        return doc if isinstance(doc, dict) else None
    return None


#: The Arrow schema of a chunk of lines handed to the validator: canonical lines as read, and
#: an adapter's translated records (``doc``) with the line they came from (``raw``).
LINES_SCHEMA = pa.schema(
    [("line_no", pa.int64()), ("part", pa.int16()), ("raw", pa.large_string()), ("doc", pa.large_string())]
)


def chunks(outcomes: Iterable[Outcome], node: str, on_ignored: Callable[[int], None]) -> Iterator[pa.Table]:
    """Outcomes as the validator's Arrow chunks ``(line_no, part, raw, doc)``: one row per
    record (``part`` numbering a line's records), one per untranslatable line; ignored lines
    are only counted."""
    rows: dict[str, list[Any]] = {"line_no": [], "part": [], "raw": [], "doc": []}
    ignored = 0
    for line_no, raw, result in outcomes:
        if result is None:
            ignored += 1
            continue
        if isinstance(result, Unreadable):
            docs = [UNREADABLE_MARK + str(result)]
        elif isinstance(result, Untranslatable):
            docs = [UNTRANSLATABLE_MARK + str(result)]
        else:
            docs = [json.dumps({"node": node, **r}, ensure_ascii=False, separators=(",", ":")) for r in result]
        for part, doc in enumerate(docs):
            rows["line_no"].append(line_no)
            rows["part"].append(part)
            rows["raw"].append(raw)
            rows["doc"].append(doc)
        if len(rows["raw"]) >= _CHUNK_ROWS:
            yield _table(rows, LINES_SCHEMA)
            rows = {k: [] for k in rows}
    if rows["raw"]:
        yield _table(rows, LINES_SCHEMA)
    on_ignored(ignored)


def _table(rows: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    return pa.table({**rows, "part": np.asarray(rows["part"], dtype=np.int16)}, schema=schema)
