"""`pigeon inject`'s refusals say what they are about, as whole sentences: the node's 400 for a
tenant or campaign that cannot name a queue began with the verb (`is 'inbound': its queues
...`, `contains ' ': ...`), its subject left to the field after it; a message file that could
not be read was Python's `[Errno 2] No such file or directory: 'x.eml'`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess

INBOUND = "its queues (inbound:...) would be taken for the [[inbound]] routes' own, which are named so"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path_factory.mktemp("subjects") / "node") as pigeon:
        yield pigeon


def _inject(node: PigeonProcess, *args: str, cwd: Path | None = None) -> tuple[int, str]:
    command = ["inject", "-c", str(node.config_path), "--from", "me@example.org", "--to", "you@example.net", *args]
    result = zygote.run(command, text=True, timeout=60, cwd=cwd)
    return result.returncode, result.stderr


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--campaign", "inbound", f"campaign is 'inbound': {INBOUND} (it names a queue) ($.campaign)"),
        ("--tenant", "a b", "tenant contains ' ': no white space, ':' or '@' allowed (it names a queue) ($.tenant)"),
        ("--tenant", "a\rb", "tenant must not contain a CR: the value is written into a header as it is ($.tenant)"),
    ],
)
def test_a_tenant_or_campaign_refused_is_named_in_the_node_s_error(
    node: PigeonProcess, option: str, value: str, said: str
) -> None:
    assert _inject(node, "--text", "hi", option, value) == (2, f"pigeon: 400: {said}\n")


def test_a_message_file_that_cannot_be_read_is_said_as_the_commands_say_it(node: PigeonProcess, tmp_path: Path) -> None:
    said = "pigeon inject: cannot read nonexist.eml: No such file or directory\n"
    assert _inject(node, "nonexist.eml", cwd=tmp_path) == (2, said)
    assert _inject(node, "--text", "hi", "--attach", "gone.pdf", cwd=tmp_path) == (
        2,
        "pigeon inject: cannot read gone.pdf: No such file or directory\n",
    )
