"""What the HTTP handlers may ask of the node, without importing the node itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from pigeon.config.schema import Config
from pigeon.metrics import Metrics

if TYPE_CHECKING:
    from pigeon.intake import Intake
    from pigeon.listener.http.auth import Tokens
    from pigeon.node.broadcast import Broadcast
    from pigeon.queue.admin import Admin
    from pigeon.shaping.effects import Board


class NodeView(Protocol):
    metrics: Metrics
    config: Config
    intake: Intake
    tokens: Tokens

    @property
    def admin(self) -> Admin | None: ...

    @property
    def reader(self) -> Admin | None:
        """The admin that answers reads: `admin`, or, delivery disabled, one over the spool alone."""
        ...

    @property
    def broadcast_front(self) -> Broadcast | None: ...

    @property
    def effects(self) -> Board | None: ...

    def forgot(self, entries: dict[str, float]) -> None:
        """The cluster forgot these presence entries (hash field -> when the node was last there):
        this worker gives that back, should Redis lose its data (`pigeon.node.presence.forget`)."""
        ...

    def health(self) -> dict[str, Any]: ...


NODE_KEY: web.AppKey[NodeView] = web.AppKey("node")


def from_supervisor(request: web.Request) -> bool:
    """Whether the request came over this worker's unix control socket (from its supervisor),
    not from a client over TCP. A request whose client has gone (no transport) is a client's:
    what only a supervisor may say (rule generations, `via`, a body over the limit) is never
    taken on a guess."""
    transport = request.transport
    return transport is not None and not isinstance(transport.get_extra_info("peername"), tuple)
