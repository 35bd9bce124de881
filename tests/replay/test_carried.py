"""The check that lets a replay skip numbering every node's records for transfer ends carried from
other nodes (sql/replay.sql ``carried_any``, replay.events.prepare): it never says none where the
full statement (``carried_rows``) finds some, on the independent generator's layouts (ends logged by
both sides, by decode, by prefill, by neither) and the simulator's logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from independent_logs import Layout, generate, strip_pages

import forensics
from forensics.store import held
from replay.configs import node_configs
from replay.events import node_statement
from replay.planning import served_table
from replay.scratch import scratch
from replay.simulate import Deployment, simulate_to
from replay.statements import statement


def _carried(db: Path) -> tuple[bool, int]:
    """``carried_any``'s answer, and the rows ``carried_rows`` makes, on the case ``db``."""
    with held(db, create=False) as case, scratch(case.connection) as con:
        configs = node_configs(con)
        roles = {node: per[-1][3].role for node, per in configs.items() if per}
        con.execute(statement("create_roles"))
        con.executemany(statement("insert_role"),
                        sorted((n, r) for n, r in roles.items() if r in ("prefill", "decode")))
        served_table(con, True)
        said = bool(con.execute(statement("carried_any")).fetchall()[0][0])
        con.execute(node_statement("carried_rows"))
        rows = con.execute("SELECT count(*) FROM kvf_scratch.main.replay_carried").fetchall()[0][0]
    return said, rows


@pytest.mark.parametrize("ends", ["both", "decode", "prefill", "neither"])
def test_the_independent_generators_layouts(tmp_path: Path, ends: str) -> None:
    generate(tmp_path / "full", seed=2, layout=Layout(ends=ends, chunks=2))
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    said, rows = _carried(tmp_path / "bare.duckdb")
    assert said == (rows > 0)
    assert (rows > 0) == (ends != "both")  # (an end one side alone logged is carried to the other)


def test_the_simulators_logs(tmp_path: Path) -> None:
    deployment = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                            page_size=64, prefill_nodes=2, decode_nodes=2)
    simulate_to(tmp_path / "full", deployment=deployment, requests=200, seed=4)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    assert _carried(tmp_path / "bare.duckdb") == (False, 0)  # (each side logs its own ends)
