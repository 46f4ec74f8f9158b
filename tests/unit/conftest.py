"""Fixtures for the unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

import pytest

from tests.support.queue_world import World, destination


class MakeWorld(Protocol):
    def __call__(self, sites: dict[str, str], cached: Iterable[str] = (), **options: Any) -> World: ...


@pytest.fixture
async def make_world() -> AsyncIterator[MakeWorld]:
    """Queue engines in one process (tests/support/queue_world.py), routing `sites` (domain ->
    site); the `cached` domains' routes are known at once (no lookup). Closed after the test."""
    worlds: list[World] = []

    def make(sites: dict[str, str], cached: Iterable[str] = (), **options: Any) -> World:
        world = World(**options).build(sites)
        for domain in cached:
            world.routes.cache[domain] = destination(sites[domain])
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        await world.close()
