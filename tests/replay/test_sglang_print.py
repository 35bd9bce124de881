"""What a simulated run's steps become for SGLang's printing code (replay/sglang_print/run.py).

Printing itself needs a release's wheel (scripts/check_sglang_releases.py --simulated runs it on
every release; the shipped sample, printed by 0.5.20, is read in tests/adapters/test_sglang.py).
Here: the steps each server is given, from the canonical sample, held to its records.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from replay.sglang_print.run import hosts, room_of, timelines

SAMPLE = Path(__file__).resolve().parents[2] / "sample_logs" / "glm53-incident"


def _records() -> list[dict]:
    return [json.loads(line) for f in sorted(SAMPLE.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_each_server_gets_the_steps_its_records_hold() -> None:
    records = _records()
    epoch = dt.datetime(2026, 9, 14, 8, tzinfo=dt.UTC)
    received = {r["request_id"]: r for r in records if r["node"] == "router" and r.get("event") == "received"}
    stubs = {r["request_id"] for r in records if r.get("event") == "rejected"}
    assert len(stubs) == 13
    for node in ("prefill-2", "decode-1"):
        got = timelines(records, node, epoch)
        mine = {rid for rid, r in received.items() if node in (r["prefill_node"], r["decode_node"])}
        assert {t.rid for t in got} == mine
        assert [t.arrived for t in got] == sorted(t.arrived for t in got)
        for t in got:
            steps = {(r["event"] if r["kind"] == "request" else f"transfer_{r['event']}")
                     for r in records if r["node"] == node and r.get("request_id") == t.rid
                     and r["kind"] in ("request", "transfer")}
            assert set(t.events) == steps
            assert t.prompt == received[t.rid]["prompt_tokens"]
            if node.startswith("prefill"):
                assert t.tokens == (1 if t.rid in stubs else t.prompt)  # the placeholder sends one token
                assert ("rejected" in t.events) == (t.rid in stubs)
            else:
                assert (t.status, t.reason, t.output) == (200, "stop", received[t.rid]["max_new_tokens"])
                assert t.events["admitted"] <= t.events["transfer_completed"] <= t.events["decode_started"]


def test_servers_have_distinct_addresses_and_requests_distinct_rooms() -> None:
    nodes = [f"{r}-{i}" for r in ("prefill", "decode") for i in range(12)]
    address = hosts(nodes)
    assert len(set(address.values())) == len(nodes)
    assert address["prefill-0"] == "10.0.1.1" and address["decode-11"] == "10.0.2.12"
    rids = [f"req-{i:06d}" for i in range(5000)]
    rooms = {room_of(r) for r in rids}
    assert len(rooms) == len(rids) and all(0 <= r < 2**63 for r in rooms)
    assert room_of("req-000001") == room_of("req-000001")
