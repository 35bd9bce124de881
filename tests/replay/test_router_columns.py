"""The router replayed as columns (replay/router_columns.py) held to the router's engine record by
record (replay/drive.py with ``ROUTER_COLUMNS`` off), its reference: the same replayed files, byte
for byte, and the same figures, on simulated incidents (over-long prompts the router rejects in the
hardened what-if, requests the logs show no engine event for) and the independent generator's logs,
in files packed small enough to close inside the router's records."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from independent_logs import Layout, generate, strip_pages

import forensics
import replay.drive as drive
import replay.logset as logset
from replay import router_columns
from replay.replay import ReplayResult, WhatIf, replay
from replay.simulate import Deployment, shape, simulate, simulate_to
from replay.workload import synthetic

SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2, step_log_interval=10)


def _files(result: ReplayResult) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((result.out / "logs").iterdir())}


def _both(db: Path, out: Path, monkeypatch: pytest.MonkeyPatch, engine: str = "sglang-placeholder",
          **options: Any) -> tuple[ReplayResult, list[str]]:
    """``db`` replayed with its router through the engine, then as columns, held equal; the
    columns' replay and the nodes routed as columns."""
    routed: list[str] = []
    route = router_columns.route

    def counted(batches: Any, node: str, *rest: Any) -> None:
        routed.append(node)
        route(batches, node, *rest)

    monkeypatch.setattr(router_columns, "route", counted)
    monkeypatch.setattr(drive, "ROUTER_COLUMNS", False)
    engine_replay = replay(db, engine, out / "engine", jobs=1, **options)
    assert routed == []
    monkeypatch.setattr(drive, "ROUTER_COLUMNS", True)
    columns = replay(db, engine, out / "columns", jobs=1, **options)
    assert _files(columns) == _files(engine_replay)
    assert {k: v for k, v in columns.as_dict().items() if k != "out"} == \
        {k: v for k, v in engine_replay.as_dict().items() if k != "out"}
    return columns, routed


def test_a_simulated_incident_confirmed_and_hardened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    simulate_to(tmp_path / "full", deployment=SMALL, requests=400, seed=9)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    confirmed, routed = _both(tmp_path / "bare.duckdb", tmp_path / "confirm", monkeypatch)
    assert routed == ["router"] and confirmed.exposure["exposed_responses"] > 0
    monkeypatch.setattr(logset, "PART_RECORDS", 97)  # (files closed inside the router's records)
    hardened, _ = _both(tmp_path / "bare.duckdb", tmp_path / "hardened", monkeypatch, "sglang-hardened")
    written = b"".join(_files(hardened).values())
    assert b'"reason":"context_length_exceeded"' in written  # (the router's own rejections)
    assert len(_files(hardened)) > 10
    _both(tmp_path / "bare.duckdb", tmp_path / "context", monkeypatch, what_if=WhatIf(context_length=16_384))


def test_requests_the_router_rejected_admitted_by_a_wider_context(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests with no engine event in the logs (the router rejected them; a wider context admits
    them): the router keeps their ``received`` alone, the engine's records of them come from their
    arrival."""
    rng = random.Random(5)
    sim = simulate(tmp_path / "full", shape(synthetic(300, rng, rate=3.0), rng, SMALL, length_scale=4.0),
                   deployment=SMALL, seed=5)
    assert sim.outcomes["rejected_by_router"] > 0
    forensics.investigate([tmp_path / "full"], tmp_path / "case.duckdb")
    _both(tmp_path / "case.duckdb", tmp_path / "logged", monkeypatch)
    wide, routed = _both(tmp_path / "case.duckdb", tmp_path / "wide", monkeypatch,
                         what_if=WhatIf(context_length=1 << 20, prefill_pool_tokens=1 << 21))
    assert routed == ["router"]
    written = b"".join(_files(wide).values())
    assert b'"reason":"context_length_exceeded"' not in written


@pytest.mark.parametrize("layout", [Layout(), Layout(seqless_router=True, prefix_cache=True), Layout(restart=True),
                                    Layout(in_flight=True, step_log=3)], ids=["default", "seqless", "restart",
                                                                              "in-flight"])
def test_the_independent_generators_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: Layout) -> None:
    generate(tmp_path / "full", seed=4, layout=layout)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    _, routed = _both(tmp_path / "bare.duckdb", tmp_path / "confirm", monkeypatch)
    assert routed
    _both(tmp_path / "bare.duckdb", tmp_path / "hardened", monkeypatch, "sglang-hardened")
