"""Reclassify's new codes say what the old ones meant, in the other class, and no more."""

from __future__ import annotations

import pytest

from pigeon.policy.delivery import _moved
from pigeon.smtp.replies import Reply


@pytest.mark.parametrize(
    ("code", "enhanced", "moved", "moved_enhanced"),
    [
        (550, "5.1.1", 450, "4.1.1"),  # mailbox unavailable, either way
        (552, "5.2.2", 452, "4.2.2"),  # not enough storage
        (554, "5.7.1", 451, "4.7.1"),  # not 454: "TLS not available temporarily"
        (553, None, 451, None),  # not 453, which is no code at all
        (551, "5.1.6", 451, "4.1.6"),
    ],
)
def test_a_permanent_failure_made_transient_gets_a_4xx_that_means_as_much(
    code: int, enhanced: str | None, moved: int, moved_enhanced: str | None
) -> None:
    reply = _moved(Reply(code, enhanced, ("refused",)), 4, "transient")
    assert (reply.code, reply.enhanced) == (moved, moved_enhanced)
    assert reply.text == f"policy made it transient: {code} refused"


@pytest.mark.parametrize("code", [421, 450, 451, 452, 454])
def test_a_transient_failure_made_permanent_is_always_550(code: int) -> None:
    assert _moved(Reply(code, "4.3.0", ("later",)), 5, "permanent").code == 550
