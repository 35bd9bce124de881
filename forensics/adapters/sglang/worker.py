"""An SGLang log's lines read in a worker process while this one learns from them.

The SGLang adapter's first pass has two parts: reading each line (its prefix, and what its
format reads of it: :func:`forensics.adapters.sglang.formats.read_line`), which depends on the line alone,
and learning from it (:mod:`forensics.adapters.sglang.log`'s ``Facts``), which depends on every
line before it. The reading is about half the pass. Past the first :data:`LOCAL_LINES` lines of
a file, where the machine has a core to spare, :func:`read_ahead` hands the lines to a worker
process, :data:`BATCH_LINES` at a time and up to :data:`DEPTH` batches ahead, and takes back,
in order, what the same functions made of them. The worker runs this module's :func:`main`
(``python -c`` :data:`_BOOT`): a process of its
own, which imports nothing of the caller's (a notebook, a script without a ``__main__`` guard).

What comes back is what the first pass needs of a line: its time, flags and ranks, and what its
format read (the value), not its message: ``LogLine.msg`` is empty and ``doc`` an empty dict
where the line was a JSON object (the passes read the value, never the text again). Values
travel as :mod:`marshal` data: plain tuples, dicts, lists, strings and numbers, rebuilt as the
format's tuple; a line whose reading is anything else (a time not in UTC, an unexpected type)
comes back unread and is read here. So is every line in flight when the worker fails or
disappears: the answers are the same with or without it, line for line (tests hold them
to that on every release fixture).

The second pass (translating each line with what the whole file taught) is shared too, on
Linux: :func:`forked` computes the end of a file's kept lines in a forked copy of this process,
which has the facts and the kept readings without their being sent, while this process
translates the start (:func:`forensics.adapters.sglang.adapter._second_pass`).

``KVFORENSICS_WORKERS=0`` reads and translates every line in this process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import itertools
import json
import marshal
import os
import select
import signal
import struct
import subprocess
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import IO, Any

from forensics.adapters.base import Options, Untranslatable
from forensics.adapters.sglang.formats import FORMATS, Read, read_line
from forensics.adapters.sglang.log import LogLine

#: Lines of a file read in this process before a worker is started (a small file never starts one).
LOCAL_LINES = 20_000
#: Lines a batch holds, and batches handed to the worker ahead of their use.
BATCH_LINES = 500
DEPTH = 6
#: Batches this process reads ahead of the worker's oldest, at most (while it waits for it).
AHEAD = 8

#: The value types a line's format reads (what each format declares), by their index on the wire.
_VALUES: tuple[type, ...] = tuple(fmt.value for fmt in FORMATS)
_VALUE_INDEX = {t: i for i, t in enumerate(_VALUES)}
_HEADER = struct.Struct("<Q")
#: The ``doc`` of a line read by the worker that was a JSON object (what the passes ask of it).
_DOC: dict[str, Any] = {}


def workers() -> int:
    """Worker processes to read lines in: ``KVFORENSICS_WORKERS`` (0 or 1), else 1 where this
    process may run on more than one core."""
    if os.name != "posix":
        return 0
    given = os.environ.get("KVFORENSICS_WORKERS", "").strip()
    if given:
        return 1 if given.isdigit() and int(given) > 0 else 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return 1 if cores > 1 else 0


def forks() -> bool:
    """Whether the second pass may share its lines with a forked copy of this process: a
    worker is allowed (:func:`workers`) and the system is Linux (a fork without an exec is not
    safe everywhere: macOS's system libraries refuse it)."""
    return workers() > 0 and sys.platform.startswith("linux") and hasattr(os, "fork")


#: Items a forked child gives back per message.
FORK_BATCH = 1_000


def forked(n: int, work: Callable[[int], Any]) -> Forked:
    """``work(0)`` to ``work(n - 1)``, computed from now on in a forked copy of this process and
    given in order as they are taken; None for an item it did not give (``work`` returned None
    or raised, its value cannot travel as :mod:`marshal` data, or the child died: the caller
    computes that one itself, and every item after the child's end). ``work`` must not depend
    on anything this process changes after the call: the child sees this process as it is now.
    The child computes ahead without waiting to be read (what it has made waits in its memory),
    and runs nothing but ``work`` and the pipe: no buffered output of this process is flushed
    twice, no exit handler runs (``os._exit``). Where the fork fails, every item is None. Close
    what it returns (it is a context manager): the child is ended and waited for."""
    try:
        r, w = os.pipe()
    except OSError:
        return Forked(None, 0, n)
    try:
        with warnings.catch_warnings():  # (3.12 on: a fork with threads running; the child runs only work)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return Forked(None, 0, n)
    if pid == 0:  # (the child: it never returns)
        _child(r, w, n, work)
    os.close(w)
    return Forked(os.fdopen(r, "rb"), pid, n)


class Forked:
    """A forked child's items, in order (:func:`forked`)."""

    def __init__(self, stream: IO[bytes] | None, pid: int, n: int) -> None:
        self.n = n  # (its items)
        self._stream, self._pid, self._left = stream, pid, n
        self._items: Iterator[Any] = iter(())

    def __iter__(self) -> Forked:
        return self

    def __next__(self) -> Any:
        item = next(self._items, _END)
        if item is _END:
            if self._left <= 0:
                raise StopIteration
            self._items = iter(self._batch())
            item = next(self._items)
        return item

    def _batch(self) -> list[Any]:
        """The child's next message, or None for every item left where there is none."""
        blob = _message(self._stream) if self._stream is not None else None
        try:
            items = marshal.loads(blob) if blob is not None else None
        except (EOFError, ValueError, TypeError):
            items = None
        if not isinstance(items, list) or not 0 < len(items) <= self._left:
            items = [None] * self._left
            self.close()
        self._left -= len(items)
        return items

    def close(self) -> None:
        """The child ended (killed where it still runs) and waited for; the pipe closed."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(self._pid, 0)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_END = object()


def _child(r: int, w: int, n: int, work: Callable[[int], Any]) -> None:
    """The forked child: every item computed, each batch written as far as the pipe takes it
    and the rest once all are made."""
    try:
        os.close(r)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # (Ctrl-C ends it with its parent)
        gc.disable()  # (work makes no cycles)
        os.set_blocking(w, False)
        import fcntl  # (Linux: forks() offers none elsewhere)

        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        unsent = bytearray()
        done = False
        for start in range(0, n, FORK_BATCH):
            items: list[Any] = []
            for i in range(start, min(n, start + FORK_BATCH)):
                try:
                    items.append(work(i))
                except Exception:  # (the caller computes it again, and meets the same error)
                    items.append(None)
                    done = True
                    break
            blob = dumps(items)
            unsent += _HEADER.pack(len(blob))
            unsent += blob
            with contextlib.suppress(BlockingIOError):
                while unsent:
                    del unsent[: os.write(w, unsent)]
            if done:
                break
        os.set_blocking(w, True)
        while unsent:
            del unsent[: os.write(w, unsent)]
    except BaseException:  # (the parent gone, or anything else: its items are computed there)
        pass
    finally:
        os._exit(0)


def read_ahead(it: Iterator[tuple[int, str]], options: Options,
               read: Callable[[str], Read]) -> Iterator[tuple[int, str, Read]]:
    """The lines ``it`` gives, each with what ``read`` makes of it: in this process for the
    first :data:`LOCAL_LINES`, then shared with a worker where there is one. The batches are
    handed out in the file's order and taken back in it: :data:`DEPTH` are with the worker at a
    time, and while the oldest is not back, this process reads the next batch itself rather
    than wait (up to :data:`AHEAD` batches)."""
    for line_no, text in itertools.islice(it, LOCAL_LINES):
        yield line_no, text, read(text)
    first = next(it, None)
    if first is None:
        return
    worker = _Worker.start(options) if workers() else None
    if worker is None:
        for line_no, text in itertools.chain((first,), it):
            yield line_no, text, read(text)
        return
    batches = _batches(first, it)
    #: the batches read from the file and not yet yielded, in its order: (line numbers, texts,
    #: their readings, or None for a batch with the worker)
    pending: deque[tuple[list[int], list[str], list[Read] | None]] = deque()
    out = 0  # batches with the worker
    more = True
    try:
        while True:
            while more and out < DEPTH:  # (the worker kept busy; once it has failed, a batch at a time read here)
                batch = next(batches, None)
                if batch is None:
                    more = False
                elif worker.send(batch[1]):
                    pending.append((*batch, None))
                    out += 1
                else:
                    pending.append((*batch, [read(t) for t in batch[1]]))
                    break
            if not pending:
                return
            numbers, texts, readings = pending[0]
            if readings is None:
                if more and not worker.ready() and len(pending) - out < AHEAD:
                    batch = next(batches, None)  # (rather than wait: the next batch read here)
                    if batch is None:
                        more = False
                    else:
                        pending.append((*batch, [read(t) for t in batch[1]]))
                    continue
                back = worker.receive(len(texts))
                out -= 1
                if back is None:  # (failed: every batch it has is read here)
                    out = 0
                    pending = deque((n, t, r if r is not None else [read(x) for x in t]) for n, t, r in pending)
                    continue
                readings = [read(t) if r is None else r for t, r in zip(texts, back, strict=True)]
            pending.popleft()
            yield from zip(numbers, texts, readings, strict=True)
    finally:
        worker.close()


def _batches(first: tuple[int, str], it: Iterator[tuple[int, str]]) -> Iterator[tuple[list[int], list[str]]]:
    numbers, texts = [first[0]], [first[1]]
    for line_no, text in it:
        numbers.append(line_no)
        texts.append(text)
        if len(texts) == BATCH_LINES:
            yield numbers, texts
            numbers, texts = [], []
    if texts:
        yield numbers, texts


class _Worker:
    """The worker process, driven from this thread alone: its pipes are non-blocking, and at
    each batch what this side has to write is written as far as the pipe takes it and what the
    worker has written is read (no thread waits on another for the interpreter's lock). The
    pipes are widened to :data:`PIPE_BYTES` where the system allows, so that a few batches fit
    in them and the worker rarely waits between two of this side's turns."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.failed = self._closed = False
        self._in, self._out = proc.stdin.fileno(), proc.stdout.fileno()
        import fcntl  # (POSIX: workers() offers none elsewhere)

        for fd in (self._in, self._out):
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError, AttributeError):  # (Linux; elsewhere the default size)
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._unsent = bytearray()
        self._got = bytearray()
        self._messages: deque[bytes] = deque()

    @classmethod
    def start(cls, options: Options) -> _Worker | None:
        """The worker started, told the options a line is read with; None where it cannot start."""
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(sys.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=None if os.environ.get("KVFORENSICS_DEBUG") else subprocess.DEVNULL)
        except OSError:
            return None
        worker = cls(proc)
        worker.send({"role": options.role, "tenant_from": options.tenant_from, "year": options.year,
                     "request_ids": options.request_ids, "node": options.node})
        return worker

    def send(self, data: Any) -> bool:
        """Hand the worker a message; False where it has failed."""
        if self.failed:
            return False
        blob = marshal.dumps(data)
        self._unsent += _HEADER.pack(len(blob))
        self._unsent += blob
        self._pump()
        return not self.failed

    def ready(self) -> bool:
        """Whether the oldest batch's readings are back (or the worker has failed)."""
        self._pump()
        return self.failed or bool(self._messages)

    def receive(self, n: int) -> list[Read | None] | None:
        """The readings of the oldest batch sent (``n`` lines; None for a line to read here),
        or None where the worker failed."""
        self._pump()
        while not self._messages and not self.failed:
            select.select([self._out], [self._in] if self._unsent else [], [], 1.0)
            self._pump()
        if not self._messages:
            return None
        try:
            readings = decoded(marshal.loads(self._messages.popleft()))
        except (ValueError, EOFError, TypeError, IndexError, KeyError):
            readings = None
        if readings is None or len(readings) != n:
            self.failed = True
            return None
        return readings

    def _pump(self) -> None:
        """Write what the pipe to the worker takes; read what the worker has written."""
        try:
            while self._unsent:
                written = os.write(self._in, self._unsent)
                del self._unsent[:written]
        except BlockingIOError:
            pass
        except OSError:  # (the worker gone)
            self.failed = True
            self._unsent.clear()
        try:
            while chunk := os.read(self._out, PIPE_BYTES):
                self._got += chunk
            self.failed = True  # (the end of its output: it has exited)
        except BlockingIOError:
            pass
        except OSError:
            self.failed = True
        while len(self._got) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._got)
            if len(self._got) < _HEADER.size + size:
                break
            self._messages.append(bytes(self._got[_HEADER.size : _HEADER.size + size]))
            del self._got[: _HEADER.size + size]

    def close(self) -> None:
        """End the worker: its input closed (it exits at its end), killed where it does not exit."""
        if self._closed:
            return
        self._closed = self.failed = True
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: The worker's program: this process's module path (as multiprocessing's spawn passes it: the
#: same forensics however it was found here), then :func:`main`.
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from forensics.adapters.sglang.worker import main; main()")

#: The size asked of each pipe to and from the worker (Linux allows up to 1 MiB unprivileged).
PIPE_BYTES = 1 << 20


def _message(stream: IO[bytes]) -> bytes | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(head)
    body = stream.read(n)
    return body if len(body) == n else None


# The wire form of a batch's readings: (heads, readings). A head is what a line's prefix says
# (time, precise, undated, dp, prefixed, is a JSON object), the time as (year, month, day, hour,
# minute, second, microsecond) in UTC; the batch's lines share them (a second's lines, one
# rank's). A reading is (format, its head's index, value), the value as the format read it (no
# format: None or an access line's status), a string (the reason of an Untranslatable) or (its
# type's index, its fields); None for a line the caller reads itself.


def encoded(readings: list[Read]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...] | None]]:
    """A batch's readings in their wire form."""
    heads: dict[tuple[Any, ...], int] = {}
    out: list[tuple[Any, ...] | None] = []
    for line, k, value in readings:
        when = None if line.ts is None else wire_time(line.ts)
        if line.ts is not None and when is None:
            out.append(None)
            continue
        if k < 0:
            wire: Any = value
        elif isinstance(value, Untranslatable):
            if (wire := wire_reason(value)) is None:
                out.append(None)
                continue
        elif (index := _VALUE_INDEX.get(type(value))) is not None:
            wire = (index, tuple(value))
        else:
            out.append(None)
            continue
        head = (when, line.precise, line.undated, line.dp, line.prefixed, line.doc is not None)
        if (h := heads.get(head)) is None:
            h = heads[head] = len(heads)
        out.append((k, h, wire))
    return list(heads), out


def wire_time(ts: dt.datetime) -> tuple[int, ...] | None:
    """A time in its wire form, (year, month, day, hour, minute, second, microsecond) in UTC;
    None for one that would not come back the same (another zone, a fold)."""
    if ts.tzinfo is not dt.UTC or ts.fold:
        return None
    return ts.year, ts.month, ts.day, ts.hour, ts.minute, ts.second, ts.microsecond


def unwired_time(when: tuple[int, ...]) -> dt.datetime:
    """A time from its wire form (:func:`wire_time`)."""
    year, month, day, hour, minute, second, us = when
    return dt.datetime(year, month, day, hour, minute, second, us, dt.UTC)


def wire_reason(value: Untranslatable) -> str | None:
    """An Untranslatable in its wire form, its reason; None for one that would not come back the
    same (a subclass, or other arguments)."""
    if type(value) is not Untranslatable or len(value.args) != 1 or not isinstance(value.args[0], str):
        return None
    return value.args[0]


def dumps(items: list[Any], *head: Any) -> bytes:
    """``items`` (after ``head``, as one tuple, where given) as marshal data, each item marshal
    cannot write (a value of another type) as None: the caller computes those itself."""
    try:
        return marshal.dumps((*head, items) if head else items)
    except ValueError:
        items = [x if _writable(x) else None for x in items]
        return marshal.dumps((*head, items) if head else items)


def decoded(batch: tuple[list[tuple[Any, ...]], list[tuple[Any, ...] | None]]) -> list[Read | None]:
    """A batch's readings from their wire form (None: to be read by the caller)."""
    heads, wires = batch
    lines = []
    for when, precise, undated, dp, prefixed, doc in heads:
        ts = None if when is None else unwired_time(when)
        lines.append(LogLine(ts, precise, "", _DOC if doc else None, undated, dp, prefixed))
    out: list[Read | None] = []
    for wire in wires:
        if wire is None:
            out.append(None)
            continue
        k, h, value = wire
        if k >= 0:
            value = Untranslatable(value) if isinstance(value, str) else _VALUES[value[0]]._make(value[1])
        out.append((lines[h], k, value))
    return out


def main() -> None:
    """The worker: options, then batches of lines, from stdin; their readings to stdout."""
    gc.disable()  # (what a batch makes is freed by reference counting: no cycles)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = _message(stdin)
    if first is None:
        return
    options = Options(**marshal.loads(first))
    while (got := _message(stdin)) is not None:
        heads, readings = encoded([read_line(text, options) for text in marshal.loads(got)])
        blob = dumps(readings, heads)
        stdout.write(_HEADER.pack(len(blob)))
        stdout.write(blob)
        stdout.flush()


def _writable(reading: Any) -> bool:
    try:
        marshal.dumps(reading)
    except ValueError:
        return False
    return True

