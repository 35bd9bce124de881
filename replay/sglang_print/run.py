"""A simulated run as one SGLang release's servers would have logged it, printed by that release's code.

    kvforensics simulate --out LOGS --sglang-logs DIR --sglang-version 0.5.20 [--sglang-wheel W]

From a canonical log set made by the simulator, each prefill and decode node becomes one SGLang
server of the release (TP2, Mooncake, ``--log-requests --log-requests-level 1
--enable-request-time-stats-logging``) and prints, through the release's own code
(:mod:`replay.sglang_print.servers`), what it would have printed of the node's requests:

- at start-up ``server_args``, the pool line (``max_total_num_tokens`` is the node's pool
  less its reserved page) and, where the release has it, the pool warning; uvicorn's start-up;
- on arrival the request log's receive line, on each server the run brought it to (the router
  sends a request to both; ``bootstrap_host`` names the prefill server);
- a prompt longer than the context: the tokenizer's rejection and a 400, on both servers;
- a prompt longer than the prefill admits: ``validate_input_length``'s abort on every TP rank;
  then, on a release that still hands it off, the one-token stub's prefill and transfer;
- the prefill's time stats when its transfer is done (``entry_time`` the arrival, the queue
  until the logged ``prefill_started``, the forward until the transfer's ``completed``), on
  every TP rank, and its finish line to the router;
- on decode the time stats at the finish (pre-allocation at arrival, the landing, the decode
  start, the finish), the finish line (``stop``) and uvicorn's access line with the status;
  a decode timeout is the release's ``timed out`` transfer failure and its 500; any other early
  end is an abort with the simulated reason and status;
- a batch-statistics line at each prefill start (noise), and a decode server's ``Decode batch``
  line at each of its step records (v1.1);
- ``Cache flushed successfully!`` where the run flushed a server's caches (v1.1: a ``step`` with
  ``cache: "flushed"``), on the schedulers the release prints it on.

Times are the simulated ones, at the precision each line has: whole seconds in the bracketed
prefix, microseconds in the JSON request log, milliseconds in ``entry_time`` and 10
microseconds in the durations. What SGLang's logs cannot show is not printed: pages, and a
transfer that lands after decode gave up on it.

A run the release could not have produced is refused: stubs handed off on a release that
retires a length-rejected prompt at intake (0.5.21 on) or aborts it after its one-token forward
(0.5.20: nothing sent, decode waits until its waiting timeout, which no engine of the replay
models), or such a prompt retired at intake on one that does not. Each server is printed in a
process of its own (``python -m replay.sglang_print.run``), as each is its own process in a
deployment.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.sglang_print.servers import CLOCK, Printer, aborts_after_forward, marks_bootstrap_done, retires

#: How a simulated node is served: TP size of every server (each TP rank logs its time stats).
TP_SIZE = 2
PORT = 30000


class Refused(Exception):
    """The run cannot be printed by this release (the message says why)."""


@dataclass
class Timeline:
    """One request on one server, from the simulated records: when each step happened."""

    rid: str
    arrived: float
    prompt: int
    max_new: int
    prefill_node: str
    events: dict[str, float] = field(default_factory=dict)
    tokens: int | None = None  # what the prefill computed and sent (1: the placeholder)
    status: int | None = None
    reason: str | None = None
    output: int = 0
    router_rejected: bool = False
    retractions: int = 0  # times the node's decode retracted it (its finish's, schema v1.1)


def _seconds(ts: str, epoch: dt.datetime) -> float:
    return (dt.datetime.fromisoformat(ts.replace("Z", "+00:00")) - epoch).total_seconds()


def room_of(rid: str) -> int:
    """The request's bootstrap room: the router draws one per request (63 bits); here from its id."""
    return int(hashlib.sha256(rid.encode()).hexdigest()[:15], 16)


def hosts(nodes: list[str]) -> dict[str, str]:
    """An address for each server: prefill nodes on 10.0.1.x, decode nodes on 10.0.2.x."""
    out: dict[str, str] = {}
    for role, net in (("prefill", 1), ("decode", 2)):
        mine = [n for n in nodes if n.startswith(role)]
        for k, node in enumerate(sorted(mine, key=lambda n: (len(n), n))):  # (prefill-2 before prefill-10)
            out[node] = f"10.0.{net}.{k + 1}"
    return out


def _read(logs: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(logs.glob("*.jsonl")) for line in f.read_text().splitlines() if line]


def timelines(records: list[dict[str, Any]], node: str, epoch: dt.datetime) -> list[Timeline]:
    """The requests that reach ``node`` (every request sent to it), each with its steps there."""
    received = {r["request_id"]: r for r in records if r["node"] == "router" and r.get("event") == "received"}
    rejected = {r["request_id"] for r in records if r["node"] == "router" and r.get("event") == "rejected"}
    out: dict[str, Timeline] = {}
    for rid, r in received.items():
        if node in (r.get("prefill_node"), r.get("decode_node")):
            out[rid] = Timeline(rid, _seconds(r["ts"], epoch), r["prompt_tokens"], r.get("max_new_tokens") or 0,
                                r["prefill_node"], router_rejected=rid in rejected)
    for r in records:
        t = out.get(r.get("request_id") or "")
        if r["node"] != node or t is None or r["kind"] not in ("request", "transfer"):
            continue
        name = r["event"] if r["kind"] == "request" else f"transfer_{r['event']}"
        t.events.setdefault(name, _seconds(r["ts"], epoch))
        if r["kind"] == "transfer" and r.get("tokens") is not None:
            t.tokens = r["tokens"]
        if name == "finished":
            t.status, t.reason, t.output = r.get("status"), r.get("finish_reason"), r.get("output_tokens") or 0
            t.retractions = r.get("retractions") or 0
    return sorted(out.values(), key=lambda t: (t.arrived, t.rid))


def steps(records: list[dict[str, Any]], node: str, epoch: dt.datetime) -> list[tuple[float, int]]:
    """The step records of ``node`` (a decode node's, v1.1: the simulator writes one where SGLang's
    scheduler prints its ``Decode batch`` line), each its time and running batch; a flush's not."""
    return [(_seconds(r["ts"], epoch), r["running"]) for r in records
            if r["node"] == node and r["kind"] == "step" and r.get("cache") is None]


def cache_events(records: list[dict[str, Any]], node: str, epoch: dt.datetime, cache: str) -> list[float]:
    """When ``node``'s caches were flushed (``cache`` "flushed": where SGLang's scheduler prints
    ``Cache flushed successfully!``), or its scheduler retracted running requests ("retracted":
    ``KV cache pool is full. Retract requests.``): its v1.1 ``step`` records with that ``cache``."""
    return [_seconds(r["ts"], epoch) for r in records
            if r["node"] == node and r["kind"] == "step" and r.get("cache") == cache]


def print_server(logs: Path, out: Path, wheel: Path, node: str, form: str) -> dict[str, str]:
    """Print ``node``'s log (``out/NODE.log``) through ``wheel``'s code; the line types' sources.
    Changes this process's logging and ``sys.modules``: call it in a process of its own."""
    from replay.sglang_print.release import Release
    from replay.sglang_print.servers import Lines, Server, Setup, Spec, start_clock

    records = _read(logs)
    configs = {r["node"]: r for r in records if r["kind"] == "config" and r["node"] != "router"}
    config = configs[node]
    epoch = dt.datetime.fromisoformat(config["ts"].replace("Z", "+00:00"))
    prefill = next(c for n, c in sorted(configs.items()) if c["role"] == "prefill")
    prefill_pool = (prefill["pool_pages"] - 1) * prefill["page_size"]
    setup = Setup(epoch=epoch.timestamp(), context=config["context_length"], page=config["page_size"],
                  max_req_input_len=min(config["context_length"] - 1, prefill_pool - 1) - 5,
                  model_path=f"zai-org/{config['model']}", served_model_name=config["model"])
    address = hosts(list(configs))
    # (a decode config of schema v1.1 without the overlap scheduler: the server was started so)
    flags = (("disable_overlap_schedule", True),) if config.get("overlap_schedule") is False else ()
    spec = Spec(node, config["role"], address[node], PORT, (config["pool_pages"] - 1) * config["page_size"],
                tp_size=TP_SIZE, args=flags)
    release = Release(wheel)
    start_clock(setup)
    server = Server(release, spec, setup, form, None, out=Lines())
    printer = SimulatedServer(server, address)
    printer.play(timelines(records, node, epoch), steps(records, node, epoch),
                 cache_events(records, node, epoch, "flushed"), cache_events(records, node, epoch, "retracted"))
    (out / f"{node}.log").write_text(server.out.getvalue(), encoding="utf-8")
    return server.sources


class SimulatedServer(Printer):
    """One simulated node's requests through the release's pieces."""

    def __init__(self, server: Any, address: dict[str, str]):
        super().__init__(server)
        self.address = address
        self.retires = retires(self.r)
        self.aborts = aborts_after_forward(self.r)

    def play(self, requests: list[Timeline], steps: Sequence[tuple[float, int]] = (),
             flushes: Sequence[float] = (), retractions: Sequence[float] = ()) -> None:
        """Print the requests' lines, a decode server's batch lines at its ``steps`` (each its
        time and running batch: the step records of the run), its cache flushes at theirs, and its
        retractions (one request each) at theirs."""
        CLOCK.at(0.0)
        self.startup()
        for at, running in steps:
            self._batch(at, running)
        for at in flushes:
            CLOCK.at(at)
            self.cache_flushed()
        for at in retractions:
            CLOCK.at(at)
            self.retracted()
        for t in requests:
            obj = self._obj(t.rid, t.prompt, t.max_new, room_of(t.rid), self.address[t.prefill_node])
            if t.router_rejected:
                self._context_rejection(obj, t.prompt, t.arrived)
                continue
            if not t.events:
                continue  # (the run never brought it here: decode refused it before the prefill)
            CLOCK.at(t.arrived)
            self.s.configure("")
            self.request_logger.log_received_request(obj)
            (self._prefill if self.s.role == "prefill" else self._decode)(t, obj)

    def _perf(self, seconds: float) -> float:
        return self.s.setup.perf0 + seconds

    def _batch(self, at: float, running: int = 1) -> None:
        CLOCK.at(at)
        self.s.configure(self.s.schedulers()[0])
        self._batch_line(running)

    def _prefill(self, t: Timeline, obj: Any) -> None:
        e, s = t.events, self.s
        req = self._req(t.rid, t.prompt, room_of(t.rid))
        ts = req.time_stats
        ts.prefill_bootstrap_queue_entry_time = self._perf(t.arrived)
        if hasattr(ts, "bootstrap_done_time"):
            ts.bootstrap_done_time = self._perf(t.arrived)
        aborted = None
        if "rejected" in e:  # validate_input_length, as the scheduler receives it
            CLOCK.at(e["rejected"])
            aborted = self._validate(req, s.schedulers())
            handed_off = "transfer_completed" in e
            if handed_off and self.aborts:
                raise Refused(f"{t.rid}: its length-rejected prompt was handed off, which release "
                              f"{self.r.version} never does (it runs the stub's forward, then aborts its sender "
                              "before the send); print this run with a release before 0.5.20")
            if handed_off and self.retires:
                raise Refused(f"{t.rid}: its length-rejected prompt was handed off, which release "
                              f"{self.r.version} never does (it retires such a prompt at intake); print "
                              "this run with a release before 0.5.21, or simulate --engine sglang-hardened")
            if not handed_off:
                if not self.retires and "finished" in e:
                    raise Refused(f"{t.rid}: its length-rejected prompt was retired at intake, which release "
                                  f"{self.r.version} does not do (it still sends the one-token stub)")
                self._finish(obj, t.rid, 1, 0, aborted, e.get("finished", e["rejected"]))
                return
        elif "finished" in e and "prefill_started" not in e:  # ended on prefill (e.g. its pool)
            self._finish(obj, t.rid, t.prompt, 0, self._abort_json(t.reason or "abort", t.status or 500),
                         e["finished"])
            return
        if "prefill_started" not in e or "transfer_completed" not in e:
            return  # (the run ended before the prefill did)
        self._batch(e["prefill_started"])
        ts.wait_queue_entry_time = self._perf(t.arrived)
        ts.forward_entry_time = self._perf(e["prefill_started"])
        ts.prefill_transfer_queue_entry_time = self._perf(e.get("prefill_done", e["prefill_started"]))
        ts.completion_time = self._perf(e["transfer_completed"])
        sent = len(req.origin_input_ids)
        if hasattr(ts, "transfer_total_mb"):
            ts.transfer_total_mb = sent * 0.0625
            ts.transfer_speed_gb_s = 18.4
        req.output_ids = [1]
        CLOCK.at(e["transfer_completed"])
        for prefix in s.schedulers():
            s.configure(prefix)
            self._log_time_stats(req)
        self._finish(obj, t.rid, sent, 1, aborted, e["transfer_completed"],
                     latency=e["transfer_completed"] - t.arrived)

    def _decode(self, t: Timeline, obj: Any) -> None:
        e, s = t.events, self.s
        req = self._req(t.rid, t.prompt, room_of(t.rid))
        ts = req.time_stats
        admitted = e.get("admitted", t.arrived)
        ts.decode_prealloc_queue_entry_time = self._perf(admitted)
        ts.decode_transfer_queue_entry_time = self._perf(admitted)
        if marks_bootstrap_done(self.s.r):  # (its handshake seen done as it took its pages, as a real run marks it)
            ts.bootstrap_done_time = self._perf(admitted)
        if "finished" not in e:
            return  # (the run ended first)
        end = e["finished"]
        latency = end - t.arrived
        if t.status == 200 and "decode_started" in e:
            ts.wait_queue_entry_time = self._perf(e.get("transfer_completed", e["decode_started"]))
            ts.forward_entry_time = self._perf(e["decode_started"])
            ts.completion_time = self._perf(end)
            req.output_ids = [1] * t.output
            CLOCK.at(end)
            for prefix in s.schedulers():
                s.configure(prefix)
                self._log_time_stats(req)
            self._finish(obj, t.rid, t.prompt, t.output, None, end, stop=t.reason == "stop", latency=latency,
                         retractions=t.retractions)
            return
        if t.reason == "transfer_timeout":
            CLOCK.at(end)
            self._transfer_failed(req, room_of(t.rid), s.schedulers(), "decode",
                                  reason=self._timed_out(room_of(t.rid), latency))
            self._finish(obj, t.rid, t.prompt, 0, self._abort_json(self._last_error, 500), end, latency=latency)
            return
        self._finish(obj, t.rid, t.prompt, 0, self._abort_json(t.reason or "abort", t.status or 500), end,
                     latency=latency)

    def _timed_out(self, room: int, elapsed: float) -> str:
        """The transfer's timeout reason, as the release's KV receiver words it."""
        for mod in ("sglang.srt.disaggregation.common.conn", "sglang.srt.disaggregation.mooncake.conn"):
            if self.r.has(mod) and "timed out after" in self.r.source(mod):
                self.s.note("decode_timeout", mod, "timed out after")
                render = self.r.message(mod, "timed out after")
                return str(render(bootstrap_room=room, elapsed=elapsed))
        return f"Request {room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput"

def find_wheel(version: str, wheel: Path | None = None) -> Path:
    """The wheel of SGLang ``version``: ``wheel`` if given; else one in the wheel cache
    (``$KVFORENSICS_WHEELS``, default ``~/.cache/kvforensics/wheels``), downloaded there from
    PyPI (``pip download --no-deps sglang==VERSION``) if it is not yet."""
    from forensics.adapters.sglang.eras import RELEASES

    if version not in RELEASES:
        raise Refused(f"sglang {version}: not a release the adapters read ({RELEASES[0]} to {RELEASES[-1]})")
    if wheel is not None:
        if not wheel.is_file() or not wheel.name.startswith(f"sglang-{version}-"):
            raise Refused(f"{wheel}: not a wheel of sglang {version}")
        return wheel
    cache = Path(os.environ.get("KVFORENSICS_WHEELS") or Path.home() / ".cache" / "kvforensics" / "wheels")
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    print(f"downloading sglang {version} from PyPI into {cache} (its source prints the logs) ...", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "-d", str(cache), f"sglang=={version}"], capture_output=True, text=True, check=False)
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if done.returncode or not found:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise Refused(f"sglang {version}: no wheel ({last}); download one and pass it with --sglang-wheel")
    return found[0]


def write(logs: Path, out: Path, version: str, *, wheel: Path | None = None, text: bool = True,
          gzip: bool = False, made_by: str | None = None) -> tuple[list[Path], Path]:
    """The SGLang logs of the simulated log set ``logs`` in ``out``, printed by release ``version``:
    one ``NODE.log`` per prefill and decode node (``NODE.log.gz`` with ``gzip``, as rotated logs
    are, byte for byte the same on every run), ``tenants.json`` and ``SOURCE.json`` (the release,
    its wheel's SHA-256, the source line behind each line type, and ``made_by``: what made the log set,
    by default ``simulate``). Raises :class:`Refused`."""
    try:
        import uvicorn  # noqa: F401 (its formatters print the access lines)
    except ImportError as e:
        raise Refused("printing SGLang's logs needs uvicorn: pip install 'kvforensics[sglang]'") from e
    wheel = find_wheel(version, wheel)
    records = _read(logs)
    nodes = sorted({r["node"] for r in records if r["kind"] == "config" and r["node"] != "router"})
    out.mkdir(parents=True, exist_ok=True)
    form = "text" if text else "json"
    written = [out / f"{n}.log" for n in nodes]
    try:
        return _write(logs, out, version, wheel, nodes, records, form, gzip,
                      made_by or f"kvforensics simulate --sglang-logs DIR --sglang-version {version}")
    except Refused:
        for f in (*written, *(w.with_name(w.name + ".gz") for w in written), out / "tenants.json"):
            f.unlink(missing_ok=True)  # (what this call wrote; the folder was new or empty)
        raise


def _write(logs: Path, out: Path, version: str, wheel: Path, nodes: list[str], records: list[dict[str, Any]],
           form: str, gzip: bool, made_by: str) -> tuple[list[Path], Path]:
    from replay.sglang_print.release import Release

    sources: dict[str, str] = {}
    for node in nodes:
        done = subprocess.run([sys.executable, "-m", "replay.sglang_print.run", str(logs), str(out),
                               "--wheel", str(wheel), "--node", node, "--form", form],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise Refused(f"{node}: sglang {version} could not print its log: {tail}")
        sources.update(json.loads(done.stdout))
    received = {r["request_id"]: r for r in records if r["node"] == "router" and r.get("event") == "received"}
    tenants = out / "tenants.json"
    tenants.write_text(json.dumps({rid: r["tenant_id"] for rid, r in sorted(received.items())}, indent=0) + "\n")
    files = [out / f"{n}.log" for n in nodes]
    if gzip:
        files = [_gzip(f) for f in files]
    release = Release(wheel)
    (out / "SOURCE.json").write_text(json.dumps({
        "release": release.version, "wheel": wheel.name, "sha256": release.sha256,
        "made_by": made_by, "form": form,
        "servers": {n: {"host": h, "port": PORT, "tp_size": TP_SIZE} for n, h in hosts(nodes).items()},
        "sources": dict(sorted(sources.items())),
    }, indent=2) + "\n", encoding="utf-8")
    return files, tenants


def _gzip(path: Path) -> Path:
    """``path`` compressed beside itself (no name or time in the header), the plain file gone."""
    import gzip

    target = path.with_name(path.name + ".gz")
    with path.open("rb") as src, target.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as dst:
        dst.write(src.read())
    path.unlink()
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print one simulated node's SGLang log (used by write()).")
    parser.add_argument("logs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--form", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    try:
        sources = print_server(args.logs, args.out, args.wheel, args.node, args.form)
    except Refused as e:
        print(e, file=sys.stderr)
        return 1
    print(json.dumps(sources))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
