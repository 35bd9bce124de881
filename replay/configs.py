"""The case's node configs as a replay reads them, the engine they say the logs were made with,
and the what-if's changes to them."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from forensics.adapters.sglang.eras import releases_of
from forensics.ingestion import source
from forensics.schema import V1_1_CONFIG
from forensics.store import connect
from replay.engine import EVICTS_SHORTFALL_FROM, NodeConfig
from replay.scratch import log_ts
from replay.simulate import pool_pages
from replay.statements import statement

#: Each node's configs in its order: (boot, seq (-1 where it has none), time as log text, config).
NodeConfigs = dict[str, list[tuple[int, int, str, NodeConfig]]]

#: The release from which reference-engine.md has SGLang retire a length-rejected prompt.
HARDENED_FROM = (0, 5, 22)


@dataclass(frozen=True)
class WhatIf:
    """The counterfactual of a replay; all ``None`` replays the case as configured."""

    prefill_pool_tokens: int | None = None
    context_length: int | None = None

    def apply(self, config: NodeConfig) -> NodeConfig:
        """``config`` with the what-if's changes."""
        changes: dict[str, Any] = {}
        if self.context_length is not None:
            changes["context_length"] = self.context_length
        if self.prefill_pool_tokens is not None and config.role == "prefill":
            changes["pool_pages"] = pool_pages(self.prefill_pool_tokens, config.page_size)
        return dataclasses.replace(config, **changes)


#: No what-if: the case replayed as configured.
AS_CONFIGURED = WhatIf()


def node_configs(con: Any) -> NodeConfigs:
    """The case's config records, each node's in its order, with the scheduling fields they state."""
    rows = con.execute(statement("configs")).fetchall()
    stated = _stated(con, [(r[-3], r[-2]) for r in rows if r[-1] is None])
    out: NodeConfigs = defaultdict(list)
    for node, boot, seq, ts, role, eng, version, model, ctx, page_size, pool, interval, file_id, line_no, doc in rows:
        said = _scheduling(doc if doc is not None else stated.get((file_id, line_no)))
        out[node].append((boot, -1 if seq is None else seq, log_ts(ts),
                          NodeConfig(node, role, ctx, page_size, pool, eng, version, model, **said,
                                     said=tuple(sorted(said)), step_log_interval=interval)))
    return out


def assumptions(configs: NodeConfigs) -> tuple[str, ...]:
    """What the replay assumed that the logs do not say (v1.1's scheduling fields), each taken as
    SGLang's default: the overlap scheduler on where a decode config does not state
    ``overlap_schedule``, the prefix cache on where an SGLang prefill config does not state
    ``prefix_cache``. Where a caching prefill node's ``engine_version`` is a range of releases
    on both sides of the change in how much its cache evicts (:func:`eviction_undecided`), that it
    evicts as the range's last release does (:func:`replay.engine.evicts_whole`). Where a prefill
    node's config says its KV pool is of another layout (``hybrid_pool``; on decode a disagreement,
    replay.drive), that its pages there are the plain pool's; where any node's requests hold
    recurrent state (``recurrent_state``), that the pages alone carry what a response read."""
    out = []
    for role, name, what in (("decode", "overlap_schedule", "overlap scheduler on"),
                             ("prefill", "prefix_cache", "prefix cache on")):
        unsaid = sorted(node for node, per in configs.items()
                        if any(c.role == role and name not in c.said and (role == "decode" or c.caches_prefixes)
                               for _, _, _, c in per))
        if unsaid:
            out.append(f"{what} (SGLang's default) on {len(unsaid):,} {role} node(s) whose config does not say: "
                       f"{_shown(unsaid)}")
    spanning = sorted(node for node, per in configs.items()
                      if any(c.role == "prefill" and c.caches_prefixes
                             and eviction_undecided(c.engine, c.engine_version) for _, _, _, c in per))
    if spanning:
        out.append(f"the prefix cache evicting as its release range's last release does on {len(spanning):,} prefill "
                   f"node(s) whose logs give releases on both sides of the change (before "
                   f"{'.'.join(map(str, EVICTS_SHORTFALL_FROM))}, the whole amount an allocation asks; from it, "
                   f"what it lacks): {_shown(spanning)}")
    hybrid = sorted(node for node, per in configs.items()
                    if any(c.role == "prefill" and c.hybrid_pool for _, _, _, c in per))
    if hybrid:
        out.append(f"a plain paged KV pool on {len(hybrid):,} prefill node(s) whose config says another layout "
                   f"(SGLang's hybrid sliding-window or unified memory pool): prefill's pages there are one layout of "
                   f"several; decode's pages, and the victims, do not depend on them: {_shown(hybrid)}")
    recurrent = sorted(node for node, per in configs.items() if any(c.recurrent_state for _, _, _, c in per))
    if recurrent:
        out.append(f"the KV pages alone on {len(recurrent):,} node(s) whose requests also hold recurrent state "
                   f"(SGLang's Mamba cache, a hybrid linear-attention model): its slots, handed over with the pages "
                   f"and reused from request to request, are not followed, so what a response read through one is "
                   f"not looked for: {_shown(recurrent)}")
    return tuple(out)


def _shown(nodes: list[str]) -> str:
    """The first few of ``nodes``, and how many more."""
    return ", ".join(nodes[:5]) + (f" and {len(nodes) - 5:,} more" if len(nodes) > 5 else "")


def eviction_undecided(engine: str, version: str) -> bool:
    """Whether an SGLang ``engine_version`` names releases on both sides of
    :data:`~replay.engine.EVICTS_SHORTFALL_FROM` (``0.5.12-0.5.21``, say): how much the prefill's
    prefix cache evicts is then not known from the logs."""
    sides = _sides(version, EVICTS_SHORTFALL_FROM) if engine == "sglang" else None
    return sides is not None and len(sides) == 2


def logged_engine_of(db: Path | str) -> str | None:
    """:func:`logged_engine` of the case ``db``."""
    con = connect(db, read_only=True, create=False)
    try:
        return logged_engine(node_configs(con))
    finally:
        con.close()


def logged_engine(configs: NodeConfigs) -> str | None:
    """The engine behaviour the logs were made with, where the prefill configs say: SGLang before
    0.5.22 hands a length-rejected prompt off as a placeholder; from 0.5.22 it retires it at
    prefill (reference-engine.md; the 0.5.21 wheel already retires, docs/adapters.md). An
    ``engine_version`` may be a range of releases (what an adapter read from the formats,
    ``0.5.12-0.5.15``): it decides where all its releases are on one side. None where no config
    says (another engine, no version, a range across the change)."""
    versions = {(c.engine, c.engine_version) for per in configs.values() for _, _, _, c in per if c.role == "prefill"}
    if len(versions) != 1:
        return None
    (name, version), = versions
    if name != "sglang":
        return None
    sides = _sides(version, HARDENED_FROM)
    return None if sides is None or len(sides) != 1 else ("sglang-hardened" if sides.pop() else "sglang-placeholder")


def _sides(version: str, change: tuple[int, ...]) -> set[bool] | None:
    """For each release an ``engine_version`` names (one, or a range or list of them:
    ``releases_of``), whether it is at or past the release ``change``; None where it names none
    that can be read. Two sides: the logs do not say which side the node ran."""
    releases = releases_of(version)
    if releases is not None:
        return {_numbers(r) >= change for r in releases}
    parts = version.split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        return None
    return {_numbers(version) >= change}


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def _stated(con: Any, keys: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The text of the canonical config lines at ``keys`` (file_id, line_no): where v1.1's
    scheduling fields are, for the ingest keeps a record's known fields only (an adapted record's
    ``doc`` has them all)."""
    if not keys:
        return {}
    con.register("config_lines", pa.table({"file_id": pa.array([k[0] for k in keys], pa.int32()),
                                           "line_no": pa.array([k[1] for k in keys], pa.int64())}))
    try:
        texts = source.texts(con, "config_lines")
    finally:
        con.unregister("config_lines")
    return {(f, n): t for f, n, t in zip(*(texts[c].to_pylist() for c in ("file_id", "line_no", "text")),
                                          strict=True)}


def _scheduling(text: str | None) -> dict[str, bool]:
    """v1.1's scheduling fields a config record's JSON ``text`` states (booleans only; a CSV row or
    anything else says nothing, and the engine's defaults apply)."""
    if text is None or not text.lstrip().startswith("{"):
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return {k: doc[k] for k in V1_1_CONFIG if isinstance(doc, dict) and isinstance(doc.get(k), bool)}
