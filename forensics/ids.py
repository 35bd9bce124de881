"""The ids of the domain as types that must not mix: a request id is never a tenant id."""

from __future__ import annotations

from typing import NewType

RequestId = NewType("RequestId", str)
TenantId = NewType("TenantId", str)
NodeId = NewType("NodeId", str)  # a node as it logs itself: prefill-0, decode-3, router
PageId = NewType("PageId", int)  # an id in [0, pool_pages) of the node's config in force
