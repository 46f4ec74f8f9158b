"""The cyclic garbage collector of a `pigeon serve` process: off while it starts, then tuned.

Importing and starting a node makes some 55,000 objects that live until exit (modules,
classes, functions, the configuration). The collector, run every 700 allocations, goes over
them again and again meanwhile (about a tenth of a start's CPU, measured) and finds almost
nothing to free: the few thousand cyclic leftovers of the imports (~0.3 MB). So `serve` turns
it off first thing (`pause`), and once the process has started (`started`) whatever start-up
made is frozen out of every later collection (leftovers included, at the cost of that memory)
and the collector runs again: as usual in a supervisor, and in a node less often (see
`Node`'s `_tune_garbage_collector`). A process that waits during its start (a full disk)
collects as usual meanwhile (`started` too, early).
"""

from __future__ import annotations

import gc


def pause() -> None:
    """No cyclic collection until `started`: called before the imports of `pigeon serve`."""
    gc.disable()


def started() -> None:
    """Freeze what start-up made out of later collections, and collect again from now on.
    Idempotent, and harmless in a process that never paused (a test running a node)."""
    gc.freeze()
    gc.enable()
