"""Mail loops (RFC 5321 6.3): a message that would leave with more than `[smtp] max_hops`
Received fields, Pigeon's own included (it came with `max_hops` or more), is refused with
554 5.4.6 at every door (SMTP DATA and BDAT, POST /api/v1/inject, `pigeon inject`), however
far down its header section they are; and a node that signs with DKIM and is routed to
itself stops the loop after max_hops receptions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pigeon.dkim.keys import generate_key, write_key
from tests.support import zygote
from tests.support.process import PigeonProcess, to_toml
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config
from tests.support.tcp_proxy import TcpProxy

TOKEN = "loops-token-0123456789"
LOOP = "554 5.4.6 Too many hops: mail loop detected (RFC 5321 6.3)"
# Over 64 KiB of fields above the Received ones, as a hop that puts a DKIM signature (or any
# big field) on top of each Received field piles up.
FILLER = b"".join(b"X-Filler-%03d: " % n + b"a" * 900 + b"\r\n" for n in range(80))


def _message(received: int, *, name: bytes = b"Received:", filler: bytes = FILLER) -> bytes:
    hops = b"".join(name + b" from hop%d.test; Mon, 1 Jan 2024 00:00:00 +0000\r\n" % n for n in range(received))
    return filler + hops + b"From: <app@example.org>\r\nSubject: loop\r\n\r\nbody\r\n"


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path_factory.mktemp("loops") / "node", http={"token": tokens}) as node:
        yield node


def _data(pigeon: PigeonProcess, message: bytes) -> str:
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<data@example.net>")
        smtp.expect(354, "DATA")
        smtp.send(message + b".\r\n")
        code, text = smtp.reply()
        return f"{code} {text[-1]}"


def _bdat(pigeon: PigeonProcess, message: bytes) -> str:
    """In chunks of 3 KiB: a Received field or the header end may be split between two."""
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<bdat@example.net>")
        chunks = [message[at : at + 3000] for at in range(0, len(message), 3000)]
        for chunk in chunks[:-1]:
            smtp.send(b"BDAT %d\r\n" % len(chunk) + chunk)
            smtp.expect(250)
        smtp.send(b"BDAT %d LAST\r\n" % len(chunks[-1]) + chunks[-1])
        code, text = smtp.reply()
        return f"{code} {text[-1]}"


def _http(pigeon: PigeonProcess, message: bytes) -> str:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "http@example.net"}],
        "content": message.decode(),
        "template": False,
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    if status == 400:  # the content's fault, whoever the recipient: the request is refused
        assert answer["field"] == "$.content", answer
        return str(answer["error"])
    assert status == 200, answer
    (result,) = answer["recipients"]
    return result.get("error") or "250 " + result["id"]


def _cli(pigeon: PigeonProcess, message: bytes, directory: Path) -> str:
    path = directory / "message.eml"
    path.write_bytes(message)
    command = ["inject", "-c", str(pigeon.config_path), "--token", TOKEN]
    command += ["--json", "--no-template", "--from", "app@example.org", "--to", "cli@example.net", str(path)]
    done = zygote.run(command, text=True, timeout=60, check=False)
    if done.returncode == 2:  # refused whole (400), as README's exit table says
        return done.stderr.strip().removeprefix("pigeon: 400: ").removesuffix(" ($.content)")
    (result,) = json.loads(done.stdout)["recipients"]
    return result.get("error") or "250 " + result["id"]


def _door(pigeon: PigeonProcess, door: str, tmp_path: Path) -> Callable[[bytes], str]:
    """How a message goes in through `door`: a function of the message, answering the reply."""
    return {
        "data": lambda m: _data(pigeon, m),
        "bdat": lambda m: _bdat(pigeon, m),
        "http": lambda m: _http(pigeon, m),
        "cli": lambda m: _cli(pigeon, m, tmp_path),
    }[door]


@pytest.mark.parametrize("door", ["data", "bdat", "http", "cli"])
def test_a_loop_is_refused_at_every_door_with_its_received_fields_past_64_kib_of_other_fields(
    pigeon: PigeonProcess, door: str, tmp_path: Path
) -> None:
    send = _door(pigeon, door, tmp_path)
    before = len(pigeon.spool_messages())
    # 100 Received fields and ours: one too many (max_hops = 100).
    assert send(_message(100)) == LOOP
    assert len(pigeon.spool_messages()) == before
    # 99 and ours: as many as allowed.
    assert send(_message(99)).startswith("250 ")
    assert len(pigeon.spool_messages()) == before + 1


@pytest.mark.parametrize("where", ["first", "past-64-kib"])
@pytest.mark.parametrize("door", ["data", "bdat", "http", "cli"])
def test_received_fields_with_white_space_before_the_colon_count_as_hops_at_every_door(
    pigeon: PigeonProcess, door: str, where: str, tmp_path: Path
) -> None:
    """`Received : from ...` (RFC 5322 4.5's obsolete form) is a Received field to the next
    hop that counts them, as `From :` is a From to the single-field check: 101 of them were
    taken, and a loop of such hops would never end."""
    send = _door(pigeon, door, tmp_path)
    filler = FILLER if where == "past-64-kib" else b""
    before = len(pigeon.spool_messages())
    tabbed = b"".join(b"Received\t: from tab%d.test; Mon, 1 Jan 2024 00:00:00 +0000\r\n" % n for n in range(50))
    assert send(_message(50, name=b"Received :", filler=filler + tabbed)) == LOOP  # 50 of each, and ours
    assert send(_message(100, name=b"RECEIVED  :", filler=filler)) == LOOP
    assert len(pigeon.spool_messages()) == before
    assert send(_message(99, name=b"Received :", filler=filler)).startswith("250 ")
    assert len(pigeon.spool_messages()) == before + 1


def test_a_node_that_signs_and_is_routed_to_itself_stops_the_loop_at_max_hops(tmp_path: Path) -> None:
    # Each hop puts a DKIM-Signature (about 700 bytes) above the Received field of the hop
    # before: past the 90th or so, the oldest Received fields are over 64 KiB down.
    key = tmp_path / "key.pem"
    write_key(key, generate_key("rsa-sha256"))
    dkim = [{"domain": "example.org", "selector": "s1", "private_key": key}]
    pigeon = PigeonProcess(tmp_path / "node", dkim=dkim)
    # Mail for loop.test goes back to the node itself, through a TCP proxy (a loop through
    # other hosts: a route straight to the node's own listener is refused at once, see
    # test_delivery_loops); anything else (the DSN) to the sink.
    with ScriptedSink() as sink, TcpProxy(pigeon.smtp_port) as proxy:
        pigeon.config.update(delivery_config(sink.endpoint))
        pigeon.config["route"].insert(
            0, {"domain": "loop.test", "next_hop": f"127.0.0.1:{proxy.port}", "tls": "disabled"}
        )
        pigeon.config_path.write_text(to_toml(pigeon.config))
        with pigeon:
            with RawSmtp(pigeon.smtp_port) as smtp:
                smtp.expect(220)
                smtp.expect(250, "EHLO client.test")
                smtp.expect(250, "MAIL FROM:<app@example.org>")
                smtp.expect(250, "RCPT TO:<user@loop.test>")
                smtp.expect(354, "DATA")
                smtp.send(b"From: <app@example.org>\r\nSubject: round and round\r\n\r\nbody\r\n.\r\n")
                smtp.expect(250)
            (bounce,) = pigeon.wait_records("Bounce", timeout=120)
            assert bounce["response"]["code"] == 554 and bounce["response"]["enhanced"] == "5.4.6", bounce
            (dsn,) = sink.wait_for(1)
            assert dsn.recipients == ["app@example.org"]
            receptions = [r for r in pigeon.records("Reception") if r["recipients"] == ["user@loop.test"]]
            assert len(receptions) == 100  # the first, from the client, and 99 from itself


def test_a_template_with_too_many_received_fields_is_refused_per_recipient_with_422_not_400(
    pigeon: PigeonProcess,
) -> None:
    """README lists the template faults answered 400 and those answered per recipient: the
    loop check is one of the latter (each recipient's message is checked as rendered)."""
    message = _message(100, filler=b"").replace(b"Subject: loop", b"Subject: {{ name }}")
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "t1@example.net", "name": "one"}, {"email": "t2@example.net", "name": "two"}],
        "content": message.decode(),
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 422, answer
    assert [r["error"] for r in answer["recipients"]] == [LOOP, LOOP]
