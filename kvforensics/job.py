"""The whole job behind ``kvforensics investigate ... --out report.html``: ingest and analyse,
replay to confirm and ask what-if where the evidence allows, fill in the replay-backed tiers
where page records are missing, and write the report. The one module that drives
``forensics``, ``replay`` and ``reports`` together.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from forensics.adapters import Options
from forensics.case import Case
from forensics.errors import BadValue
from forensics.exposure.tiers import (
    Filled,
    LostRecords,
    certainty,
    fill_from_replay,
    filled_nodes,
    lost_records,
    missing_page_records,
    tier_figures,
    unseen_late_writes,
)
from forensics.ingestion import Progress
from forensics.ingestion.readers import Limits
from forensics.investigation import Investigation, Phase, investigate, untold
from forensics.store import HeldCase, connect, one
from kvforensics.story import Story, tell
from replay.configs import logged_engine, node_configs
from replay.replay import ReplayResult, WhatIf, default_out, replay, replay_schedules
from replay.schedule import ALTERNATIVES
from reports.render import ReportResult, check_outputs, report

#: Replays run by the whole job: the engine the incident ran (confirmation) and the fix (what-if);
#: where the logs were made by the fixed engine, the confirmation is under it and the what-if the bug.
JOB_REPLAYS = ("sglang-placeholder", "sglang-hardened")


def job_replays(con: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """The confirmation engine (the one the logs were made with) and the what-if engine, of the
    case open on ``con``."""
    confirm = logged_engine(node_configs(con)) or JOB_REPLAYS[0]
    return confirm, next(e for e in JOB_REPLAYS if e != confirm)


@dataclass(frozen=True)
class JobResult:
    """What the whole job did: the investigation, its replays, what they filled in, the report."""

    investigation: Investigation
    replays: tuple[ReplayResult, ...] = ()
    report: ReportResult | None = None
    replay_skipped: str | None = None
    filled: Filled | None = None  # nodes and windows without page records, filled by replay
    #: the eight figures by the evidence they rest on (forensics.exposure.tiers.SUMMARY_TIERS)
    tiers: dict[str, dict[str, int | None]] | None = None
    without_page_records: tuple[str, ...] = ()  # engine nodes that logged requests but no page records
    #: transfers the prefill sent and the decode gave up on, where that decode logged no page
    #: records: a late write there is in no log, so no replay's figure includes what it overwrote
    #: (finding handoff.sent_but_not_received)
    unseen_late_writes: int = 0
    #: victim requests and affected tenants, certain and possible (forensics.exposure.tiers.certainty)
    certainty: dict[str, dict[str, int]] | None = None
    #: what records lost (a seq gap, a log cut short or not given) leave unknown, and the readers and
    #: requests still in flight where the logs end (forensics.exposure.tiers.LostRecords)
    lost_records: LostRecords = LostRecords()
    story: Story | None = None  # the last screen's story, where asked for (``run(..., story=True)``)

    def as_dict(self) -> dict[str, Any]:
        """The whole job as JSON-ready data (what ``investigate --out --json`` prints)."""
        out = self.investigation.as_dict()
        out["replays"] = [r.as_dict() for r in self.replays]
        if self.replay_skipped:
            out["replay_skipped"] = self.replay_skipped
        if self.filled is not None:
            out["filled_by_replay"] = self.filled.as_dict()
        if self.tiers is not None:
            out["tiers"] = self.tiers
            out["certainty"] = self.certainty
        out["nodes_without_page_records"] = list(self.without_page_records)
        out["unseen_late_writes"] = self.unseen_late_writes
        out["lost_records"] = self.lost_records.as_dict()
        if self.report is not None:
            out["report"] = self.report.as_dict()
        return out


def check_what_if(db: Path | str, what_if: WhatIf) -> None:
    """Refuse, before any replay, a what-if prefill pool that holds no page on a prefill node of
    the case (each pool needs a page besides page 0, which is reserved)."""
    if what_if.prefill_pool_tokens is None:
        return
    con = connect(db, read_only=True, create=False)
    try:
        row = one(con, "SELECT max(page_size) FROM configs WHERE role = 'prefill'")
    finally:
        con.close()
    page = row[0] if row else None
    if page is not None and what_if.prefill_pool_tokens < page:
        raise BadValue(f"--prefill-pool-tokens {what_if.prefill_pool_tokens} holds no page of the case's prefill "
                       f"nodes ({page} tokens a page); give at least {page}")


def replayable(con: duckdb.DuckDBPyConnection) -> str | None:
    """Why the case open on ``con`` cannot be replayed, or None when it can (engine configs and
    requests)."""
    row = one(con, "SELECT (SELECT count(*) FROM configs WHERE role IN ('prefill', 'decode')), "
                   "(SELECT count(*) FROM request_events WHERE event = 'received')")
    assert row is not None
    if not row[0]:
        return "no prefill or decode config records"
    if not row[1]:
        return "no received request records"
    return None


def run(
    paths: Sequence[Path | str],
    db: Path | str,
    out: Path | str | None,
    *,
    audience: str = "internal",
    pseudonymize_key: str | None = None,
    generated_at: str | None = None,
    with_replay: bool = True,
    progress: Progress | None = None,
    format: str | None = None,
    options: Options | None = None,
    limits: Limits | None = None,
    phase: Phase | None = None,
    story: bool = False,
) -> JobResult:
    """Ingest and analyse ``paths`` into ``db``; where page records are missing (engine nodes
    without them, seq gaps), replay to confirm and fill in the replay-backed tiers; with ``out``,
    also the what-if replay and the report. The figures come per evidence tier. ``phase``: told of
    each phase as it runs (ingest, analysis, each replay, the other schedules, the report);
    ``story``: the last screen's story told too (:func:`kvforensics.story.tell`). The case is
    opened once, for writing, and every step works on it open, the story's reading too."""
    told = phase or untold
    if out is not None:
        check_outputs(Path(out), audience)  # refused before hours of work, not after
    with HeldCase(db) as case:  # (opened once, by the ingest; every step takes it in place of the path)
        found = investigate(paths, case, progress=progress, format=format, options=options, limits=limits,
                            phase=phase)
        if found.ingest.empty:  # nothing to replay or report: the empty input is the answer
            return JobResult(found, replay_skipped="no records")
        con = case.connection
        replays: tuple[ReplayResult, ...] = ()
        filled = None
        skipped = None if with_replay else "not asked (--no-replay)"
        missing, gaps = _evidence_gaps(con)
        wanted = with_replay and (out is not None or missing or gaps)
        if wanted:
            skipped = replayable(con)
        if wanted and skipped is None:
            confirm, what_if = job_replays(con)
            # without a report, only the replay the figures need
            engines = (confirm, what_if) if out is not None else (confirm,)
            done = []
            for engine in engines:
                with told(f"replay under {engine}"):
                    done.append(replay(case, engine, default_out(db, engine, WhatIf())))
            replays = tuple(done)
            filled = _fill(case, replays[0], told)
        written = None
        if out is not None:
            with told("report and its lists"):
                written = report(case, out, audience=audience, pseudonymize_key=pseudonymize_key,
                                 generated_at=generated_at)
        tiers = tier_figures(con)
        unseen = unseen_late_writes(con)
        victims = certainty(con)
        result = JobResult(found, replays, written, skipped, filled, tiers, tuple(missing), unseen, victims,
                           lost_records(con))
        return replace(result, story=tell(result, Path(db), Case.on(con, read_only=True))) if story else result


def _fill(case: HeldCase, confirmed: ReplayResult, told: Phase = untold) -> Filled:
    """Fill in the replay-backed tiers from the confirming replay; where it met decode events the
    evidence places at more than one step, replay again under each other schedule the evidence
    allows (replay.schedule.ALTERNATIVES), so that each victim is certain (named under all of them)
    or possible. Only the decode nodes with such events are replayed again (every other node
    replays alike under each schedule), and of them only those the fill takes rows from (without
    page records, or with seq gaps: elsewhere page records name the victims) whose replay followed
    their logs: on a node whose replay did not, every victim is possible whatever the schedule, and
    every request whose data its readers' pages may have held is named already
    (sql/not_ruled_out.sql), so another schedule could name no more. The other replays are kept only
    while they are compared."""
    alternatives: list[tuple[str, Path]] = []
    disagreeing, retracted = _disagreeing(confirmed)
    # (the other nodes replay the same under every schedule; a disagreeing node's are all possible)
    varied = (frozenset(confirmed.ambiguous_nodes) & frozenset(filled_nodes(case.connection))) - frozenset(disagreeing)
    with tempfile.TemporaryDirectory(prefix="kvforensics-schedules-") as folder:
        if varied:
            nodes = f"{len(varied):,} decode node{'' if len(varied) == 1 else 's'}"
            with told(f"the other schedules the logs allow ({len(ALTERNATIVES)}, on {nodes})"):
                others = replay_schedules(case, confirmed.engine, [(s, Path(folder) / s.name) for s in ALTERNATIVES],
                                          only=varied)
                alternatives = [(s.name, other.out / "replay.duckdb") for s, other in zip(ALTERNATIVES, others,
                                                                                          strict=True)]
        return fill_from_replay(case, confirmed.out / "replay.duckdb", alternatives, disagreeing, sorted(varied),
                                retracted, confirmed.unsupplied)


def _disagreeing(confirmed: ReplayResult) -> tuple[list[str], list[tuple[str, str]]]:
    """The nodes whose replay did not follow their logs everywhere, each of whose victims is
    possible; and, where a node's only disagreements are its decode's retractions (which the replay
    does not model: until the first of them the node did what the replay did), the requests it
    retracted, ``(node, request)``, and ``(node, "")`` where its scheduler logged retractions: the
    readers there that took their pages before the first keep their certainty
    (forensics.exposure.tiers.fill_from_replay_on). A retracted request the replayed set has no
    decode start of makes its node's every victim possible."""
    kinds: dict[str, set[str]] = {}
    for d in confirmed.disagreements:
        kinds.setdefault(d.node, set()).add(d.kind)
    retracting = {node for node, k in kinds.items() if k == {"decode_retracted"}}
    wanted = sorted({(d.node, d.request_id) for d in confirmed.disagreements if d.node in retracting})
    if wanted:
        con = connect(confirmed.out / "replay.duckdb", read_only=True, create=False)
        try:
            con.register("retracted", pa.table({"node": [n for n, _ in wanted], "request_id": [r for _, r in wanted]}))
            started = set(con.execute("SELECT DISTINCT r.node, r.request_id FROM records r JOIN retracted "
                                      "USING (node, request_id) WHERE r.kind = 'request' "
                                      "AND r.event = 'decode_started' AND r.seq IS NOT NULL").fetchall())
        finally:
            con.close()
        retracting -= {node for node, rid in wanted if rid and (node, rid) not in started}  # (no start to place it by)
    disagreeing = sorted(node for node in kinds if node not in retracting)
    return disagreeing, [(node, rid) for node, rid in wanted if node in retracting]


def _evidence_gaps(con: duckdb.DuckDBPyConnection) -> tuple[tuple[str, ...], int]:
    """Engine nodes without page records, and seq gaps on nodes with them."""
    missing = missing_page_records(con)
    row = one(con, "SELECT count(*) FROM seq_gaps WHERE node IN (SELECT node FROM kv_ops)")
    return missing, int(row[0]) if row else 0
