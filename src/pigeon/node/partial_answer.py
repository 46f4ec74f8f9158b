"""How a node's partial answer names the workers it covers, for people to read.

With several workers, a request the supervisor passes to all of them is answered 503 when not
every one answered (`partial`, `answered`: the indexes of those that did). Its `error`, and the
`pigeon` command's lines, name them as a sentence does: "worker 0", "workers 0 and 2",
"workers 0, 1 and 3", and say "no worker answered" rather than naming none (found from outside:
`covers workers [0] only`, a Python list, and `covers workers none only`). Imported by the CLI:
nothing here may pull the node in.
"""

from __future__ import annotations

from collections.abc import Sequence


def workers_named(indexes: Sequence[object]) -> str:
    """ "worker 0", "workers 0 and 2", "workers 0, 1 and 3" ("" for none: say that otherwise)."""
    names = [str(index) for index in indexes]
    if len(names) <= 1:
        return f"worker {names[0]}" if names else ""
    return f"workers {', '.join(names[:-1])} and {names[-1]}"


def covered(answered: object, *, this: str = "the") -> str:
    """What a partial answer covers: "the answer covers worker 0 only", or "no worker answered".
    `answered`: the answer's own member (a list of indexes; anything else, as a client may get
    it, is said as it is). `this`: "this" where the answer says it of itself."""
    if isinstance(answered, list | tuple):
        named = workers_named(answered)
    else:
        named = f"workers {answered}" if answered else ""
    return f"{this} answer covers {named} only" if named else "no worker answered"
