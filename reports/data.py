"""What the report shows, read from a case: every figure with the SQL that produced it."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import duckdb

from forensics.exposure import tiers as evidence_tiers
from forensics.exposure.figures import DEFINITIONS, checked
from forensics.findings import Finding, findings
from forensics.ids import dp_pools
from forensics.store import has_table, rows
from forensics.text import AS_LOGGED, time_text

AUDIENCES = ("internal", "regulator", "customer")
#: The summary's figures in plain words: a label a manager can read, and a one-line definition
#: (section 7 gives each figure's exact definition as its SQL).
FIGURE_WORDS: dict[str, tuple[str, str]] = {
    "exposed_responses": ("responses that read others' data",
                          "delivered responses that attended to KV pages holding another request's content"),
    "contained_requests": ("exposures stopped before delivery",
                           "requests that attended to such pages but whose response was not delivered"),
    "victim_requests": ("requests whose content was read",
                        "requests whose content a delivered response attended to"),
    "exposure_pairs": ("reader–victim pairs", "distinct pairs of a delivered response and a request it read"),
    "cross_tenant_pairs": ("pairs across tenants", "those pairs whose two requests belong to different tenants"),
    "exposed_page_reads": ("page reads of others' content",
                           "distinct reads, by a delivered response, of a page holding another request's content"),
    "uninitialized_reads": ("reads of never-written pages",
                            "page reads of memory no request had written since the node started (owner unknown)"),
    "affected_tenants": ("tenants whose content was read", "distinct tenants of the requests whose content was read"),
}
#: A finding's evidence shows at most this many columns in the report (its SQL, beside it, gives them all).
EVIDENCE_COLUMNS = 6

#: Prompts the prompts chart draws at most, besides those of exposed responses and those past the
#: prefill limit (every one of which it draws).
PROMPT_POINTS = 20_000


class Names:
    """Request and tenant ids as the report shows them: as logged, keyed pseudonyms, or ordinals."""

    def __init__(self, mode: str, key: str | None = None) -> None:
        self.mode = mode  # "ids", "keyed" or "ordinal"
        self._key = (key or "").encode()
        self._ordinal: dict[tuple[str, str], str] = {}

    def __call__(self, kind: str, value: str | None) -> str:
        if value is None:
            return "(unknown)"
        if self.mode == "ids":
            return value
        if self.mode == "keyed":
            digest = hmac.new(self._key, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()
            return f"{kind}-{digest[:12]}"
        key = (kind, value)
        if key not in self._ordinal:
            self._ordinal[key] = f"{kind} {sum(1 for k in self._ordinal if k[0] == kind) + 1}"
        return self._ordinal[key]

    def prime(self, kind: str, values: list[str]) -> None:
        """Number ordinal names in sorted id order, so they do not depend on table order."""
        if self.mode == "ordinal":
            for v in sorted(set(values)):
                self(kind, v)


@dataclass
class ReportData:
    """Everything the template renders; strings from the logs are escaped by the template."""

    audience: str
    generated_at: str
    toolkit_version: str
    figures: dict[str, int]
    figure_sql: dict[str, str]
    window: tuple[str | None, str | None]
    records: dict[str, int]
    configs: list[dict[str, Any]]
    handoffs: list[dict[str, Any]]
    responses: list[dict[str, Any]]
    victims: list[dict[str, Any]]
    tenants: list[str]
    matrix: dict[tuple[str, str], int]
    replays: list[dict[str, Any]]
    files: list[dict[str, Any]]
    over_time: list[tuple[dt.datetime, int]]
    prompts: list[tuple[dt.datetime, int, bool]]
    prompt_limit: int | None
    naming: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    tiers: list[dict[str, Any]] = field(default_factory=list)
    #: exposures the replay filled in where page records are missing (replay_exposures), or None
    filled: dict[str, int] | None = None
    #: the eight figures by the evidence they rest on (tiers.tier_figures), and the engine nodes
    #: without page records
    tier_figures: dict[str, dict[str, int | None]] = field(default_factory=dict)
    without_page_records: list[str] = field(default_factory=list)
    #: transfers sent to one of those nodes and given up there (tiers.unseen_late_writes)
    unseen_late_writes: int = 0
    #: the prompts chart shows 1 in this many of the prompts below the limit of unexposed responses
    prompt_every: int = 1
    #: the complete lists written beside the report: name -> (rows, [(file name, SHA-256)])
    lists: dict[str, tuple[int, list[tuple[str, str]]]] = field(default_factory=dict)
    #: the figures the summary's cards and the notification show: every tier together where the
    #: replay filled in (None: not measured by some tier), else the page records'
    shown_figures: dict[str, int | None] = field(default_factory=dict)
    #: victim requests named by page records (certain) and by the replay alone (possible)
    certain_victims: int = 0
    possible_victims: int = 0
    #: (reader, victim) pairs of delivered responses named certain (tiers.certainty)
    certain_pairs: int = 0
    #: where a node's pages are not the replay's (after decode retractions, or logs it could not
    #: follow): (reader, request) pairs the evidence does not rule out, and whether they are listed
    #: as possible victims (forensics.exposure.tiers.not_ruled_out_figures)
    not_ruled_out: tuple[int, bool] = (0, True)
    not_ruled_out_budget: int = 0
    #: delivered responses that read pages they did not write where a node's pages are not the
    #: replay's, and that it names no victim of: possibly exposed (tiers.possible_readers_figure)
    possible_readers: int = 0
    #: gaps in nodes' seq (records missing: finding evidence.seq_gap), and the requests whose decode
    #: records are missing (tiers.LostRecords, as_dict)
    seq_gaps: int = 0
    lost_records: dict[str, Any] = field(default_factory=lambda: evidence_tiers.LostRecords().as_dict())
    #: every request those figures count, with what is not known of it (tiers.lost_record_list), named
    #: as the report names requests and tenants
    not_known: list[dict[str, Any]] = field(default_factory=list)
    #: whether a replay under the engine the logs were made with confirmed the case
    confirmed: bool = False
    #: whether any node logged page records (kv records)
    page_records: bool = True
    #: DP attention pools among the nodes: server -> its pools as (DP rank, node) (forensics.ids.dp_pools)
    dp_pools: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def natural(text: str) -> list[tuple[int, int | str]]:
    """A sort key putting numbers in their order: "tenant 2" before "tenant 10" (text order puts
    "tenant 10, tenant 11, tenant 12" before "tenant 2")."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text)]


def _tiers(values: list[str] | None) -> str:
    """The evidence tiers of a row's exposures, strongest first."""
    order = {t: i for i, t in enumerate(evidence_tiers.TIERS)}
    return "; ".join(sorted(set(values or []), key=lambda t: (order.get(t, len(order)), t)))


def _ts(value: dt.datetime | None) -> str | None:
    return None if value is None else time_text(value)


def _shown(column: str, value: Any) -> str:
    """A value of a finding's evidence as the report shows it: times in its one format, counts
    grouped by thousands (positions and codes as logged), nothing for a missing value."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return time_text(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value) if column in AS_LOGGED else f"{value:,}"
    if isinstance(value, list | tuple):
        return ", ".join(_shown(column, v) for v in value)
    return str(value)


def _evidence(finding: Finding, rows_shown: int) -> dict[str, Any]:
    """A finding as the report shows it: the first ``rows_shown`` rows of its evidence, their first
    :data:`EVIDENCE_COLUMNS` columns, each value shown (:func:`_shown`), and the columns left to its SQL."""
    head = finding.evidence.head(rows_shown).to_dicts() if rows_shown else []
    columns = finding.evidence.columns if head else []
    kept = columns[:EVIDENCE_COLUMNS]
    return {**finding.as_dict(rows=0), "evidence": [{c: _shown(c, r[c]) for c in kept} for r in head],
            "more_columns": columns[EVIDENCE_COLUMNS:]}


def gather(con: duckdb.DuckDBPyConnection, *, audience: str, names: Names, generated_at: str,
           toolkit_version: str) -> ReportData:
    """Read the report's content from an analysed case."""
    figures = checked(con)
    every = evidence_tiers.every_exposure(con)
    first, last = con.execute(
        f"SELECT min(first_ts), max(first_ts) FROM ({every}) WHERE reader_delivered").fetchall()[0]
    counts = rows(con, "SELECT count(*) AS records FROM records")[0]
    q = con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
    d = con.execute("SELECT count(*) FROM duplicates").fetchall()[0][0]
    records = {"ingested": counts["records"], "duplicates": d, "quarantined": q,
               "read": counts["records"] + d + q}

    configs = rows(con, """
        SELECT node, boot, role, engine, engine_version, model, context_length, page_size, pool_pages,
               pool_tokens, max_req_input_len, context_exceeds_pool
        FROM configs ORDER BY node, boot, seq""")
    limits = [c["max_req_input_len"] for c in configs if c["role"] == "prefill"]
    case_findings = findings(con)
    handoffs = next((f.evidence.to_dicts() for f in case_findings if f.id == "handoff.rejected_but_transferred"), [])
    responses = rows(con, f"""
        SELECT reader_request, any_value(reader_tenant) AS reader_tenant, count(DISTINCT victim_request) AS victims,
               count(DISTINCT victim_request) FILTER (WHERE certainty = 'certain') AS certain_victims,
               count(DISTINCT victim_tenant) AS victim_tenants, sum(n_pages)::BIGINT AS pages,
               min(first_ts) AS first_ts, bool_or(inferred) AS inferred, bool_or(reader_delivered) AS delivered,
               list(DISTINCT evidence) AS evidence
        FROM ({every}) GROUP BY reader_request ORDER BY first_ts, reader_request""")
    victims = rows(con, f"""
        SELECT victim_request, any_value(victim_tenant) AS victim_tenant,
               count(DISTINCT reader_request) AS readers, sum(n_pages)::BIGINT AS pages, min(first_ts) AS first_seen,
               CASE WHEN bool_or(certainty = 'certain') THEN 'certain' ELSE 'possible' END AS certainty,
               CASE WHEN NOT bool_or(certainty = 'certain') THEN min(certainty_note) END AS why_possible,
               list(DISTINCT evidence) AS evidence
        FROM ({every}) WHERE reader_delivered GROUP BY victim_request ORDER BY first_seen, victim_request""")
    pairs = rows(con, f"""
        SELECT reader_tenant, victim_tenant, count(*) AS pairs FROM (
          SELECT DISTINCT reader_request, victim_request, reader_tenant, victim_tenant
          FROM ({every}) WHERE reader_delivered) GROUP BY ALL""")
    names.prime("tenant", [t for p in pairs for t in (p["reader_tenant"], p["victim_tenant"]) if t])
    names.prime("request", [r["reader_request"] for r in responses] + [v["victim_request"] for v in victims])
    for r in responses:
        r["evidence"] = _tiers(r["evidence"])
        r["reader_request"] = names("request", r["reader_request"])
        r["reader_tenant"] = names("tenant", r["reader_tenant"])
        r["first_ts"] = _ts(r["first_ts"])
    for v in victims:
        v["evidence"] = _tiers(v["evidence"])
        v["victim_request"] = names("request", v["victim_request"])
        v["victim_tenant"] = names("tenant", v["victim_tenant"])
        v["first_seen"] = _ts(v["first_seen"])
    for h in handoffs:
        h["request_id"] = names("request", h["request_id"])
        h["rejected_at"] = _ts(h["rejected_at"])
    lost = evidence_tiers.lost_record_rows(con)
    not_known = evidence_tiers.lost_record_list(con, lost)
    # (named after the others: their ordinals stay what they were without it)
    names.prime("tenant", [str(r["tenant_id"]) for r in not_known if r["tenant_id"] is not None])
    names.prime("request", [str(r["request_id"]) for r in not_known])
    for r in not_known:
        r["request_id"] = names("request", r["request_id"])
        r["tenant_id"] = names("tenant", r["tenant_id"])
    matrix: dict[tuple[str, str], int] = {}
    for p in pairs:
        key = (names("tenant", p["reader_tenant"]), names("tenant", p["victim_tenant"]))
        matrix[key] = matrix.get(key, 0) + int(p["pairs"])
    tenants = sorted({t for k in matrix for t in k}, key=natural)

    replays = rows(con, "SELECT * FROM replays ORDER BY engine, what_if")
    kinds: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    if has_table(con, "replay_disagreements"):
        listed = con.execute("SELECT engine, what_if, kind, count(*) FROM replay_disagreements "
                             "GROUP BY ALL ORDER BY ALL").fetchall()
        for engine, what_if, kind, n in listed:
            kinds[(engine, what_if)][kind] = n
    from replay.engine import meaning  # (what each kind means, said beside the replays)

    for r in replays:
        r["disagreement_kinds"] = kinds.get((r["engine"], r["what_if"]), {})
        r["disagreement_meanings"] = {k: meaning(k) for k in r["disagreement_kinds"]}
        r["exposure"] = json.loads(r["exposure"])
        r["agreement"] = json.loads(r["agreement"]) if r["agreement"] else None
        r["what_if"] = json.loads(r["what_if"])
        r["assumed"] = json.loads(r.get("assumed") or "[]")  # (a case replayed before it was kept: none said)
    files = rows(con, """
        SELECT f.path, f.size, f.sha256, f.ingested_at, f.toolkit_version, c.read, c.ingested, c.duplicates,
               c.quarantined FROM files f JOIN file_counts c USING (file_id) ORDER BY f.file_id""")
    for f in files:
        f["ingested_at"] = _ts(f["ingested_at"])
    over_time = [(r["t"], int(r["n"])) for r in rows(con, f"""
        SELECT first_ts AS t, count(*) AS n FROM (
          SELECT reader_request, min(first_ts) AS first_ts FROM ({every}) WHERE reader_delivered GROUP BY ALL)
        GROUP BY ALL ORDER BY t""")]
    limit = min(limits) if limits else None
    # every prompt of an exposed response and every prompt past the prefill limit; of the others,
    # where there are more than the chart can show, every k-th in arrival order
    prompt_rows = rows(con, f"""
        WITH p AS (
          SELECT e.ts, e.request_id, e.prompt_tokens,
                 e.request_id IN (SELECT reader_request FROM ({every}) WHERE reader_delivered) AS exposed
          FROM request_events e WHERE e.event = 'received' AND e.prompt_tokens IS NOT NULL
        ), o AS (
          SELECT *, row_number() OVER (ORDER BY ts, request_id) - 1 AS k,
                 greatest(1, ceil(count(*) OVER () / $cap))::BIGINT AS every
          FROM p WHERE NOT exposed AND prompt_tokens < coalesce($limit, prompt_tokens + 1)
        )
        SELECT ts, request_id, prompt_tokens, exposed, 1 AS every FROM p
        WHERE exposed OR prompt_tokens >= coalesce($limit, prompt_tokens + 1)
        UNION ALL SELECT ts, request_id, prompt_tokens, exposed, every FROM o WHERE k % every = 0
        ORDER BY ts, request_id""", {"cap": PROMPT_POINTS, "limit": limit})
    prompts = [(r["ts"], int(r["prompt_tokens"]), bool(r["exposed"])) for r in prompt_rows]
    prompt_every = max((int(r["every"]) for r in prompt_rows), default=1)
    found = [_evidence(f, 10 if names.mode == "ids" else 0) for f in case_findings]
    filled = evidence_tiers.filled_figures(con)
    tier_figures = evidence_tiers.tier_figures(con)
    shown: dict[str, int | None] = dict(tier_figures[evidence_tiers.TOTAL]) if filled else dict(figures)
    n_certain = sum(1 for v in victims if v["certainty"] == "certain")
    return ReportData(
        audience=audience, generated_at=generated_at, toolkit_version=toolkit_version, figures=figures,
        figure_sql={f.name: f.sql for f in DEFINITIONS}, window=(_ts(first), _ts(last)), records=records,
        configs=configs,
        handoffs=handoffs, responses=responses, victims=victims, tenants=tenants, matrix=matrix,
        replays=replays, files=files, over_time=over_time, prompts=prompts,
        prompt_limit=limit, naming=names.mode, findings=found, prompt_every=prompt_every,
        tiers=evidence_tiers.by_tier(con), filled=filled, tier_figures=tier_figures, shown_figures=shown,
        certain_victims=n_certain, possible_victims=len(victims) - n_certain,
        certain_pairs=evidence_tiers.certainty(con)["exposure_pairs"]["certain"] if filled else 0,
        not_ruled_out=evidence_tiers.not_ruled_out_figures(con),
        not_ruled_out_budget=evidence_tiers.NOT_RULED_OUT_PAIRS,
        possible_readers=evidence_tiers.possible_readers_figure(con),
        without_page_records=[str(n) for n in evidence_tiers.missing_page_records(con)],
        unseen_late_writes=evidence_tiers.unseen_late_writes(con),
        seq_gaps=int(con.execute("SELECT count(*) FROM seq_gaps").fetchall()[0][0]),
        lost_records=evidence_tiers.lost_records(con, lost).as_dict(), not_known=not_known,
        confirmed=any(r.get("mode") == "confirm" for r in replays),
        page_records=bool(con.execute("SELECT EXISTS (SELECT 1 FROM kv_records)").fetchall()[0][0]),
        dp_pools=dp_pools(str(c["node"]) for c in configs),
    )
