"""Settling a file once its lines are in: every record ends ingested, a duplicate or quarantined.

The staged lines (those the SQL validator read) join the fast path's in the record tables or
quarantine; then repeats move to ``duplicates`` and conflicts on ``(node, boot, seq)`` and pages
beyond the pool move to ``quarantine``, and last a ``received`` of a request id that names another
tenant or prompt length than the one kept (:func:`resolve_received`). A group of small files is
settled at once where that ends as settling them one by one would (:func:`settle_together`). The
statements are in ``sql/settle.sql``; what is built here is only what varies with the schema (a
kind's table and columns).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import duckdb
import numpy as np

from forensics.ingestion import source
from forensics.ingestion.validate import stage_sql
from forensics.schema import KINDS, Reason
from forensics.store import one, schema_columns, sql_blocks

RECORD_TABLES = {kind: f"{kind}_records" for kind in KINDS}
#: A (node, boot) whose seq span exceeds its records by this factor is left to the SQL check.
SPARSE_SEQ = 4
#: A file of more (node, boot)s than this has its keys checked in one query, not a bitmap each
#: (a replayed log set of ten thousand nodes spent 16 s in a query a node).
BITMAP_GROUPS = 64
_SQL = {block.name: block.sql for block in sql_blocks("settle.sql")}


def settle(con: duckdb.DuckDBPyConnection, file_id: int, columns: dict[str, tuple[str, ...]]) -> None:
    """Give every record of the file its end: the staged lines join the plain ones in records or
    quarantine (:func:`place`); then repeats move to duplicates, conflicts and pages beyond the pool
    to quarantine (:func:`settle_across`)."""
    place(con, columns)
    settle_across(con, file_id)
    resolve_received(con, file_id)


def place(con: duckdb.DuckDBPyConnection, columns: dict[str, tuple[str, ...]]) -> None:
    """The staged lines (each with its file's id) into their kind's table or quarantine: what each
    file alone decides."""
    if count(con, "stage"):
        # only when there are staged lines: even an empty insert into records puts the rows the fast
        # path left short of a row group through the write-ahead log at commit
        con.execute("INSERT INTO quarantine SELECT file_id, line_no, q_reason, q_detail, raw, NULL "
                    "FROM stage WHERE q_reason IS NOT NULL")
        kinds = con.execute("SELECT DISTINCT kind FROM stage WHERE q_reason IS NULL ORDER BY kind").fetchall()
        for (kind,) in kinds:
            cols = ", ".join(columns[kind])
            con.execute(
                f"INSERT INTO {RECORD_TABLES[kind]} (file_id, line_no, part, {cols}) "
                f"SELECT file_id, line_no, part, {cols} FROM stage WHERE q_reason IS NULL AND kind = $kind",
                {"kind": kind},
            )


def settle_together(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> bool:
    """Settle the files ``lo`` to ``hi`` (placed, :func:`place`; every other file of the case before
    them) as one, where that ends exactly as settling them one by one would: False where it might
    not, with their repeats moved (the caller rolls back and settles them one by one).

    Settled one by one, a file's records can be moved out of records by a later one (a conflict on
    ``(node, boot, seq)``, a config that puts pages beyond the pool, a ``received`` of another
    tenant), and what is settled after depends on it. Where none of that can happen, each record
    ends where it would have: a repeat of one read before it (:func:`_move_repeats` over the
    files at once) in duplicates, every other one in records. So that is checked, after the
    repeats: no key of theirs on two records, no page that could be beyond the pool of a config in
    force when it would be checked, no request id received with two claims.
    """
    shared = _yes(con, "keys_shared", lo, hi)
    _move_repeats(con, lo, hi, only_without_seq=not shared)
    if shared and _yes(con, "keys_shared", lo, hi):
        return False
    if _yes(con, "beyond_possible", lo, hi):
        return False
    con.execute(_SQL["received_disputed"], {"lo": lo, "hi": hi})
    disputed = count(con, "disputed")
    con.execute("DROP TABLE disputed")
    return not disputed


def _yes(con: duckdb.DuckDBPyConnection, query: str, lo: int, hi: int) -> bool:
    """The answer of the yes-or-no statement ``query`` about the files ``lo`` to ``hi``."""
    row = con.execute(_SQL[query], {"lo": lo, "hi": hi}).fetchall()
    return bool(row[0][0])


def settle_across(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """The file's records against the case's and each other: repeats to duplicates, conflicts and
    pages beyond the pool to quarantine. Each rule looks at one node's records only (a repeat has
    its record's node, a conflict is on a node's key, a pool is a node's), so a case settled node
    by node, each node's files in the same order, ends as one settled whole (``forensics.spark``)."""
    unique = keys_unique(con, file_id)
    _move_repeats(con, file_id, file_id, only_without_seq=unique)
    if not unique:
        _resolve_conflicts(con, file_id)
    _check_page_range(con, file_id)


def keys_unique(con: duckdb.DuckDBPyConnection, file_id: int) -> bool:
    """Whether ``(node, boot, seq)`` stays unique in the case with this file's records.

    When it does, no record with a seq repeats or conflicts with another (a repeat has the same
    key), and the full checks are left to records without a seq. The case's keys were unique
    before the file (each file's conflicts are settled as it goes in), so it is enough that the
    file's own keys are unique, checked with a bitmap of each node's seq range in the file (logs
    number densely), and that each lies outside the seq range of every other file on its node
    and boot (rotated logs do). Only the file's own seqs are read: reading every seq of its nodes
    in the case, for each file, made an ingest of many files of one node slower with each file.
    An answer of False only means "check in full".
    """
    mine = con.execute(_SQL["file_seq_ranges"], {"file_id": file_id}).fetchall()
    if not mine:
        return True
    others: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for node, boot, lo, hi in con.execute(_SQL["other_seq_ranges"], {"file_id": file_id}).fetchall():
        others.setdefault((node, boot), []).append((lo, hi))
    for node, boot, lo, hi, n in mine:
        span = hi - lo + 1
        if n > span or span > SPARSE_SEQ * n:
            return False
        if any(lo <= o_hi and o_lo <= hi for o_lo, o_hi in others.get((node, boot), [])):
            return False
    if len(mine) > BITMAP_GROUPS:  # (a query a node would cost more than one over them all)
        return not con.execute(_SQL["file_keys_repeat"], {"file_id": file_id}).fetchall()[0][0]
    for node, boot, lo, hi, _ in mine:
        span = hi - lo + 1
        seqs = con.execute(_SQL["file_seqs"], {"file_id": file_id, "node": node, "boot": boot}).fetchnumpy()["seq"]
        seen = np.zeros(span, dtype=bool)  # a byte per seq of the range
        seen[np.asarray(seqs, dtype=np.int64) - lo] = True
        if int(np.count_nonzero(seen)) < len(seqs):
            return False
    return True


def _move_repeats(con: duckdb.DuckDBPyConnection, lo: int, hi: int, *, only_without_seq: bool) -> None:
    """The records of the files ``lo`` to ``hi`` that repeat one read before them (in the case, an
    earlier file or an earlier line of their own): duplicates.

    ``only_without_seq``: records with a seq are known not to repeat (their keys are unique).
    """
    con.execute(_SQL["repeats"], {"lo": lo, "hi": hi, "only_without_seq": only_without_seq})
    if count(con, "repeats"):
        con.execute(_SQL["repeats_to_duplicates"], {"lo": lo, "hi": hi})
        for table in RECORD_TABLES.values():
            con.execute(f"DELETE FROM {table} r USING repeats x WHERE r.file_id BETWEEN $lo AND $hi "
                        "AND r.file_id = x.file_id AND r.line_no = x.line_no AND r.part = x.part",
                        {"lo": lo, "hi": hi})
    con.execute("DROP TABLE repeats")


def _resolve_conflicts(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """Of records sharing ``(node, boot, seq)``, keep the smallest canonical JSON.

    Repeats are already duplicates, so each record is in ``records`` once; every line of a losing
    record, in records or duplicates, of this file or an earlier one, goes to quarantine.
    """
    con.execute(_SQL["contested"], {"file_id": file_id})
    if not count(con, "contested"):
        con.execute("DROP TABLE contested")
        return
    con.execute(_SQL["rivals"])
    with texts(con, "rivals"):
        con.execute(_SQL["rival_lines"])
    # every contender with its canonical JSON, recomputed from its line by the validator
    con.execute(
        "CREATE OR REPLACE TEMP TABLE contenders AS "
        "SELECT c.node, c.boot, c.seq, c.canon, l.c_hash AS rec_hash, l.c_file AS file_id, l.c_line AS line_no "
        f"FROM ({stage_sql('rival_lines', with_canon=True)}) c JOIN rival_lines l USING (line_no)"
    )
    con.execute(_SQL["losers"])
    _quarantine_lines(con, "losers", Reason.CONFLICT, _conflict_detail("l"), KINDS)
    for table in ("contested", "rivals", "rival_lines", "contenders", "losers"):
        con.execute(f"DROP TABLE {table}")


def _quarantine_lines(
    con: duckdb.DuckDBPyConnection, found: str, reason: Reason, detail: str, kinds: Sequence[str],
) -> None:
    """Move the records in ``found`` (by ``rec_hash``), of ``kinds``, and their duplicates into
    quarantine with their verbatim text (``detail``: SQL over ``found`` as ``l``)."""
    tables = [RECORD_TABLES[kind] for kind in kinds]
    lines = " UNION ALL ".join(f"SELECT file_id, line_no, rec_hash, doc FROM {t}" for t in [*tables, "duplicates"])
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE moving AS
        SELECT r.file_id, r.line_no, r.rec_hash, r.doc, {detail} AS detail
        FROM ({lines}) r JOIN {found} l USING (rec_hash)
        """
    )
    with texts(con, "moving"):
        con.execute(
            "INSERT INTO quarantine SELECT m.file_id, m.line_no, $reason, m.detail, coalesce(t.text, m.doc), "
            "m.rec_hash FROM moving m LEFT JOIN texts t USING (file_id, line_no)",
            {"reason": reason.value},
        )
    for table in [*tables, "duplicates"]:
        con.execute(f"DELETE FROM {table} WHERE rec_hash IN (SELECT rec_hash FROM {found})")
    con.execute("DROP TABLE moving")


def _conflict_detail(alias: str) -> str:
    """SQL for a conflict's detail: the key, and where the record that won it is."""
    a = alias
    return (
        f"'conflicts on (node, boot, seq) = (' || {a}.node || ', ' || {a}.boot || ', ' || {a}.seq"
        f" || ') with file ' || {a}.w_file || ' line ' || {a}.w_line"
    )


def resolve_received(con: duckdb.DuckDBPyConnection, file_id: int | None) -> None:
    """Of the ``received`` records of one request id naming other tenants or prompt lengths, keep
    the one whose canonical JSON sorts first and those that agree with it; quarantine the others as
    conflicts, held in ``received_conflicts`` (log-schema.md section 4).

    Looks at the ids the file brings a received of (``None``: every id, as the Spark path does once
    every node is settled). A held record whose claim a later file's winner agrees with goes back
    to records, so the case ends alike whatever the order of its files. Unlike the rules of
    :func:`settle_across`, this one spans nodes: a router's received and an engine's meet here.
    """
    con.execute(_SQL["received_disputed"], {"lo": file_id, "hi": file_id})
    if not count(con, "disputed"):
        con.execute("DROP TABLE disputed")
        return
    con.execute("CREATE OR REPLACE TEMP TABLE received_rivals AS SELECT * FROM request_records "
                "SEMI JOIN disputed USING (request_id) WHERE event = 'received'")
    with texts(con, "received_rivals"):
        con.execute(_SQL["received_lines"])
    con.execute(
        "CREATE OR REPLACE TEMP TABLE claimants AS "
        "SELECT l.c_file AS file_id, l.c_line AS line_no, l.c_hash AS rec_hash, c.canon, "
        "l.c_request AS request_id, l.c_tenant AS tenant_id, l.c_prompt AS prompt_tokens, FALSE AS held "
        f"FROM ({stage_sql('received_lines', with_canon=True)}) c JOIN received_lines l USING (line_no) "
        "UNION ALL SELECT file_id, line_no, rec_hash, canon, request_id, tenant_id, prompt_tokens, TRUE "
        "FROM received_conflicts SEMI JOIN disputed USING (request_id) WHERE NOT duplicate"
    )
    con.execute(_SQL["received_winners"])
    con.execute(_SQL["received_restored"])
    con.execute(_SQL["received_losers"])
    _restore_held(con)
    _hold_losers(con)
    # every held record of these ids names the claim kept now, in its row and its quarantine detail
    con.execute("UPDATE received_conflicts h SET kept_file = w.w_file, kept_line = w.w_line, "
                "kept_tenant_id = w.w_tenant, kept_prompt_tokens = w.w_prompt "
                "FROM received_winners w WHERE h.request_id = w.request_id")
    con.execute(f"UPDATE quarantine q SET detail = {_received_detail('h')} FROM received_conflicts h "
                "WHERE q.file_id = h.file_id AND q.line_no = h.line_no AND q.rec_hash = h.rec_hash "
                "AND q.reason = 'conflict' AND h.request_id IN (SELECT request_id FROM disputed)")
    for table in ("disputed", "received_rivals", "received_lines", "claimants", "received_winners", "restored",
                  "losers"):
        con.execute(f"DROP TABLE {table}")


def _restore_held(con: duckdb.DuckDBPyConnection) -> None:
    """The held records whose claim won (``restored``) back where they would have been."""
    if not count(con, "restored"):
        return
    cols = ", ".join(c for c, _ in schema_columns()["request_records"])
    con.execute(f"INSERT INTO request_records ({cols}) SELECT {cols} FROM restored WHERE NOT to_duplicates")
    con.execute("INSERT INTO duplicates SELECT file_id, line_no, rec_hash, doc FROM restored WHERE to_duplicates")
    con.execute("DELETE FROM quarantine q USING restored r WHERE q.file_id = r.file_id AND q.line_no = r.line_no "
                "AND q.rec_hash = r.rec_hash AND q.reason = 'conflict'")
    con.execute("DELETE FROM received_conflicts h USING restored r WHERE h.file_id = r.file_id "
                "AND h.line_no = r.line_no AND h.part = r.part AND h.duplicate = r.duplicate")


def _hold_losers(con: duckdb.DuckDBPyConnection) -> None:
    """The losing records (``losers``) and their duplicates held in ``received_conflicts``, then
    moved to quarantine."""
    if not count(con, "losers"):
        return
    kept = "l.canon, l.kept_file, l.kept_line, l.kept_tenant_id, l.kept_prompt_tokens"
    con.execute(f"INSERT INTO received_conflicts BY NAME SELECT r.*, FALSE AS duplicate, {kept} "
                "FROM request_records r JOIN losers l ON r.rec_hash = l.rec_hash")
    con.execute(
        "INSERT INTO received_conflicts BY NAME SELECT r.* REPLACE (d.file_id AS file_id, d.line_no AS line_no, "
        f"0::SMALLINT AS part, d.doc AS doc), TRUE AS duplicate, {kept} "
        "FROM duplicates d JOIN losers l ON d.rec_hash = l.rec_hash JOIN request_records r ON r.rec_hash = l.rec_hash"
    )
    _quarantine_lines(con, "losers", Reason.CONFLICT, _received_detail("l"), ["request"])


def _received_detail(alias: str) -> str:
    """SQL for a received conflict's detail: what differs and where the kept record is (never the
    record's values: its text is in ``raw``, the ids in the finding's evidence)."""
    a = alias
    prompt_too = f"{a}.prompt_tokens IS DISTINCT FROM {a}.kept_prompt_tokens"
    differs = (f"CASE WHEN {a}.tenant_id IS DISTINCT FROM {a}.kept_tenant_id THEN "
               f"CASE WHEN {prompt_too} THEN 'tenant_id and prompt_tokens' ELSE 'tenant_id' END "
               "ELSE 'prompt_tokens' END")
    return (
        f"'received of a request id received with another ' || {differs} || ' at file ' || {a}.kept_file"
        f" || ' line ' || {a}.kept_line || ', which is kept: two requests that cannot be told apart'"
    )


def _check_page_range(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """Quarantine page records with ids beyond the pool of the node's config in force.

    New page records are checked, and when this file brought a node's config, all of that
    node's page records are checked again (with their repeats).
    """
    con.execute(_SQL["beyond"], {"file_id": file_id})
    if count(con, "beyond"):
        _quarantine_lines(con, "beyond", Reason.PAGE_OUT_OF_RANGE, "l.detail", ["kv"])
    con.execute("DROP TABLE beyond")


@contextmanager
def texts(con: duckdb.DuckDBPyConnection, keys: str) -> Iterator[None]:
    """The verbatim text of the records at ``keys`` (``file_id, line_no``) visible as ``texts``
    (``file_id, line_no, text``; no row for a Parquet row, whose text is its ``doc``)."""
    con.register("texts", source.texts(con, keys))
    try:
        yield
    finally:
        con.unregister("texts")


def count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    """The rows of ``table``."""
    row = one(con, f"SELECT count(*) FROM {table}")
    assert row is not None
    return int(row[0])
