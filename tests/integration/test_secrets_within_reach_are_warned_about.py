"""Files holding secrets that other users may read are named in a WARNING (with the `chmod` to
run) by one process of the node, at start and at a reload, once per file while it stays so:
a tester found a `pigeon.toml` with `[[http.token]]` secrets and a TLS private key at mode 0644
started without a word. Nothing is refused."""

from __future__ import annotations

import signal
from pathlib import Path

from pigeon.listener.passwords import set_password
from pigeon.listener.tls import ensure_self_signed
from tests.support.process import PigeonProcess

TOKEN = {"name": "app", "token": "0123456789abcdef0123456789abcdef", "scopes": ["inject"]}


def _warning(path: Path, holds: str, mode: str = "0644") -> str:
    return (
        f"WARNING pigeon.node.node: {path} is readable by other users (mode {mode}), and it holds {holds}: "
        f"chmod 600 {path} (or 640 with a group that only the user Pigeon runs as is in)"
    )


def test_a_config_with_tokens_and_a_tls_key_readable_by_others_are_named_once(tmp_path: Path) -> None:
    certificate, key = ensure_self_signed(tmp_path / "tls", "mx.pigeon.test")
    key.chmod(0o644)
    users = tmp_path / "users"
    set_password(users, "alice", "alice-secret")  # 0600: nothing to say
    smtp = {"tls_certificate": str(certificate), "tls_private_key": str(key), "auth_users": str(users)}
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": 2}, smtp=smtp, tables={"http.token": [TOKEN]})
    pigeon.config_path.chmod(0o644)
    config_warning = _warning(pigeon.config_path, "[[http.token]] secrets")
    key_warning = _warning(key, "the TLS private key ([smtp] tls_private_key)")
    users_warning = _warning(users, "the SMTP users' password hashes ([smtp] auth_users)")
    with pigeon:
        pigeon.wait_stderr(key_warning)
        stderr = pigeon.wait_stderr(config_warning)
        assert str(users) not in stderr
        assert pigeon.process is not None
        # Said once per file, not again at a reload (nor by the other worker); a file that
        # became readable since is named then.
        users.chmod(0o644)
        pigeon.process.send_signal(signal.SIGHUP)
        stderr = pigeon.wait_stderr("reloaded:", 2)
        stderr = pigeon.wait_stderr(users_warning)
        assert stderr.count(config_warning) == 1 and stderr.count(key_warning) == 1, stderr
        assert stderr.count(users_warning) == 1, stderr
        assert "[http] listen" not in stderr  # loopback


def test_a_config_without_secrets_readable_by_others_is_not_warned_about(tmp_path: Path) -> None:
    pigeon = PigeonProcess(tmp_path / "node")
    pigeon.config_path.chmod(0o644)
    with pigeon:
        pigeon.wait_stderr("spool ")
        assert "is readable by" not in pigeon.stderr()
