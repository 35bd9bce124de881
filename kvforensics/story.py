"""The last screen of ``investigate``: the verdict in one sentence (exposed or not, on what
evidence), the figures by evidence tier, the findings by severity with their counts, and the next
commands that apply to the case, naming its own ids.

A victim the replay names under only some of the schedules the logs allow is *possible*
(forensics.exposure.tiers.certainty): the verdict says so, and never counts one as certain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

import forensics
from forensics.exposure import tiers
from forensics.exposure.tiers import (
    PAGE_EVIDENCE,
    REQUEST_REPLAY,
    SUMMARY_TIERS,
    TOTAL,
    TRANSFER_REPLAY,
    LostRecords,
)
from forensics.findings import SEVERITIES, Finding
from forensics.ids import dp_pools
from forensics.text import shown
from kvforensics import render

#: The tiers an exposure can rest on, strongest first (the total is their union).
_EVIDENCE = (PAGE_EVIDENCE, TRANSFER_REPLAY, REQUEST_REPLAY)
EVERY_NODE_LOGGED_PAGES = "(evidence: page records, on every engine node that logged requests)"


@dataclass(frozen=True)
class Story:
    """What the last screen says, as data: the verdict, the figures by tier (a tier's figure None
    where it does not measure it), notes on the evidence, the findings, the next commands."""

    verdict: str
    figures: dict[str, dict[str, int | None]]  # tier -> figure -> value; one tier where page records cover all
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    next_commands: list[list[str]] = field(default_factory=list)


def verdict(found: Any, findings: list[Finding]) -> str:
    """The verdict on the whole job ``found`` (a :class:`kvforensics.job.JobResult`) in one sentence."""
    tiers = found.tiers or {TOTAL: found.investigation.exposure, PAGE_EVIDENCE: found.investigation.exposure}
    total = tiers[TOTAL]
    exposed = int(total.get("exposed_responses") or 0)
    missing = list(found.without_page_records)
    certainty = found.certainty or {
        "victim_requests": {"certain": int(total.get("victim_requests") or 0), "possible": 0},
        "affected_tenants": {"certain": int(total.get("affected_tenants") or 0), "possible": 0}}
    victims, tenants = certainty["victim_requests"], certainty["affected_tenants"]
    on = [t for t in _EVIDENCE if (tiers.get(t) or {}).get("exposed_responses")]
    critical = sum(1 for f in findings if f.severity == "critical")
    but = f"; but {render.plural(critical, 'critical finding')} stand{'s' if critical == 1 else ''} (below)" \
        if critical else ""
    nodes = ", ".join(shown(n) for n in missing)
    not_replayed = bool(missing) and found.filled is None
    unmeasured = (f"; {nodes} logged no page records and {'was' if len(missing) == 1 else 'were'} not replayed "
                  f"({found.replay_skipped or 'no replay'}): what {'it' if len(missing) == 1 else 'they'} "
                  "served is not counted") if not_replayed else ""
    gaps: LostRecords = getattr(found, "lost_records", LostRecords())  # (a job's; none told: none)
    lost = f"; {lost_records_said(gaps, short=True)}" if gaps.any else ""
    if exposed and victims["certain"]:
        read = "read other requests' KV pages" if not victims["possible"] else \
            "read, or may have read, other requests' KV pages"
        return (f"Exposed: {render.plural(exposed, 'delivered response')} {read}: {_victims(victims, tenants)}, "
                f"on {' and '.join(on) or PAGE_EVIDENCE}{unmeasured}{lost}.")
    if exposed:
        return (f"Possibly exposed: {render.plural(exposed, 'delivered response')} may have read other requests' KV "
                f"pages: {_victims(victims, tenants)} (named by the replay on only some of the schedules the "
                f"logs allow, where records are missing, or where it could not follow the logs), on "
                f"{' and '.join(on) or PAGE_EVIDENCE}{unmeasured}{lost}.")
    readers = found.filled.possible_readers if found.filled is not None else 0
    if readers:  # (their victims past the budget: no row names them, and nothing may say "not exposed")
        their, them = ("its", "it") if readers == 1 else ("their", "them")
        return (f"Possibly exposed: {render.plural(readers, 'delivered response')} read pages {their} transfer did "
                f"not write, on {nodes or 'nodes without page records'}, where the replay could not follow the logs "
                f"and names no victim of {them}: whose data those pages held the evidence does not say "
                f"({found.filled.not_ruled_out:,} (reader, request) pairs not ruled out, too many to list)"
                f"{unmeasured}{lost}{but}.")
    if gaps.any:  # (nothing may say "not exposed" where what they read is in no record)
        return (f"Not known: {lost_records_said(gaps, short=True)}; the records elsewhere show no delivered "
                f"response reading another request's KV pages{unmeasured}{but}.")
    if not_replayed:
        return (f"Not known: {nodes} logged no page records and {'was' if len(missing) == 1 else 'were'} not "
                f"replayed ({found.replay_skipped or 'no replay'}), so what {'it' if len(missing) == 1 else 'they'} "
                f"served is not measured; page records elsewhere show no exposed response{but}.")
    if missing:
        return (f"Not exposed on the evidence: {nodes} logged no page records, and the confirming replay of "
                f"their request and transfer records names no delivered response that read another request's "
                f"KV pages{but}.")
    return (f"Not exposed: page records on every engine node that logged requests show no delivered response "
            f"reading another request's KV pages{but}.")


def _victims(victims: dict[str, int], tenants: dict[str, int]) -> str:
    """``329 victim requests of 12 tenants, all certain``, or each count split into certain and
    possible (never a possible one counted as certain)."""
    v, t = victims["certain"] + victims["possible"], tenants["certain"] + tenants["possible"]
    both = f"{render.plural(v, 'victim request')} of {render.plural(t, 'tenant')}"
    if not victims["possible"] and not tenants["possible"]:
        return f"{both}, all certain"
    if not victims["certain"] and not tenants["certain"]:
        return f"{both}, all possible (none certain)"
    return (f"{render.plural(v, 'victim request')} ({victims['certain']:,} certain, {victims['possible']:,} possible) "
            f"of {render.plural(t, 'tenant')} ({tenants['certain']:,} certain, {tenants['possible']:,} possible)")


def _notes(found: Any) -> list[str]:
    """What the figures rest on, the replays and what they filled in."""
    notes: list[str] = []
    missing = found.without_page_records
    tiers = found.tiers or {}
    replay_backed = any(any((tiers.get(t) or {}).values()) for t in (TRANSFER_REPLAY, REQUEST_REPLAY))
    if not missing and not replay_backed:
        notes.append(EVERY_NODE_LOGGED_PAGES)
    else:
        if missing:
            rest = ("their exposures come from the confirming replay (the replay-backed columns)" if found.filled
                    else f"not replayed ({found.replay_skipped}): the figures rest on the page records elsewhere only")
            notes.append(f"page records missing on {', '.join(shown(m) for m in missing)}: {rest}")
        notes.append("(- : not measured by that evidence; total: the union of every tier)")
    if found.certainty and (replay_backed or found.certainty["victim_requests"]["possible"]):
        v, t = found.certainty["victim_requests"], found.certainty["affected_tenants"]
        pairs = found.certainty.get("exposure_pairs") or {"certain": 0, "possible": 0}
        notes.append(f"victims: {v['certain']:,} certain, {v['possible']:,} possible; tenants: {t['certain']:,} "
                     f"certain, {t['possible']:,} possible; (reader, victim) pairs: {pairs['certain']:,} certain, "
                     f"{pairs['possible']:,} possible (certain: named by page records, or by the replay under "
                     "every schedule the logs allow)")
    for r in found.replays:
        agreement = ""
        if r.agreement:
            a = r.agreement.exposed_responses
            agreement = f"; {a.confirmed:,} confirmed, {a.replay_only:,} replay only, {a.log_only:,} log only"
        checked = (f"{render.plural(len(r.disagreements), 'disagreement')} with the logs" if r.mode == "confirm"
                   else f"what-if, {r.outcomes_changed:,} logged outcomes changed")
        notes.append(f"replay under {r.engine}: {r.exposure['exposed_responses']:,} exposed responses{agreement} "
                     f"({checked})")
        if r.mode == "confirm":
            notes.extend(disagreements_said(r))
        if r.mode == "confirm" and (steps := step_records_said(r)):
            notes.append(steps)
        if flushes := flushes_said(r):
            notes.append(flushes)
    if found.unseen_late_writes:
        notes.append(f"{found.unseen_late_writes:,} transfer(s) sent by prefill and given up by a decode node without "
                     "page records: a late write there is in no log, and no replay figure includes what it "
                     "overwrote (finding handoff.sent_but_not_received)")
    filled = found.filled
    if filled and filled.gap_windows:
        notes.append(f"page records missing in {filled.gap_windows:,} seq-gap windows: filled by replay where the "
                     "node's request records survive, "
                     f"{filled.exposed_responses:,} exposed responses in all (table replay_exposures); a victim the "
                     "page records name across a seq gap is possible (certainty_note 'records missing')")
    gaps: LostRecords = getattr(found, "lost_records", LostRecords())
    if gaps.any:
        notes.append(lost_records_said(gaps) + " (each request named: kvforensics not-known)")
    if gaps.unstarted:
        notes.append(unstarted_said(gaps.unstarted) + " (each named: kvforensics not-known)")
    if filled and filled.possible_readers:
        notes.append(possible_readers_said(filled.possible_readers))
    if filled and filled.not_ruled_out:
        notes.append(not_ruled_out_said(filled.not_ruled_out, filled.not_ruled_out_listed))
    if found.replay_skipped:
        notes.append(f"replay skipped: {found.replay_skipped}")
    return notes


def not_ruled_out_said(pairs: int, listed: bool) -> str:
    """What the evidence leaves undecided where a node's pages are not the replay's (after decode
    retractions; on a node whose replay did not follow its logs): the (reader, request) pairs it
    does not rule out."""
    where = "where a node's pages are not the replay's (decode retractions, or logs it could not follow)"
    if listed:
        return (f"{where}: {pairs:,} (reader, request) pairs not ruled out by the evidence, each a possible victim "
                "(certainty_note 'not ruled out')")
    return (f"{where}: {pairs:,} (reader, request) pairs not ruled out by the evidence, past "
            f"{tiers.NOT_RULED_OUT_PAIRS:,}: not listed; the victims named there are possible and others there may "
            "be missed")


def lost_records_said(lost: LostRecords, *, short: bool = False) -> str:
    """What records lost leave unknown (tiers.LostRecords): requests whose decode records are missing
    (what they read is in no record; where no node logged their finish, neither is whether they were
    delivered), reads of pages never written in the records that remain after a seq gap, and readers
    on such nodes with no finish anywhere; and the readers of other requests' pages elsewhere with no
    finish in the logs (in flight where they end)."""
    parts = []
    if lost.requests:
        they = "it" if lost.requests == 1 else "they"
        where = ", ".join(shown(n) for n in lost.nodes)
        known = (f"({lost.delivered:,} delivered by the router's records, {lost.no_finish:,} with no finish on any "
                 "node)")
        parts.append(f"{render.plural(lost.requests, 'request')} decoded on {where} with no record of it left: what "
                     f"{they} read is not known {known}" if short else
                     f"{render.plural(lost.requests, 'request')} that other nodes' records place on {where} "
                     f"{'has' if lost.requests == 1 else 'have'} no decode_started there: what {they} read is not "
                     f"known {known}, and {they} may be victims the records no longer show")
    if lost.blind_readers:
        parts.append(f"{render.plural(lost.blind_readers, 'request')} read pages never written in the records that "
                     "remain after a seq gap: they may hold what a lost record wrote")
    if lost.unfinished_readers:
        parts.append(f"{render.plural(lost.unfinished_readers, 'request')} that read there "
                     f"{'has' if lost.unfinished_readers == 1 else 'have'} no finish on any node: not counted as "
                     "delivered, though a lost record may have been the finish")
    said = "; ".join(parts)
    out = []
    if parts:
        out.append(f"records are missing: {said}" if short else
                   "records are missing (a seq gap, a node's log cut short or not given; finding evidence.seq_gap "
                   f"where a gap shows): {said}")
    if lost.in_flight_readers:
        n = lost.in_flight_readers
        out.append(f"{render.plural(n, 'request')} that read other requests' KV pages {'has' if n == 1 else 'have'} "
                   "no finish in the logs (in flight when they end, or the finish not logged): counted as contained, "
                   f"not delivered, {'it' if n == 1 else 'they'} may have been delivered after")
    return "; ".join(out)


def unstarted_said(requests: int) -> str:
    """The requests placed on a decode node that had not started there where the logs end
    (tiers.LostRecords.unstarted)."""
    return (f"{render.plural(requests, 'request')} placed on a decode node (by a transfer or the router) "
            f"{'has' if requests == 1 else 'have'} no decode_started there and no finish in any log: not started "
            "where the logs end, or records lost at a log's very end; what they went on to read is after the logs")


def possible_readers_said(readers: int) -> str:
    """The delivered responses that read pages they did not write where the replay could not follow
    the logs, and that it names no victim of."""
    one = readers == 1
    return (f"{render.plural(readers, 'delivered response')} read pages {'its' if one else 'their'} transfer did not "
            f"write where the replay could not follow the logs, and it names no victim of {'it' if one else 'them'} "
            f"(it gave {'it' if one else 'them'} no pages, or pages that held nothing in it): possibly exposed, every "
            "request whose data may have been in the node's pool then a possible victim (certainty_note 'not ruled "
            "out')")


def disagreements_said(r: Any) -> list[str]:
    """Each kind of disagreement a confirming replay listed, with how many and what it means
    (replay.engine.meaning): an operator reads why victims there are only possible."""
    from replay.engine import meaning

    return [f"  {kind} ({n:,}): {meaning(kind)}" for kind, n in r.disagreement_kinds().items()]


def flushes_said(r: Any) -> str | None:
    """The cache flushes a replay applied (schema v1.1, SGLang's ``flush_cache``), None where none."""
    if not r.cache_flushes:
        return None
    flushes = render.plural(r.cache_flushes, "cache flush", "cache flushes")
    return (f"{flushes} read (SGLang's flush_cache, on an idle node): the node's pool started afresh there, its "
            "decode step count from 0")


def step_records_said(r: Any) -> str | None:
    """What a confirming replay made of the decode nodes' step records (the engine's own step log),
    None where the case has none."""
    listed = sum(d.kind == "step_record_differs" for d in r.disagreements)
    if not (r.step_records or r.step_records_undecided or r.step_records_unchecked or listed):
        return None
    parts = [f"{r.step_records:,} fit the replay's steps"]
    if r.step_records_undecided:
        parts.append(f"{r.step_records_undecided:,} may (off by no more than the events whose step the times leave "
                     "undecided allow)")
    if listed:
        parts.append(f"{listed:,} do not (step_record_differs: that node's victims are only possible)")
    if r.step_records_unchecked:
        parts.append(f"{r.step_records_unchecked:,} not checked (a request decoded there that the replay does not "
                     "run step by step)")
    return "decode step records (the engine's own step log): " + "; ".join(parts)


def _figures(found: Any) -> dict[str, dict[str, int | None]]:
    """The figures by tier where the replay fills in (or page records are missing), else the page records'."""
    tiers, missing = found.tiers, found.without_page_records
    replay_backed = bool(tiers) and any(any((tiers[t] or {}).values()) for t in SUMMARY_TIERS[1:-1])
    if tiers and (missing or replay_backed):
        return {t: dict(tiers[t]) for t in SUMMARY_TIERS}
    return {PAGE_EVIDENCE: dict(found.investigation.exposure)}


def _next_commands(db: Path, case: forensics.Case, findings: list[Finding], report: Path | None) -> list[list[str]]:
    """The commands worth running next on this case, each naming ids it has and printing rows."""
    where = ["--db", str(db)]
    out: list[list[str]] = []
    exposed = case.exposures(delivered_only=True)
    if exposed.height:
        certain = exposed.filter(pl.col("certainty") == "certain")
        row = (certain if certain.height else exposed).row(0, named=True)
        out.append(["kvforensics", "exposures", *where, "--request", row["reader_request"]])
        out.append(["kvforensics", "request", row["reader_request"], *where])
        if str(row["evidence"]).startswith(PAGE_EVIDENCE) and row["pages"]:
            page = str(row["pages"]).split(",")[0].split("-")[0]
            out.append(["kvforensics", "page", row["node"], page, *where, "--boot", str(row["boot"])])
    if findings:
        out.append(["kvforensics", "findings", *where])
        if not exposed.height:
            named = next((f for f in findings if "request_id" in f.evidence.columns
                          and f.evidence["request_id"].drop_nulls().len()), None)
            if named is not None:
                out.append(["kvforensics", "request", named.evidence["request_id"].drop_nulls()[0], *where])
    if case.sql("SELECT count(*) AS n FROM quarantine")["n"][0]:
        out.append(["kvforensics", "quarantine", *where])
    if report is None:
        out.append(["kvforensics", "report", *where, "--out", str(db.with_suffix(".html"))])
    return out


def tell(found: Any, db: Path, case: forensics.Case | None = None) -> Story:
    """The story of the whole job ``found`` (a :class:`kvforensics.job.JobResult`) on the case ``db``
    (read through ``case`` where the job holds it open)."""
    with case if case is not None else forensics.Case(db, read_only=True) as case:
        findings = list(case.findings())
        commands = _next_commands(db, case, findings, found.report.out if found.report is not None else None)
        nodes = case.sql("SELECT DISTINCT node FROM configs ORDER BY node")["node"].to_list()
    return Story(verdict(found, findings), _figures(found), _notes(found) + _pools(nodes), findings, commands)


def _pools(nodes: Sequence[str]) -> list[str]:
    """A note per server whose DP attention pools are nodes of their own: which ranks they are."""
    return [f"{', '.join(shown(n) for _, n in pools)}: the KV pools of DP "
            f"{'rank' if len(pools) == 1 else 'ranks'} {', '.join(str(r) for r, _ in pools)} of the server "
            f"{shown(server)} (with DP attention each rank has a pool of its own)"
            for server, pools in dp_pools(nodes).items()]


def by_severity(findings: Sequence[Finding]) -> dict[str, int]:
    """How many findings of each severity, most severe first (none left out of the count)."""
    counts = Counter(f.severity for f in findings)
    return {s: counts[s] for s in (*SEVERITIES, *sorted(set(counts) - set(SEVERITIES))) if counts[s]}


def findings_table(findings: Sequence[Finding]) -> pl.DataFrame:
    """The findings as rows: severity, id, count (its evidence rows), title."""
    return pl.DataFrame({"severity": [f.severity for f in findings], "id": [f.id for f in findings],
                         "count": [f.count for f in findings], "title": [f.title for f in findings]},
                        schema={"severity": pl.String, "id": pl.String, "count": pl.Int64, "title": pl.String})


def findings_lines(findings: Sequence[Finding], cells: int) -> list[str]:
    """The findings by severity, with their counts: a line of how many of each, and a row each."""
    if not findings:
        return ["findings: none"]
    counts = ", ".join(f"{n:,} {s}" for s, n in by_severity(findings).items())
    return [*render.wrap(f"findings: {counts}", cells),
            *render.table(findings_table(findings), cells, first=("severity", "id", "count"))]


def lines(story: Story, cells: int, report: Sequence[str] = ()) -> list[str]:
    """The last screen at most ``cells`` wide; ``report``: the lines saying where the report went."""
    out = [*render.wrap(f"verdict: {story.verdict}", cells, hanging=9), ""]
    names = list(next(iter(story.figures.values())))
    frame = pl.DataFrame({"figure": names, **{t: pl.Series([v.get(n) for n in names], dtype=pl.Int64)
                                                for t, v in story.figures.items()}})
    out += render.table(frame, cells, first=tuple(frame.columns), null="-")  # (no tier left out)
    for note in story.notes:
        out += render.wrap(note, cells, hanging=2)
    out += ["", *findings_lines(story.findings, cells)]
    if report:
        out += ["", *report]
    if story.next_commands:
        out += ["", "next:"]
        for argv in story.next_commands:
            out += render.command(argv, cells)
    return out
