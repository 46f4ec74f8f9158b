"""A policy module that raises SystemExit (`sys.exit(0)`) or KeyboardInterrupt as it is imported
fails to load, as one with a SyntaxError does: a SIGHUP keeps the old hooks and says why, a start
and `serve --check` say it "cannot be loaded" and exit 2. Found from outside: at a SIGHUP the node
of one process stopped (exit 0: `Restart=on-failure` did not start it again), the workers of two
exited and crash-looped (/healthz down), and a start or a check ended with a bare traceback and
exit 0, 1 or 130. (A real stop during a start's import still stops: test_signals_at_start.py.)"""

from __future__ import annotations

import signal
import smtplib
from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.support.attacks import worker_pids
from tests.support.process import PigeonProcess

REFUSING = "from pigeon.policy import Refuse\ndef on_mail_from(mail):\n    return Refuse(550, 'old hooks')\n"
EXITS = {
    "SystemExit": ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
}


def _mail_from(pigeon: PigeonProcess) -> tuple[int, bytes]:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
        client.ehlo("client.test")
        return client.mail("a@example.org")


@pytest.mark.parametrize(("kind", "workers"), [("SystemExit", 1), ("KeyboardInterrupt", 2)])
def test_a_reload_of_a_module_that_exits_at_import_keeps_the_old_hooks_and_the_node_serves(
    tmp_path: Path, kind: str, workers: int
) -> None:
    module = tmp_path / "mypolicy.py"
    module.write_text(REFUSING)
    appended, said = EXITS[kind]
    with PigeonProcess(tmp_path / "node", policy={"module": str(module)}, node={"workers": workers}) as pigeon:
        assert pigeon.process is not None
        assert _mail_from(pigeon) == (550, b"5.7.1 old hooks")
        serving = sorted(worker_pids(pigeon))
        module.write_text(REFUSING + appended)
        pigeon.process.send_signal(signal.SIGHUP)
        line = 5 if kind == "SystemExit" else 4
        failed = f"policy module {module} cannot be loaded: {module}:{line}: {said}"
        # Said by each worker, as for a SyntaxError.
        pigeon.wait_stderr(f"reload: the policy module stays as it was: {failed}", workers)
        pigeon.wait_stderr("(the module as it was)", workers)
        # The same processes serve on, with the hooks they had.
        assert pigeon.process.poll() is None
        assert sorted(worker_pids(pigeon)) == serving
        assert pigeon.http_get("/healthz")[0] == 200
        for _ in range(4):
            assert _mail_from(pigeon) == (550, b"5.7.1 old hooks")
        assert "stopping" not in pigeon.stderr()


@pytest.mark.parametrize("kind", sorted(EXITS))
def test_serve_check_of_a_module_that_exits_at_import_says_it_cannot_be_loaded_and_exits_2(
    tmp_path: Path, kind: str
) -> None:
    appended, said = EXITS[kind]
    (tmp_path / "mypolicy.py").write_text(REFUSING + appended)
    config = tmp_path / "pigeon.toml"
    config.write_text('[spool]\npath = "spool"\n[policy]\nmodule = "mypolicy"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    module = tmp_path / "mypolicy.py"
    line = 5 if kind == "SystemExit" else 4
    assert (
        result.stderr
        == f"pigeon: configuration error: policy module {module} cannot be loaded: {module}:{line}: {said}\n"
    )


@pytest.mark.parametrize(("kind", "workers"), [("SystemExit", 1), ("KeyboardInterrupt", 1), ("SystemExit", 2)])
def test_a_start_with_a_module_that_exits_at_import_says_it_cannot_be_loaded_and_exits_2(
    tmp_path: Path, kind: str, workers: int
) -> None:
    appended, said = EXITS[kind]
    module = tmp_path / "mypolicy.py"
    module.write_text(REFUSING + appended)
    pigeon = PigeonProcess(tmp_path / "node", policy={"module": str(module)}, node={"workers": workers})
    try:
        pigeon.start(wait=False)
        assert pigeon.wait_exit() == 2, pigeon.stderr()
        assert f"cannot start: policy module {module} cannot be loaded: {module}:" in pigeon.stderr()
        assert said in pigeon.stderr()
    finally:
        pigeon.kill()
