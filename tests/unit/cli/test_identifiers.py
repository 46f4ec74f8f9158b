"""Ids typed by an operator go into API paths: only ids get there. `pigeon shaping end
'../../admin/suspend/ID'` resumed that suspension (found from outside), and an id with a space
crashed with a traceback."""

from __future__ import annotations

import pytest

from pigeon.cli.main import main


@pytest.mark.parametrize(
    "argv",
    [
        ["shaping", "end", "../../admin/suspend/f5e0417957f6"],
        ["shaping", "end", "bad id!"],
        ["resume", "../bounce/abc"],
        ["bounce", "--cancel", "a/b"],
        ["inspect", "..%2Fx"],
    ],
)
def test_an_id_that_is_not_one_is_refused_before_any_request(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--url", "http://127.0.0.1:9", "--token", "t"])
    assert exited.value.code == 2
    assert "is not an id" in capsys.readouterr().err
