"""What the HTTP handlers may ask of the node, without importing the node itself."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from pigeon.metrics import Metrics


class NodeView(Protocol):
    metrics: Metrics

    def health(self) -> dict[str, Any]: ...


NODE_KEY: web.AppKey[NodeView] = web.AppKey("node")
