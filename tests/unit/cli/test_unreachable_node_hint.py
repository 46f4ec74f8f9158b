"""A `pigeon` command that cannot reach the node says where it looked and, when it looked at
the default address because it was told neither the config nor the URL, how to tell it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pigeon.cli.api import ApiClient
from tests.support.ports import free_port


def _unreachable(args: argparse.Namespace, capsys: pytest.CaptureFixture[str]) -> str:
    client = ApiClient(args)
    client.url = f"http://127.0.0.1:{free_port()}"  # (the default 8025 may be anyone's here)
    with pytest.raises(SystemExit) as exited:
        client.fetch("/api/v1/queues")
    assert exited.value.code == 3
    return capsys.readouterr().err


def test_without_c_nor_url_the_hint_says_to_give_the_config_or_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Run away from the node, it only asked "is `pigeon serve` running?" of a node that was.
    monkeypatch.chdir(tmp_path)
    said = _unreachable(argparse.Namespace(config=None, url=None, token=None), capsys)
    assert "(is `pigeon serve` running? This asked the default address: give the node's configuration" in said
    assert "-c FILE" in said and "--url http://HOST:PORT" in said


def test_with_c_the_hint_is_only_whether_the_node_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pigeon.toml").write_text("")
    said = _unreachable(argparse.Namespace(config=tmp_path / "pigeon.toml", url=None, token=None), capsys)
    assert said.rstrip().endswith("(is `pigeon serve` running?)") and "-c FILE" not in said
