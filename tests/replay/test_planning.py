"""The requests planned a batch at a time as columns (replay/planning.py, ``_Planner.columns``) held
to planning one request at a time (``_Planner.row``, the model's :func:`replay.engine.plan` and
``_followed`` on each), their reference: the same plans table, row for row, the same requests
handed to the engine unlogged, and the same disagreements in the same order; confirming, in each
what-if, under both engines, on simulated incidents and the independent generator's logs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from independent_logs import Layout, generate, strip_pages

import forensics
import replay.planning as planning
from forensics.store import held
from replay.configs import WhatIf, node_configs
from replay.engine import Disagreement
from replay.scratch import scratch
from replay.simulate import Deployment, shape, simulate
from replay.workload import synthetic

SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2, step_log_interval=10)


def _planned(db: Path, engine: str, what_if: WhatIf, confirm: bool) -> tuple[list[tuple[Any, ...]], dict[str, Any],
                                                                               list[Disagreement]]:
    with held(db, create=False) as case, scratch(case.connection) as con:
        configs = node_configs(con)
        roles = {node: per[-1][3].role for node, per in configs.items() if per}
        disagreements: list[Disagreement] = []
        unlogged = planning.plan_requests(con, configs, roles, engine, what_if, confirm, disagreements)
        plans = con.execute("SELECT * FROM kvf_scratch.main.replay_plans ORDER BY request_id").fetchall()
    return plans, unlogged, disagreements


def _same(db: Path, monkeypatch: pytest.MonkeyPatch, engine: str, what_if: WhatIf, confirm: bool
          ) -> tuple[list[tuple[Any, ...]], dict[str, Any], list[Disagreement]]:
    monkeypatch.setattr(planning, "COLUMNS", False)
    one_at_a_time = _planned(db, engine, what_if, confirm)
    monkeypatch.setattr(planning, "COLUMNS", True)
    columns = _planned(db, engine, what_if, confirm)
    assert columns == one_at_a_time
    assert [type(v) for v in columns[0][0]] == [type(v) for v in one_at_a_time[0][0]]
    return columns


def test_a_simulated_incident_with_requests_the_router_rejected(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    sim = simulate(tmp_path / "full", shape(synthetic(400, rng, rate=3.0), rng, SMALL, length_scale=4.0),
                   deployment=SMALL, seed=5)
    assert sim.outcomes["rejected_by_router"] > 0
    forensics.investigate([tmp_path / "full"], tmp_path / "case.duckdb")
    db = tmp_path / "case.duckdb"
    plans, unlogged, _ = _same(db, monkeypatch, "sglang-placeholder", WhatIf(), True)
    assert any(row[8] for row in plans) and any(row[7] for row in plans)  # (over-long prompts; the router's)
    _, _, hardened = _same(db, monkeypatch, "sglang-hardened", WhatIf(), True)
    assert {d.kind for d in hardened} == {"model_rejects_served"}  # (prefill would reject what the logs served)
    _, wide, admits = _same(db, monkeypatch, "sglang-placeholder", WhatIf(context_length=1 << 20), True)
    assert {d.kind for d in admits} == {"model_admits_rejected"}
    _, wide, _ = _same(db, monkeypatch, "sglang-hardened", WhatIf(context_length=1 << 20), False)
    assert len(wide) == sim.outcomes["rejected_by_router"]  # (the router's rejections, now the engine's)
    _same(db, monkeypatch, "sglang-placeholder", WhatIf(context_length=8_192), True)


@pytest.mark.parametrize("layout", [Layout(), Layout(ends="neither", ms_times=True), Layout(restart=True)],
                         ids=["default", "neither", "restart"])
def test_the_independent_generators_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: Layout) -> None:
    generate(tmp_path / "full", seed=3, layout=layout)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    for engine in ("sglang-placeholder", "sglang-hardened"):
        for confirm in (True, False):
            plans, _, _ = _same(tmp_path / "bare.duckdb", monkeypatch, engine, WhatIf(), confirm)
            assert plans
