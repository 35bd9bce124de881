"""Replaying a case through the reference engine: confirmation and what-if.

The replay reads a case's configs, request events and transfer records (never its page
records), feeds each node's events to the engine in the node's logged ``(boot, seq)`` order,
writes the replayed log set (the events that still happen under the engine, with the page
records they cause, numbered afresh per node), ingests and analyses it as a case of its own.

With the engine and configuration the logs were made with, this reconstructs the pages: where
the case has page records too, the agreement is measured (allocations reproduced page for
page; exposed responses confirmed, replay-only, log-only). With another engine, pool or
context window it answers what-if. A request with no engine events in the log (rejected by
the router as logged) cannot be replayed in logged order; such requests are counted.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

import forensics
from forensics.errors import CaseError, OutputExists
from forensics.store import HeldCase, held, one, roll_back
from replay.agreement import Agreement, agreement, beside, outcomes_changed
from replay.configs import AS_CONFIGURED, WhatIf, assumptions, logged_engine, logged_engine_of, node_configs
from replay.decode_fast import blockers
from replay.drive import prefix_guesses
from replay.engine import BEHAVIOURS, Disagreement
from replay.events import node_rows, resolutions
from replay.nodes import INPUTS, Common, default_jobs, replay_nodes, spreads, start_fork_server
from replay.planning import arrival_events, plan_requests, served_table
from replay.schedule import LOGGED, Schedule
from replay.scratch import scratch
from replay.statements import statement

#: What callers import from here (the parts are the modules beside it).
__all__ = ["Agreement", "ReplayResult", "WhatIf", "default_out", "logged_engine", "logged_engine_of", "replay",
           "replay_on", "replay_schedules"]

#: What a replay folder holds; only such a folder is replaced by the next replay.
_REPLAY_FILES = {"logs", "replay.duckdb", "replay.duckdb.wal", INPUTS}


@dataclass(frozen=True)
class ReplayResult:
    """Figures of the replayed log set, and how it compares with the case's own page records."""

    engine: str
    what_if: WhatIf
    out: Path
    records: int
    exposure: dict[str, int]
    not_replayed: int  # requests that could not be placed on any node
    agreement: Agreement | None  # None where the case has no page records
    #: "confirm" (the engine the logs were made with, as configured: the logs are followed where
    #: the model disagrees) or "what-if" (another engine or configuration: the model decides)
    mode: str = "confirm"
    disagreements: tuple[Disagreement, ...] = ()  # confirm: where the model could not follow the logs
    outcomes_changed: int = 0  # requests delivered in the logs and not in the replay, or the reverse
    #: which of the step counts the evidence admits the replay took (replay.schedule.Schedule)
    schedule: Schedule = LOGGED
    #: decode-node events whose step count the evidence does not decide (times too close to a
    #: step's launch for the node's pace): where there are any, other schedules may name other victims
    ambiguous_steps: int = 0
    ambiguous_nodes: tuple[str, ...] = ()  # the decode nodes where they are
    #: what the replay took for granted that the logs do not say (:func:`assumptions`)
    assumed: tuple[str, ...] = ()
    #: decode nodes' step records (v1.1) held to the replay's steps; those that do not fit are
    #: ``step_record_differs`` disagreements
    step_records: int = 0
    #: step records not held to them: on a decode node's boot where a request decoded that the replay
    #: does not run step by step (one the router never logged, or past the replay's bounds)
    step_records_unchecked: int = 0
    #: step records that may fit: off the replay's steps by no more than its ambiguous events allow
    step_records_undecided: int = 0
    #: cache flushes (schema v1.1, SGLang's flush_cache) the replay applied: a node's pool started afresh there
    cache_flushes: int = 0
    #: confirming: (node, request) of the requests the logs show served that the replay could not give
    #: their pages on a decode node (each a disagreement) although their transfer carried fewer pages
    #: than their prompt: they read pages they did not write, possibly other requests' (the job names
    #: the requests not ruled out)
    unsupplied: tuple[tuple[str, str], ...] = ()

    def disagreement_kinds(self) -> dict[str, int]:
        """How many disagreements of each kind the replay listed, by kind in order."""
        kinds: dict[str, int] = {}
        for d in self.disagreements:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        return dict(sorted(kinds.items()))

    def as_dict(self) -> dict[str, Any]:
        """The replay as JSON-ready data."""
        return {
            "engine": self.engine,
            "mode": self.mode,
            "what_if": {k: v for k, v in dataclasses.asdict(self.what_if).items() if v is not None},
            "out": str(self.out),
            "records": self.records,
            "exposure": self.exposure,
            "not_replayed": self.not_replayed,
            "agreement": None if self.agreement is None else self.agreement.as_dict(),
            "outcomes_changed": self.outcomes_changed,
            "schedule": self.schedule.name,
            "ambiguous_steps": self.ambiguous_steps,
            "ambiguous_nodes": list(self.ambiguous_nodes),
            "assumed": list(self.assumed),
            "step_records": self.step_records,
            "step_records_unchecked": self.step_records_unchecked,
            "step_records_undecided": self.step_records_undecided,
            "cache_flushes": self.cache_flushes,
            "unsupplied_readers": len(self.unsupplied),
            "disagreements": {"count": len(self.disagreements), "by_kind": self.disagreement_kinds(),
                              "list": [d.as_dict() for d in self.disagreements]},
        }


def replay(db: Path | str | HeldCase, engine: str, out: Path | str, *, what_if: WhatIf = AS_CONFIGURED,
           schedule: Schedule = LOGGED, only: frozenset[str] | None = None, jobs: int | None = None
           ) -> ReplayResult:
    """:func:`replay_on` the case ``db``: its path, or the case a long job holds open."""
    with held(db, create=False) as case:
        return replay_on(case, engine, out, what_if=what_if, schedule=schedule, only=only, jobs=jobs)


def replay_schedules(db: Path | str | HeldCase, engine: str, outs: Sequence[tuple[Schedule, Path | str]], *,
                     only: frozenset[str], jobs: int | None = None) -> list[ReplayResult]:
    """The replays of the nodes ``only`` of the case ``db`` under ``engine`` as configured, one under
    each schedule of ``outs`` into its folder, in one pass: the requests planned and the nodes'
    records read once, every replay's chunks replayed in one pool. Each is the replay
    ``replay(db, engine, out, schedule=schedule, only=only)`` gives, the same files, byte for byte,
    and the same figures."""
    with held(db, create=False) as case:
        return _replay_on(case, engine, [(s, Path(out)) for s, out in outs], AS_CONFIGURED, only, jobs)


def replay_on(held: HeldCase, engine: str, out: Path | str, *, what_if: WhatIf = AS_CONFIGURED,
              schedule: Schedule = LOGGED, only: frozenset[str] | None = None, jobs: int | None = None
              ) -> ReplayResult:
    """Replay the case ``held`` under ``engine`` into the folder ``out`` (replaced), taking
    ``schedule``'s step count wherever a decode node's evidence admits more than one.

    With ``only``, just those engine nodes are replayed (and the nodes without an engine config,
    which pass their events through): a replay of part of the case, to compare the exposures
    there under another schedule; it is not measured against the logs nor kept in the case's
    ``replays``, as a whole replay is.

    ``jobs``: the processes that replay the nodes (default :func:`replay.nodes.default_jobs`, one
    a core); the replayed set is the same files, byte for byte, whatever it is (replay.nodes).

    Memory stays flat in the number of requests: the requests' plans and the ones the logs show
    served are tables of a scratch catalog, the case's database under the replay's memory limit
    meanwhile (spilled to disk past it: replay.scratch), each node's records are read in batches in
    the node's order, the engine holds a request only while it is in flight on the node, and the
    replayed records go to their files as they are made."""
    return _replay_on(held, engine, [(schedule, Path(out))], what_if, only, jobs)[0]


def _replay_on(held: HeldCase, engine: str, runs: list[tuple[Schedule, Path]], what_if: WhatIf,
               only: frozenset[str] | None, jobs: int | None) -> list[ReplayResult]:
    """:func:`replay_on` under each schedule of ``runs`` into its folder (several: of some nodes only)."""
    if engine not in BEHAVIOURS:
        raise CaseError(f"unknown engine {engine!r}; one of: {', '.join(BEHAVIOURS)}")
    assert len(runs) == 1 or only is not None, "a whole replay is kept in the case's replays: one at a time"
    jobs = default_jobs() if jobs is None else jobs  # (told wrong, refused before any work)
    with scratch(held.connection) as con:  # (its cursor closed, its catalog detached, at the block's end)
        configs = node_configs(con)
        assumed = assumptions(configs)
        has_pages = (one(con, statement("has_page_records")) or (0,))[0] > 0
        if not any(c.role in ("prefill", "decode") for per_node in configs.values() for _, _, _, c in per_node):
            raise CaseError(f"{held}: no prefill or decode config records, nothing to replay")
        roles = {node: per[-1][3].role for node, per in configs.items() if per}
        rows = node_rows(con)
        nodes = [node for node in sorted(set(configs) | set(rows))
                 if only is None or node in only or roles.get(node) not in ("prefill", "decode")]
        if spreads(nodes, rows, roles, jobs, len(runs)):  # (the workers import the engine while requests are planned)
            start_fork_server()
        confirming = what_if == AS_CONFIGURED and engine == (logged_engine(configs) or "sglang-placeholder")
        mode = "confirm" if confirming else "what-if"
        planned: list[Disagreement] = []
        unlogged = plan_requests(con, configs, roles, engine, what_if, mode == "confirm", planned)
        served_table(con, mode == "confirm")
        extra, not_replayed = arrival_events(unlogged, configs)
        for _, out in runs:
            _make_room(out)
        resolution = resolutions(con)
        tallies = replay_nodes(con, nodes, rows, configs, roles,
                               [(Common(engine, what_if, unlogged, mode == "confirm", schedule, resolution),
                                 out / "logs") for schedule, out in runs], extra, jobs, blockers(con))
    results = []
    for (schedule, out), tally in zip(runs, tallies, strict=True):
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        disagreements = planned + tally.disagreements
        case = out / "replay.duckdb"
        result = forensics.investigate([logs], case)
        figures = (schedule, tally.ambiguous, tuple(sorted(tally.ambiguous_nodes)),
                   assumed + prefix_guesses(tally.guesses), tally.step_records, tally.step_records_unchecked,
                   tally.step_records_undecided, tally.cache_flushes, tuple(sorted(set(tally.unsupplied))))
        if only is not None:
            results.append(ReplayResult(engine, what_if, out, tally.records, result.exposure, not_replayed, None,
                                        mode, tuple(disagreements), 0, *figures))
            continue
        with beside(held.connection, case) as both:
            agreed = agreement(both) if has_pages else None
            changed = outcomes_changed(both)
        if mode == "confirm":  # following the logs, the replay should answer as they do: say where not
            disagreements += [Disagreement(rid, "replay", "model_outcome_differs",
                                           "delivered in the logs, not in the replay" if delivered
                                           else "delivered in the replay, not in the logs")
                              for rid, delivered in changed]
        done = ReplayResult(engine, what_if, out, tally.records, result.exposure, not_replayed, agreed, mode,
                            tuple(disagreements), len(changed), *figures)
        _remember(held.connection, done)
        results.append(done)
    return results


def default_out(db: Path | str, engine: str, what_if: WhatIf) -> Path:
    """``CASE.replay-ENGINE[-pool-N][-context-N]`` beside the case."""
    db = Path(db)
    name = f"{db.stem}.replay-{engine}"
    if what_if.prefill_pool_tokens is not None:
        name += f"-pool-{what_if.prefill_pool_tokens}"
    if what_if.context_length is not None:
        name += f"-context-{what_if.context_length}"
    return db.with_name(name)


def _make_room(out: Path) -> None:
    """Clear ``out`` for the replay: an earlier replay's folder is replaced, anything else refused."""
    if out.exists():
        if not out.is_dir() or not {p.name for p in out.iterdir()} <= _REPLAY_FILES:
            raise OutputExists(f"{out}: exists and is not an earlier replay's folder; choose another --out")
        shutil.rmtree(out)


def _remember(con: duckdb.DuckDBPyConnection, result: ReplayResult) -> None:
    """Keep the replay's figures in the ``replays`` table of the case open on ``con`` (for the report)."""
    d = result.as_dict()
    what_if = json.dumps(d["what_if"], sort_keys=True)
    con.execute("BEGIN")
    try:
        con.execute(
            statement("remember_replay"),
            [result.engine, what_if, str(result.out), result.records,
             result.not_replayed, json.dumps(result.exposure),
             None if result.agreement is None else json.dumps(result.agreement.as_dict()), result.mode,
             result.outcomes_changed, len(result.disagreements), result.ambiguous_steps, json.dumps(d["assumed"]),
             result.cache_flushes],
        )
        con.execute(statement("forget_disagreements"), [result.engine, what_if])
        if result.disagreements:
            con.executemany(statement("remember_disagreement"),
                            [[result.engine, what_if, x.request_id, x.node, x.kind, x.detail]
                             for x in result.disagreements])
        con.execute("COMMIT")
    except BaseException:
        roll_back(con)  # (the case stays open after: the replay is kept whole or not at all)
        raise
