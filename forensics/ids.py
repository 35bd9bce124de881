"""The ids of the domain as types that must not mix: a request id is never a tenant id."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NewType

RequestId = NewType("RequestId", str)
TenantId = NewType("TenantId", str)
NodeId = NewType("NodeId", str)  # a node as it logs itself: prefill-0, decode-3, router
PageId = NewType("PageId", int)  # an id in [0, pool_pages) of the node's config in force

#: A KV pool of one DP rank of a server with DP attention is a node of its own: ``decode-0.dp1``.
_DP_POOL = re.compile(r"^(?P<server>.+)\.dp(?P<rank>\d+)$")


def dp_pool_node(server: str, rank: int) -> str:
    """The node of DP rank ``rank``'s KV pool on ``server`` (the SGLang adapter names them so)."""
    return f"{server}.dp{rank}"


def dp_pools(nodes: Iterable[str]) -> dict[str, list[tuple[int, str]]]:
    """The DP pools among ``nodes``: server -> its pools as (rank, node), by rank; servers in order."""
    found: dict[str, list[tuple[int, str]]] = {}
    for node in sorted(set(nodes)):
        if (m := _DP_POOL.match(node)) is not None:
            found.setdefault(m["server"], []).append((int(m["rank"]), node))
    return {server: sorted(pools) for server, pools in found.items()}
