"""The signing process and thread: signatures come back to the loop, in memory or from a
spilled body; a job that fails fails its own message only; a signing process that dies
fails what it had, and the next message is signed by a new one; a reload signs with the new
keys."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dkim
import msgspec
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from pigeon.config.schema import DkimConfig
from pigeon.dkim import key_process
from pigeon.dkim.key_process import KeyProcess, KeyProcessFailed
from pigeon.dkim.keys import Algorithm, generate_key, load_key, record_text, write_key
from pigeon.dkim.signer import Signer
from pigeon.dkim.signing import Signing, load_signers, shared_key_warnings

MESSAGE = b"From: a@example.com\r\nSubject: x\r\n\r\nbody\r\n"


@pytest.mark.parametrize(
    ("domain", "warned"),
    [
        ("example.co[m]", False),  # a set of one character names one domain
        ("example.co[mm]", False),
        ("example.co[m-m]", False),
        ("example.co[m", False),  # a "[" no "]" closes is itself
        ("example.com", False),
        ("*", True),
        ("*.example.com", True),
        ("mx?.example.com", True),
        ("example.co[mn]", True),
        ("example.co[a-z]", True),
        ("example.co[!m]", True),
    ],
)
def test_only_a_domain_glob_that_can_match_several_domains_is_warned_about(domain: str, warned: bool) -> None:
    config = DkimConfig(domain=domain, selector="s1", private_key=Path("k.pem"))
    expected = (
        f"[[dkim]] #1 ({domain}, selector s1): domain {domain!r} matches more than one domain and there is no "
        "signing_domain: each author domain it matches is signed as d=<that domain> with this one key, so "
        "s1._domainkey.<domain> must be published under every such domain (else its signatures fail); "
        "or set signing_domain"
    )
    assert shared_key_warnings([config]) == ([expected] if warned else [])


def _sign(
    signing: Signing, message: bytes | Path, head: bytes = b"", timestamp: int = 1
) -> asyncio.Future[bytes] | None:
    """`signing.sign` as a future (None: no signer applies)."""
    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def then(signed: bytes | BaseException) -> None:
        if isinstance(signed, BaseException):
            future.set_exception(signed)
        else:
            future.set_result(signed)

    return future if signing.sign(message, head, None, timestamp, then=then) else None


def _process(algorithm: Algorithm) -> KeyProcess:
    """A signing process for one signer of example.com mail."""
    config = DkimConfig(domain="example.com", selector="s", private_key=Path("-"), algorithm=algorithm)
    return KeyProcess([Signer.from_config(config, generate_key(algorithm))])


def _message(n: int) -> bytes:
    """A message of its own for each `n`."""
    return MESSAGE.replace(b"Subject: x", f"Subject: {n}".encode())


def _signing(tmp_path: Path) -> tuple[Signing, bytes]:
    key = generate_key("ed25519-sha256")
    write_key(tmp_path / "k.pem", key)
    config = DkimConfig(domain="example.com", selector="s", private_key=tmp_path / "k.pem", algorithm="ed25519-sha256")
    return Signing(load_signers([config])), record_text(key).encode()


async def test_many_messages_signed_at_once_each_get_their_own_signature(tmp_path: Path) -> None:
    signing, record = _signing(tmp_path)
    messages = [MESSAGE.replace(b"body", b"body %d" % n) for n in range(200)]
    futures = [_sign(signing, m, timestamp=1_700_000_000) for m in messages]
    signed = await asyncio.gather(*[f for f in futures if f is not None])
    assert len(signed) == 200
    for fields, message in zip(signed, messages, strict=True):
        assert dkim.verify(fields + message, dnsfunc=lambda name, timeout=5: record)
    await signing.close()


async def test_a_spilled_body_is_read_and_signed_in_the_thread(tmp_path: Path) -> None:
    signing, record = _signing(tmp_path)
    spilled = tmp_path / "body"
    spilled.write_bytes(MESSAGE)
    future = _sign(signing, spilled, MESSAGE.split(b"\r\n\r\n")[0] + b"\r\n", 1_700_000_000)
    assert future is not None
    assert dkim.verify(await future + MESSAGE, dnsfunc=lambda name, timeout=5: record)
    await signing.close()


async def test_a_failed_job_fails_its_message_and_the_next_is_signed(tmp_path: Path) -> None:
    signing, _ = _signing(tmp_path)
    head = MESSAGE.split(b"\r\n\r\n")[0] + b"\r\n"
    gone = _sign(signing, tmp_path / "no-such-body", head)
    fine = _sign(signing, MESSAGE)
    assert gone is not None and fine is not None
    results = await asyncio.gather(gone, fine, return_exceptions=True)
    assert isinstance(results[0], FileNotFoundError)
    assert isinstance(results[1], bytes) and results[1].startswith(b"DKIM-Signature:")
    await signing.close()


async def test_nothing_is_done_for_mail_no_signer_applies_to(tmp_path: Path) -> None:
    signing, _ = _signing(tmp_path)
    assert _sign(signing, b"From: a@other.test\r\n\r\nx\r\n") is None
    assert _sign(signing, b"Subject: no from\r\n\r\nx\r\n") is None
    await signing.close()


async def test_a_signing_process_that_dies_fails_its_messages_and_a_new_one_signs_the_next(tmp_path: Path) -> None:
    signing, record = _signing(tmp_path)
    first = _sign(signing, MESSAGE)
    assert first is not None and (await first).startswith(b"DKIM-Signature:")
    process = signing._process
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    for _ in range(100):  # its death is noticed (its pipe's end is read)
        if not process.alive:
            break
        await asyncio.sleep(0.01)
    assert not process.alive
    lost = _sign(signing, MESSAGE)
    assert lost is not None
    # The dead process is noticed: this message is signed by a new one (no message is refused
    # for a death noticed before it was asked).
    assert dkim.verify(await lost + MESSAGE, dnsfunc=lambda name, timeout=5: record)
    assert signing._process is not process
    await signing.close()


async def test_after_a_reload_messages_are_signed_with_the_new_keys(tmp_path: Path) -> None:
    signing, old_record = _signing(tmp_path)
    before = _sign(signing, MESSAGE)
    assert before is not None
    new_key = generate_key("ed25519-sha256")
    new = tmp_path / "new.pem"
    write_key(new, new_key)
    config = DkimConfig(domain="example.com", selector="s", private_key=new, algorithm="ed25519-sha256")
    signing.reload([config])
    after = _sign(signing, MESSAGE)
    assert after is not None
    # The message asked before the reload is answered by the old process, with the old key.
    assert dkim.verify(await before + MESSAGE, dnsfunc=lambda name, timeout=5: old_record)
    new_record = record_text(new_key).encode()
    assert dkim.verify(await after + MESSAGE, dnsfunc=lambda name, timeout=5: new_record)
    await signing.close()


async def test_a_reload_that_changes_no_signer_keeps_the_signing_process_and_one_that_does_starts_another(
    tmp_path: Path,
) -> None:
    # Each SIGHUP started a new process (0.2 to 1 s to be ready), and every message to sign
    # waited for it, though nothing of DKIM had changed: 0.8 to 1 s for mail after a reload.
    signing, record = _signing(tmp_path)
    first = _sign(signing, MESSAGE)
    assert first is not None and dkim.verify(await first + MESSAGE, dnsfunc=lambda name, timeout=5: record)
    process = signing._process
    assert process is not None and process.pid is not None
    same = DkimConfig(domain="example.com", selector="s", private_key=tmp_path / "k.pem", algorithm="ed25519-sha256")
    named = DkimConfig(**{**msgspec.structs.asdict(same), "name": "example"})  # (policies choose by name)
    for config in (same, named):
        signing.reload([config])
        again = _sign(signing, MESSAGE)
        assert again is not None and dkim.verify(await again + MESSAGE, dnsfunc=lambda name, timeout=5: record)
        assert signing._process is process and process.alive
    signing.reload([DkimConfig(**{**msgspec.structs.asdict(same), "selector": "t"})])
    other = _sign(signing, MESSAGE)
    assert other is not None and b"s=t;" in await other
    assert signing._process is not process and signing._process is not None
    assert signing._process.pid != process.pid
    await signing.close()


def test_a_key_file_read_again_is_parsed_again_only_if_it_changed(tmp_path: Path) -> None:
    # An RSA key's parse checks it: 45 to 90 ms holding the GIL, twice a key at every reload.
    path = tmp_path / "k.pem"
    write_key(path, generate_key("rsa-sha256"))
    key = load_key(path, "rsa-sha256")
    assert load_key(path, "rsa-sha256") is key
    path.unlink()
    write_key(path, generate_key("rsa-sha256"))
    assert load_key(path, "rsa-sha256") is not key


async def test_an_answer_whose_taker_fails_is_logged_and_the_next_answer_still_arrives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    process = _process("ed25519-sha256")
    await process.start()
    answered: asyncio.Future[list[bytes | str] | BaseException] = asyncio.get_running_loop().create_future()

    def broken(answer: list[bytes | str] | BaseException) -> None:
        raise RuntimeError("a bug in the message's path")

    process.sign([[[0], _message(1), 1]], broken)
    process.sign([[[0], _message(2), 1]], answered.set_result)
    answer = await asyncio.wait_for(answered, 10)
    assert isinstance(answer, list) and isinstance(answer[0], bytes) and answer[0].startswith(b"DKIM-Signature:")
    assert process.alive
    assert "handing back a DKIM signature failed" in caplog.text
    await process.aclose()


async def test_a_closed_signing_process_answers_everything_it_was_asked_before_it_ends() -> None:
    # As after a reload: the old process is closed with requests out, and must answer them all
    # (its exit and the end of its output are reported separately: only the latter ends them).
    process = _process("rsa-sha256")
    await process.start()
    loop = asyncio.get_running_loop()
    answers: list[asyncio.Future[list[bytes | str] | BaseException]] = [loop.create_future() for _ in range(100)]
    for n, answered in enumerate(answers):
        process.sign([[[0], _message(n), 1]], answered.set_result)
    process.close()
    got = await asyncio.wait_for(asyncio.gather(*answers), 30)
    assert all(isinstance(answer, list) and isinstance(answer[0], bytes) for answer in got), [
        answer for answer in got if not isinstance(answer, list)
    ][:1]
    await process.aclose()


async def test_a_stuck_signing_process_fails_its_messages_in_time_and_a_new_one_signs_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_process, "ANSWER_TIMEOUT", 0.5)
    signing, record = _signing(tmp_path)
    first = _sign(signing, MESSAGE)
    assert first is not None and (await first).startswith(b"DKIM-Signature:")
    process = signing._process
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGSTOP)  # alive, and answering nothing
    stuck = _sign(signing, MESSAGE)
    assert stuck is not None
    started = time.monotonic()
    with pytest.raises(KeyProcessFailed, match=r"did not answer within 0\.5s"):
        await asyncio.wait_for(stuck, 10)
    assert time.monotonic() - started < 2
    assert "did not answer within 0.5s: killed" in caplog.text
    after = _sign(signing, MESSAGE)
    assert after is not None
    assert dkim.verify(await asyncio.wait_for(after, 10) + MESSAGE, dnsfunc=lambda name, timeout=5: record)
    assert signing._process is not process
    await signing.close()


async def test_a_busy_machine_starting_the_signing_process_slowly_fails_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The interpreter takes 1.5 s to start here, three times a signature's deadline: the start
    # is timed on its own, so the first messages wait for it and are signed. (A deadline left
    # ample for the signatures themselves: at 0.01 s, a loaded machine once missed it.)
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 1.5\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    monkeypatch.setattr(key_process, "ANSWER_TIMEOUT", 0.5)
    process = _process("ed25519-sha256")
    await process.start()
    loop = asyncio.get_running_loop()
    answers: list[asyncio.Future[list[bytes | str] | BaseException]] = [loop.create_future() for _ in range(3)]
    for n, answered in enumerate(answers):
        process.sign([[[0], _message(n), 1]], answered.set_result)
    got = await asyncio.wait_for(asyncio.gather(*answers), 30)
    assert all(isinstance(answer, list) and isinstance(answer[0], bytes) for answer in got), got
    await process.aclose()


async def test_a_signing_process_stuck_before_it_is_ready_fails_its_messages_after_the_start_timeout(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_process, "START_TIMEOUT", 0.5)
    process = _process("ed25519-sha256")
    await process.start()
    assert process.pid is not None
    os.kill(process.pid, signal.SIGSTOP)  # still importing: it has not loaded the keys
    answered: asyncio.Future[list[bytes | str] | BaseException] = asyncio.get_running_loop().create_future()
    process.sign([[[0], MESSAGE, 1]], answered.set_result)
    started = time.monotonic()
    answer = await asyncio.wait_for(answered, 10)
    assert isinstance(answer, KeyProcessFailed) and "did not start within 0.5s" in str(answer)
    assert time.monotonic() - started < 2
    assert "did not start within 0.5s: killed" in caplog.text
    assert not process.alive
    await process.aclose()


async def test_a_message_the_signing_process_cannot_sign_fails_alone_and_the_next_is_signed() -> None:
    process = _process("ed25519-sha256")
    await process.start()
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[list[bytes | str] | BaseException] = loop.create_future()
    signed: asyncio.Future[list[bytes | str] | BaseException] = loop.create_future()
    process.sign([[[7], MESSAGE, 1]], failed.set_result)  # a signer it was never given
    process.sign([[[0], MESSAGE, 1]], signed.set_result)
    assert await asyncio.wait_for(failed, 10) == ["IndexError: tuple index out of range"]
    answer = await asyncio.wait_for(signed, 10)
    assert isinstance(answer, list) and isinstance(answer[0], bytes) and answer[0].startswith(b"DKIM-Signature:")
    assert process.alive
    await process.aclose()


@pytest.mark.parametrize("gone", ["its output closed", "a frame cut short"])
def test_a_signing_process_whose_worker_is_gone_ends_without_a_word(gone: str) -> None:
    """A worker killed mid-request left a BrokenPipeError (or a msgspec DecodeError) traceback
    of its signing process on the node's stderr."""
    process = _process("ed25519-sha256")
    pems = [key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) for key in process.keys]
    specs = [key_process._spec(signer, 0) for signer in process.signers]
    child = subprocess.Popen(
        [sys.executable, "-P", "-m", "pigeon.dkim.key_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    key_process._write_frame(child.stdin, [pems, specs])
    assert key_process._read_frame(child.stdout) == 1  # ready: one key loaded
    if gone == "its output closed":
        child.stdout.close()  # (its answer to what follows has nowhere to go)
        key_process._write_frame(child.stdin, [[[0], MESSAGE, 1]])
    else:
        frame = key_process._LENGTH.pack(1000) + b"\x91" * 10  # the worker died writing it
        child.stdin.write(frame)
    child.stdin.close()
    assert child.stderr is not None
    with child.stderr:
        stderr = child.stderr.read()  # (until it ends)
    assert (child.wait(30), stderr.decode()) == (0, "")
    if not child.stdout.closed:
        child.stdout.close()
