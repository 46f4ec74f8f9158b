"""Loading a policy module and calling its hooks: resolved once, bounded, never fatal."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest

from pigeon.config.schema import PolicyConfig, PositiveDuration
from pigeon.logs.records import PolicyFailure
from pigeon.node import signals
from pigeon.policy import Changes, Defer, Fail, Headers, Reclassify, Refuse, Reroute
from pigeon.policy.answers import folded_field
from pigeon.policy.hooks import (
    POLICY_ERROR,
    POLICY_TIMEOUT,
    HookFailed,
    Policy,
    PolicyLoadError,
    _raised_by_hook,
    at_greeting,
    refusal,
)
from pigeon.policy.objects import ReceivedMessage


def _policy(tmp_path: Path, source: str, **options: object) -> Policy:
    path = tmp_path / "policy.py"
    path.write_text(textwrap.dedent(source))
    policy = Policy(str(path), **options)  # type: ignore[arg-type]
    policy.load()
    return policy


def test_a_hook_the_module_does_not_define_is_none_and_the_others_are_resolved(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "def on_mail_from(mail):\n    return None\n")
    assert policy.on_mail_from is not None and policy.on_mail_from.mode == "inline"
    assert policy.defined() == ["on_mail_from"]
    for name in ("on_connect", "on_rcpt_to", "on_message", "before_delivery", "on_delivery_outcome"):
        assert getattr(policy, name) is None


def test_no_module_means_no_hooks() -> None:
    policy = Policy()
    assert policy.load() == [] and policy.defined() == []


def test_a_misspelt_hook_name_is_warned_about(tmp_path: Path) -> None:
    """Said by the caller (`Policy.warnings`), as the configuration's warnings are: `serve
    --check` prints them as `pigeon: warning: ...`, the node logs them."""
    policy = _policy(tmp_path, "def on_mail(mail):\n    pass\n")
    hooks = "on_connect, on_mail_from, on_rcpt_to, on_message, before_delivery, on_delivery_outcome"
    assert policy.warnings == (
        f"policy {tmp_path / 'policy.py'}: on_mail is not a hook name and is never called (did you mean "
        f"on_mail_from?); the hooks are {hooks}",
    )
    assert _policy(tmp_path, "def on_mail_from(mail):\n    pass\n").warnings == ()


def test_a_hook_name_in_the_wrong_case_is_warned_about(tmp_path: Path) -> None:
    # Found from outside: On_Connect, never called (a hook is looked up by its exact name), was said nothing of.
    policy = _policy(
        tmp_path, "def On_Connect(c):\n    pass\ndef BEFORE_DELIVERY(d):\n    pass\ndef On_Data(m):\n    pass\n"
    )
    said = [warning.partition(": ")[2].partition(";")[0] for warning in policy.warnings]
    assert said == [
        "BEFORE_DELIVERY is not a hook name and is never called (did you mean before_delivery?)",
        "On_Connect is not a hook name and is never called (did you mean on_connect?)",
        "On_Data is not a hook name and is never called (did you mean on_message?)",
    ]
    assert Policy(str(tmp_path / "policy.py")).prepare(warn=False).warnings == ()


def test_a_hook_that_cannot_take_its_one_argument_is_refused_at_load(tmp_path: Path) -> None:
    # Not a TypeError at every delivery attempt: the start (or the reload) says what is wrong.
    with pytest.raises(
        PolicyLoadError,
        match=r"before_delivery\(d, extra\) cannot take it .*'extra'.*Pigeon calls it with one argument",
    ):
        _policy(tmp_path, "def before_delivery(d, extra):\n    pass\n")
    with pytest.raises(PolicyLoadError, match=r"on_connect\(\) cannot take it"):
        _policy(tmp_path, "def on_connect():\n    pass\n")
    # Defaults, *args and async hooks that take one argument are fine.
    source = "def on_connect(c, extra=1):\n    pass\nasync def on_message(*args):\n    pass\n"
    assert _policy(tmp_path, source).defined() == ["on_connect", "on_message"]


def test_a_module_that_cannot_be_imported_is_refused_with_its_reason(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="ZeroDivisionError: division by zero"):
        _policy(tmp_path, "x = 1 / 0\n")
    with pytest.raises(PolicyLoadError, match="on_connect is not a function"):
        _policy(tmp_path, "on_connect = 42\n")
    with pytest.raises(PolicyLoadError, match="no such file"):
        Policy(str(tmp_path / "missing.py")).load()


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        ("import sys\nsys.exit(0)", "SystemExit: 0"),
        ("raise SystemExit('policy wants out')", "SystemExit: policy wants out"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
        ("raise GeneratorExit", "GeneratorExit"),
        ("raise BaseException('bare')", "BaseException: bare"),
    ],
)
def test_a_module_that_raises_a_base_exception_at_import_cannot_be_loaded(
    tmp_path: Path, raised: str, said: str
) -> None:
    # Its failure, as a SyntaxError is (found from outside: a sys.exit(0) stopped the node at a SIGHUP).
    with pytest.raises(PolicyLoadError, match=rf"policy\.py:\d: {re.escape(said)}$") as failed:
        _policy(tmp_path, f"def on_connect(c):\n    pass\n{raised}\n")
    assert failed.value.__cause__ is not None and failed.value.__cause__.__traceback__ is not None
    assert failed.value.__cause__.__traceback__.tb_frame.f_code.co_filename == str(tmp_path / "policy.py")


def test_a_ctrl_c_during_the_import_is_a_stop_not_the_modules_failure(tmp_path: Path) -> None:
    """A KeyboardInterrupt a real SIGINT raises in the main thread (`serve --check`, whose SIGINT
    is Python's default) goes on; the node's own stop (`signals.stoppable`) too, as `Stopped`."""
    source = "import os, signal, time\nos.kill(os.getpid(), signal.{signal})\ntime.sleep(5)\n"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _policy(tmp_path, source.format(signal="SIGINT"))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was
        for stop in ("SIGINT", "SIGTERM"):
            with pytest.raises(signals.Stopped, match=stop), signals.stoppable():
                _policy(tmp_path, source.format(signal=stop))
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_failed_reload_keeps_the_hooks_it_had(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "def on_connect(c):\n    return None\n")
    first = policy.on_connect
    (tmp_path / "policy.py").write_text("def on_connect(c) oops\n")
    with pytest.raises(PolicyLoadError, match="SyntaxError"):
        policy.load()
    assert policy.on_connect is first
    (tmp_path / "policy.py").write_text("def on_mail_from(m):\n    return None\n")
    policy.load()
    assert policy.on_connect is None and policy.on_mail_from is not None


def test_a_dotted_module_that_fails_half_way_through_a_reload_leaves_the_running_hooks_globals_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload runs the module in a fresh module object (in a thread, beside hooks still
    running): the running hooks' globals are never half overwritten, as `importlib.reload`
    would leave them, and `sys.modules` names the new module only once it is taken."""
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "pigeon_test_dotted_policy.py"
    module.write_text("LIMIT = 1\ndef on_connect(c):\n    return None\n")
    policy = Policy("pigeon_test_dotted_policy")
    policy.load()
    running = policy.on_connect
    assert running is not None and running.function.__globals__["LIMIT"] == 1
    module.write_text("LIMIT = 2\nraise RuntimeError('half way')\n")
    with pytest.raises(PolicyLoadError, match="half way"):
        policy.load()
    assert policy.on_connect is running and running.function.__globals__["LIMIT"] == 1
    assert sys.modules["pigeon_test_dotted_policy"] is policy.module
    module.write_text("LIMIT = 3\ndef on_mail_from(m):\n    return None\n")
    prepared = policy.prepare()
    assert sys.modules["pigeon_test_dotted_policy"] is not (prepared and prepared.module)  # not yet taken
    assert policy.take(prepared) == ["on_mail_from"]
    assert sys.modules["pigeon_test_dotted_policy"] is policy.module
    assert policy.module is not None and policy.module.LIMIT == 3 and running.function.__globals__["LIMIT"] == 1
    del sys.modules["pigeon_test_dotted_policy"]


def test_a_dotted_name_from_elsewhere_does_not_put_the_config_directory_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config file's directory goes first on sys.path only when the module is found there:
    else a file beside the config (a json.py, say) would stand in for any module, process-wide."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    site = tmp_path / "site"
    site.mkdir()
    (site / "pigeon_test_site_policy.py").write_text("def on_connect(c):\n    return None\n")
    monkeypatch.syspath_prepend(str(site))
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    Policy("pigeon_test_site_policy", directory=config_dir).load()
    assert str(config_dir) not in sys.path
    (config_dir / "pigeon_test_beside").mkdir()
    (config_dir / "pigeon_test_beside" / "__init__.py").write_text("")
    (config_dir / "pigeon_test_beside" / "pol.py").write_text("def on_connect(c):\n    return None\n")
    assert Policy("pigeon_test_beside.pol", directory=config_dir).load() == ["on_connect"]
    assert sys.path[-1] == str(config_dir)  # last: it stands in for no module of Python's or a library's
    for name in ("pigeon_test_site_policy", "pigeon_test_beside", "pigeon_test_beside.pol"):
        sys.modules.pop(name, None)


def test_modules_beside_the_policy_named_like_others_are_not_imported_and_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's modules and those installed come before the policy's own: a json.py or a json/
    beside it stands in for nothing, and is said to be unreachable; a dotted policy in such a
    package is refused, saying why."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "json.py").write_text("raise SystemExit('the json beside the policy ran')\n")
    (tmp_path / "pigeon_test_own_helpers.py").write_text("ANSWER = 42\n")
    (tmp_path / "policy.py").write_text(
        "import json, pigeon_test_own_helpers\n\ndef on_connect(c):\n    return None\n"
        "assert pigeon_test_own_helpers.ANSWER == 42 and json.dumps([]) == '[]'\n"
    )
    policy = Policy(str(tmp_path / "policy.py"))
    assert policy.load() == ["on_connect"]
    (said,) = policy.warnings
    assert f"{tmp_path / 'json.py'} is not what `import json` imports" in said
    assert "pigeon_test_own_helpers" not in said  # a name of its own: imported from there
    (tmp_path / "json.py").unlink()
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    (tmp_path / "json" / "pol.py").write_text("def on_connect(c):\n    return None\n")
    with pytest.raises(PolicyLoadError, match=r"`import json` imports .*json/__init__.py, not what is beside"):
        Policy("json.pol", directory=tmp_path).load()
    sys.modules.pop("pigeon_test_own_helpers", None)


async def test_a_plain_hook_answers_at_once_and_its_answer_is_checked(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_mail_from(sender):
            if sender == "no":
                return Refuse(550, "no")
            if sender == "odd":
                return 42
            if sender == "boom":
                raise RuntimeError("bug")
    """
    hook = _policy(tmp_path, source).on_mail_from
    assert hook is not None
    assert hook("yes") is None
    assert hook("no") == Refuse(550, "no")
    assert hook("odd") == HookFailed(POLICY_ERROR)
    assert hook("boom") == HookFailed(POLICY_ERROR)


async def test_an_async_hook_gives_a_future_and_is_cut_short_at_the_timeout(tmp_path: Path) -> None:
    source = """
        import asyncio
        from pigeon.policy import Changes
        async def on_message(message):
            await asyncio.sleep(message)
            return Changes(tenant="t")
    """
    hook = _policy(tmp_path, source, timeout=0.2).on_message
    assert hook is not None and hook.mode == "async"
    quick = hook(0.01)
    assert isinstance(quick, asyncio.Future)
    assert await quick == Changes(tenant="t")
    slow = hook(10)
    assert isinstance(slow, asyncio.Future)
    assert await asyncio.wait_for(slow, 2) == HookFailed(POLICY_TIMEOUT)


async def test_plain_hooks_on_threads_are_bounded_too(tmp_path: Path) -> None:
    source = """
        import time
        def on_rcpt_to(seconds):
            time.sleep(seconds)
    """
    policy = _policy(tmp_path, source, timeout=0.2, sync="thread")
    hook = policy.on_rcpt_to
    assert hook is not None and hook.mode == "thread"
    try:
        quick, slow = hook(0), hook(2)
        assert isinstance(quick, asyncio.Future) and isinstance(slow, asyncio.Future)
        assert await quick is None
        assert await asyncio.wait_for(slow, 1) == HookFailed(POLICY_TIMEOUT)
    finally:
        policy.close()


async def test_a_reloaded_policy_section_brings_its_module_timeout_and_sync_or_none(tmp_path: Path) -> None:
    """A reload prepares the `[policy]` it read, not the one the node started with (found from
    outside: a section added at a reload waited for a restart)."""
    policy = Policy()  # started with no [policy]
    (tmp_path / "pol.py").write_text("import time\ndef on_rcpt_to(seconds):\n    time.sleep(seconds)\n")
    config = PolicyConfig(module=str(tmp_path / "pol.py"), timeout=PositiveDuration(0.2), sync="thread")
    prepared = policy.prepare(config=config)
    assert policy.spec is None and policy.on_rcpt_to is None  # prepared, not yet taken
    assert policy.take(prepared) == ["on_rcpt_to"]
    hook = policy.on_rcpt_to
    assert policy.spec == config.module and hook is not None and hook.mode == "thread"
    try:
        slow = hook(2)
        assert isinstance(slow, asyncio.Future)
        assert await asyncio.wait_for(slow, 1) == HookFailed(POLICY_TIMEOUT)
        assert policy.take(policy.prepare(config=PolicyConfig())) == []  # the section taken out
        assert policy.spec is None and policy.defined() == [] and policy.module is None
    finally:
        policy.close()


def test_answers_refuse_what_cannot_be_said() -> None:
    with pytest.raises(ValueError, match="400 to 599"):
        Refuse(250)
    with pytest.raises(ValueError, match="one line"):
        Refuse(550, "two\r\nlines")
    with pytest.raises(ValueError, match="does not fit 550"):
        Refuse(550, "x", "4.7.1")
    with pytest.raises(ValueError, match="not a header name"):
        Changes(add_headers=[("Bad Name", "x")])
    with pytest.raises(ValueError, match="one line"):
        Changes(add_headers=[("X-Ok", "a\r\nBcc: victim@example.net")])
    with pytest.raises(ValueError, match="cannot be folded into lines of at most 998 octets"):
        Changes(add_headers=[("X-Token", "short words, then " + "x" * 1000)])
    with pytest.raises(ValueError, match="names a queue"):
        Changes(tenant="a:b")
    with pytest.raises(ValueError, match="not a string"):
        Changes(dkim="example.org")
    with pytest.raises(ValueError, match='"all"'):
        Reclassify(transient="some")


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"tenant": 5}, "tenant must be a str or None, not int 5"),
        ({"campaign": ["spring"]}, "campaign must be a str or None, not list"),
        ({"route": b"relay"}, "route must be a str or None, not bytes"),
        ({"dkim": ["example.org", 7]}, "dkim must be a list of signer names"),
        ({"add_headers": [("X-A", 1)]}, "add_headers must be a list of (name, value) pairs of str"),
        ({"add_headers": "X-A: 1"}, "add_headers must be a list"),
        ({"remove_headers": "Received"}, "remove_headers must be a list of header names"),
        ({"sender": b"a@example.org"}, "sender must be a str or None, not bytes"),
    ],
)
def test_changes_of_the_wrong_type_are_refused_naming_the_field(changes: dict[str, object], says: str) -> None:
    with pytest.raises(TypeError, match=re.escape(says)):
        Changes(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lambda: Defer(delay="soon"), "Defer delay must be seconds (an int or a float) or None, not str 'soon'"),
        (lambda: Defer(delay=True), "Defer delay must be seconds (an int or a float) or None, not bool True"),
        (lambda: Defer(reason=5), "Defer reason must be a str, not int 5"),
        (lambda: Fail(reason=None), "Fail reason must be a str, not NoneType None"),
        (lambda: Refuse(550, text=b"no"), "Refuse text must be a str, not bytes b'no'"),
        (lambda: Refuse(550, enhanced=571), "Refuse enhanced must be a str, not int 571"),
        (lambda: Reroute(None), 'Reroute domain must be a str (a domain name, or "" for the recipients\' own), not '),
        (lambda: Reroute(5), 'Reroute domain must be a str (a domain name, or "" for the recipients\' own), not int 5'),
    ],
)
def test_answers_of_the_wrong_type_are_refused_naming_the_field(answer: Callable[[], object], says: str) -> None:
    """Found from outside: `Defer(delay="soon")` said `'>=' not supported between instances of
    'str' and 'int'`, `Reroute(None)` `'NoneType' object is not iterable`."""
    with pytest.raises(TypeError, match=f"^{re.escape(says)}"):
        answer()


@pytest.mark.parametrize(
    ("route", "says"),
    [
        ("a..b", "has an empty label (a dot at the start, or two in a row, as in 'a..b')"),
        (".", "has an empty label"),
        ("x" * 64 + ".test", "has a label of 64 characters; a host name's are at most 63"),
        ("a." * 150 + "test", "is 304 characters long; a host name is at most 253"),
        ("*.example.net", "holds '*', '?' or '[': a route is one domain name, not a glob"),
        ("[999.1.1.1]", "holds '*', '?' or '['"),
        ("relay@example.net", "holds '@', which no host name holds"),
        ("relay .test", "holds white space"),
    ],
)
def test_a_route_that_is_no_domain_name_is_refused_as_a_route_domain_is(route: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"^route {re.escape(repr(route)[:40])}.* {re.escape(says)}"):
        Changes(route=route)
    with pytest.raises(ValueError, match=f"^Reroute domain {re.escape(repr(route)[:40])}.* {re.escape(says)}"):
        Reroute(route)


@pytest.mark.parametrize(
    "route", ["", "relay.test", "Relay.Test.", "bücher.example", "[192.0.2.1]", "[IPv6:2001:db8::1]"]
)
def test_a_route_that_is_a_domain_name_or_an_address_literal_is_taken(route: str) -> None:
    assert Changes(route=route).route == Reroute(route).domain == route


@pytest.mark.parametrize(
    ("sender", "says"),
    [
        ("not an address", "Not a valid mailbox address"),
        ("<a@example.org>", "Not a valid mailbox address"),
        ("a@example.org\r\nRCPT TO:<x@example.net>", "no control or format characters"),
        ("a\u202e@example.org", "U+202E"),
        ("x" * 65 + "@example.org", "Local part is longer than 64 octets"),
        ("a@[999.1.1.1]", "Not a valid address literal"),
    ],
)
def test_a_sender_that_mail_from_would_refuse_is_refused_as_it_is_made(sender: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        Changes(sender=sender)


@pytest.mark.parametrize("sender", ["", "newuser@corp.test", "jörg@bücher.example", '"a b"@[IPv6:::1]'])
def test_a_sender_mail_from_takes_is_taken_and_the_empty_one_is_the_null_sender(sender: str) -> None:
    assert Changes(sender=sender).sender == sender


def test_changes_take_lists_where_tuples_are_written() -> None:
    changes = Changes(add_headers=[["X-A", "1"]], remove_headers=("X-B",), dkim=("example.org",))  # type: ignore[list-item]
    assert list(changes.add_headers) == [["X-A", "1"]]


@pytest.mark.parametrize("text", ["nön ascii", "bell\x07", "del\x7f", "x" * 2000, "short, then " + "y" * 501])
def test_a_refusal_text_no_reply_can_carry_is_refused_as_it_is_made(text: str) -> None:
    # Not ASCII (a client without SMTPUTF8 cannot take it), or a word longer than a reply line.
    with pytest.raises(ValueError, match=r"printable ASCII|512 octets"):
        Refuse(550, text)


def test_a_long_refusal_text_is_cut_at_its_white_space_into_reply_lines_of_at_most_512_octets() -> None:
    text = "\t".join(f"because{n:04d}" for n in range(300))  # 3,599 characters, a tab between words
    reply = refusal(Refuse(550, text, "5.7.26"))
    wire = reply.encode()
    lines = wire.split(b"\r\n")[:-1]
    assert len(lines) == len(reply.lines) > 7 and all(len(line) + 2 <= 512 for line in lines)
    assert all(line.startswith(b"550-5.7.26 ") for line in lines[:-1]) and lines[-1].startswith(b"550 5.7.26 ")
    assert " ".join(reply.lines).split() == text.split()  # cut at white space, each word whole
    assert max(len(line) for line in lines) > 500  # as much on each line as fits
    # The longest word a line holds is taken; a greeting (no enhanced code) fits it too.
    word = "w" * (512 - len("554-5.7.1 \r\n"))
    assert refusal(Refuse(554, f"{word} {word}")).lines == (word, word)
    assert at_greeting(refusal(Refuse(554, f"{word} {word}"))).encode(enhanced=False).count(b"\r\n") == 2
    assert refusal(Refuse(550, "short")).lines == ("short",)


@pytest.mark.parametrize(
    ("transient", "permanent"),
    [("all", "all"), (["a@x.test", "b@x.test"], ["B@X.test"]), ("all", ["a@x.test"]), (["a@x.test"], "all")],
)
def test_a_reclassification_naming_a_recipient_both_ways_is_refused_as_it_is_made(
    transient: list[str] | str, permanent: list[str] | str
) -> None:
    with pytest.raises(ValueError, match=r"both transient and permanent|names every recipient"):
        Reclassify(transient=transient, permanent=permanent)  # type: ignore[arg-type]
    Reclassify(transient=["a@x.test"], permanent=["b@x.test"])  # each in one: fine
    Reclassify(transient="all", permanent=[])


def test_headers_read_only_by_any_case_unfolded_in_order() -> None:
    headers = Headers(b"Received: by x\r\nSubject: a long\r\n\tsubject\r\nX-Tag: 1\r\nx-tag: 2\r\n\r\nbody: no\r\n")
    assert headers["subject"] == "a long subject"
    assert headers.get_all("X-TAG") == ["1", "2"]
    assert "x-tag" in headers and "body" not in headers
    assert list(headers) == ["received", "subject", "x-tag"] and len(headers) == 3
    assert headers.fields()[0] == ("Received", "by x")
    with pytest.raises(KeyError):
        headers["From"]


def test_a_long_added_header_is_folded_at_its_white_space_into_lines_of_78_octets() -> None:
    value = " ".join(f"word{n:04d}" for n in range(250))  # 2,249 characters
    folded = folded_field("X-Long", value)
    lines = folded.split("\r\n")
    assert len(lines) > 25 and all(len(line) <= 78 for line in lines)
    assert all(line.startswith(" ") for line in lines[1:])  # each continuation after white space
    assert "".join(lines) == f"X-Long: {value}"  # unfolded, the value as given
    # Octets, not characters; a word longer than a line stays whole on a line of its own.
    lines = folded_field("X-Utf8", "é" * 50 + " " + "b" * 100 + " c").split("\r\n")
    assert [len(line.encode()) for line in lines] == [108, 101, 2]
    assert folded_field("Subject", "short") == "Subject: short"


@pytest.mark.parametrize("value", ["ac\x1bme", "c\x7fd", "a\x9bb", "spring\u202e"])
def test_a_tenant_or_campaign_a_hook_sets_with_a_control_or_format_character_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="control or format"):
        Changes(tenant=value)
    with pytest.raises(ValueError, match="control or format"):
        Changes(campaign=value)


class _Log:
    """The event log, as far as hooks write to it."""

    def __init__(self) -> None:
        self.records: list[PolicyFailure] = []

    def write(self, record: PolicyFailure) -> None:
        self.records.append(record)


_RAISES = {
    "SystemExit": "raise SystemExit('policy wants out')",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "CancelledError": "raise asyncio.CancelledError('its own')",
    "GeneratorExit": "raise GeneratorExit",
    "BaseException": "raise BaseException('bare')",
}


@pytest.mark.parametrize("kind", list(_RAISES))
@pytest.mark.parametrize("mode", ["inline", "async", "thread"])
async def test_a_hook_raising_a_base_exception_fails_as_one_raising_an_exception_does(
    tmp_path: Path, mode: str, kind: str
) -> None:
    """Not only Exceptions: a `sys.exit()`, a KeyboardInterrupt, a CancelledError of the hook's
    own... out of a hook ended the worker's loop (or left its caller with a cancelled call)."""
    source = f"""
        import asyncio
        {"async " if mode == "async" else ""}def on_mail_from(mail):
            {_RAISES[kind]}
    """
    log = _Log()
    policy = _policy(tmp_path, source, sync="thread" if mode == "thread" else "inline", log=log)
    hook = policy.on_mail_from
    assert hook is not None
    try:
        verdict = hook("a@example.org", session="s1")
        if isinstance(verdict, asyncio.Future):
            verdict = await asyncio.wait_for(verdict, 5)
    except BaseException as error:  # (one out of a task's step ends the loop's run: the test's, then)
        pytest.fail(f"the hook's {error!r} came out of the call")
    finally:
        policy.close()
    assert verdict == HookFailed(POLICY_ERROR)
    (failure,) = log.records
    assert (failure.hook, failure.action, failure.session) == ("on_mail_from", "451 4.3.0", "s1")
    assert failure.error.partition(":")[0].endswith(kind)
    assert failure.traceback is not None and "on_mail_from" in failure.traceback


@pytest.mark.parametrize("mode", ["async", "thread"])
async def test_the_callers_cancellation_of_a_hook_call_goes_on_and_is_not_the_hooks_failure(
    tmp_path: Path, mode: str
) -> None:
    """A stop cancels the task that awaits a hook (a delivery attempt's): asyncio cancels the
    hook's task with it. That cancellation is Pigeon's, not the hook's: it is not answered as a
    failure (a PolicyFailure, a deferral) and the caller ends cancelled, as it was asked to."""
    source = f"""
        import asyncio, time
        {"async " if mode == "async" else ""}def before_delivery(delivery):
            {"await asyncio.sleep(30)" if mode == "async" else "time.sleep(0.5)"}
    """
    log = _Log()
    policy = _policy(tmp_path, source, timeout=60, sync="thread" if mode == "thread" else "inline", log=log)
    hook = policy.before_delivery
    assert hook is not None
    call = hook("delivery", message_id="m1")
    assert isinstance(call, asyncio.Future)

    async def attempt() -> object:
        return await call

    caller = asyncio.ensure_future(attempt())
    try:
        await asyncio.sleep(0.1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert call.cancelled()
    finally:
        policy.close()
    assert log.records == []


async def test_a_threaded_call_the_closing_pool_drops_is_not_the_hooks_failure(tmp_path: Path) -> None:
    """`close()` (the node's last act) drops the calls still waiting for a thread: their hook
    never ran, so it did not fail. (A CancelledError the hook raises in its thread comes back
    as its exception, not as a cancelled call: that one is its failure.)"""
    source = """
        import time
        def on_rcpt_to(seconds):
            time.sleep(seconds)
    """
    log = _Log()
    policy = _policy(tmp_path, source, timeout=5, sync="thread", threads=1, log=log)
    hook = policy.on_rcpt_to
    assert hook is not None
    running, queued = hook(0.3), hook(0)
    assert isinstance(running, asyncio.Future) and isinstance(queued, asyncio.Future)
    await asyncio.sleep(0.05)
    policy.close()
    assert await running is None
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert log.records == []


async def test_a_hook_tasks_coroutine_closed_from_outside_is_not_the_hooks_failure() -> None:
    """A GeneratorExit thrown in from outside the task's steps (its coroutine closed, collected
    unfinished) is not one the hook raised: answering it would be a coroutine ignoring it."""
    loop = asyncio.get_running_loop()
    running = asyncio.current_task()
    assert _raised_by_hook(GeneratorExit(), loop, running)  # in a step of the task: the hook's
    other = asyncio.ensure_future(asyncio.sleep(0))
    assert not _raised_by_hook(GeneratorExit(), loop, other)
    await other
    assert _raised_by_hook(asyncio.CancelledError(), loop, running)  # the task is not being cancelled
    cancelled = asyncio.ensure_future(asyncio.sleep(10))
    cancelled.cancel()  # being cancelled: a CancelledError out of its hook call is that cancellation
    assert not _raised_by_hook(asyncio.CancelledError(), loop, cancelled)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert _raised_by_hook(SystemExit(), loop, running)


def test_a_hook_named_for_what_another_does_is_pointed_at_that_one(tmp_path: Path) -> None:
    """Found from outside: on_delivery_attempt was pointed at on_delivery_outcome, the nearest
    spelling, where the hook called before each attempt is before_delivery."""
    (said,) = _policy(tmp_path, "def on_delivery_attempt(delivery):\n    pass\n").warnings
    assert "on_delivery_attempt is not a hook name and is never called (did you mean before_delivery?)" in said


@pytest.mark.parametrize("mode", ["inline", "async", "thread"])
async def test_an_answer_whose_repr_raises_is_the_hooks_failure_not_an_error_of_the_caller(
    tmp_path: Path, mode: str
) -> None:
    """Found from outside: the error naming a wrong answer was built with `repr()` outside any
    guard, so an answer whose `__repr__` raised escaped to the caller (an unanswered MAIL, a
    dropped connection, a delivered message sent again)."""
    prefix = "async " if mode == "async" else ""
    source = f"""
        class Unprintable:
            def __repr__(self):
                return 1 / 0
        {prefix}def on_mail_from(mail):
            return Unprintable()
    """
    records: list[object] = []
    log = type("Log", (), {"write": staticmethod(records.append)})()
    policy = _policy(tmp_path, source, sync="thread" if mode == "thread" else "inline", threads=1, log=log)
    hook = policy.on_mail_from
    assert hook is not None
    try:
        verdict = hook("a@example.org", session="s1")
        if isinstance(verdict, asyncio.Future):
            verdict = await verdict
    finally:
        policy.close()
    assert verdict == HookFailed(POLICY_ERROR)
    [failure] = records
    assert isinstance(failure, PolicyFailure)
    assert re.fullmatch(
        r"TypeError: on_mail_from returned <pigeon_policy_\d+\.Unprintable object \(its repr\(\) raised "
        r"ZeroDivisionError\)>; it may return None or Refuse \(pigeon\.policy\)",
        failure.error,
    )
    assert failure.action == "451 4.3.0" and failure.session == "s1"


async def test_a_huge_error_is_cut_in_the_record_and_the_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: an exception whose str() was 5 MB made a 10 MB PolicyFailure line
    (error and traceback) and 5 MB on stderr."""
    source = """
        def on_mail_from(mail):
            raise ValueError("x" * 5_000_000)
        def on_rcpt_to(rcpt):
            return "y" * 5_000_000
    """
    records: list[PolicyFailure] = []
    log = type("Log", (), {"write": staticmethod(records.append)})()
    policy = _policy(tmp_path, source, log=log)
    assert policy.on_mail_from is not None and policy.on_rcpt_to is not None
    with caplog.at_level(logging.DEBUG, logger="pigeon.policy.hooks"):
        assert policy.on_mail_from("a@example.org") == HookFailed(POLICY_ERROR)
        assert policy.on_rcpt_to("b@example.org") == HookFailed(POLICY_ERROR)
    raised, returned = records
    assert raised.error.startswith("ValueError: xxx") and raised.error.endswith("x...")
    assert len(raised.error) < 4096
    assert raised.traceback is not None and len(raised.traceback) < 10_000 and raised.traceback.endswith("...")
    assert 'raise ValueError("x" * 5_000_000)' in raised.traceback
    assert returned.error.startswith("TypeError: on_rcpt_to returned 'yyy") and len(returned.error) < 400
    assert "...; it may return None or Refuse" in returned.error
    assert len(caplog.text) < 40_000


def test_a_refusal_code_is_one_smtp_has() -> None:
    """RFC 5321 4.2.1: a reply code's second digit is 0 to 5 (found from outside: Refuse(599)
    went out as `599 5.7.1`)."""
    for code in (460, 499, 560, 599):
        with pytest.raises(ValueError, match=f"its second digit 0 to 5 .*, not {code}"):
            Refuse(code)
    for code in (421, 451, 459, 550, 554, 559):
        Refuse(code)
    with pytest.raises(ValueError, match="5xx"):
        Fail(code=599)
    Fail(code=554, enhanced="5.7.1")


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"classification": 5}, "classification must be a str"),
        ({"transient": [5]}, "transient must be a list of addresses"),
        ({"permanent": ["a@x.test", None]}, "permanent must be a list of addresses"),
        ({"permanent": 5}, "permanent must be a list of addresses"),
    ],
)
def test_a_reclassification_of_the_wrong_type_is_refused_as_it_is_made(answer: dict[str, object], says: str) -> None:
    """Found from outside: `classification=5` went into the Bounce record as a number, and
    `transient=[5]` was ignored, where an unknown address failed the hook."""
    with pytest.raises(TypeError, match=says):
        Reclassify(**answer)  # type: ignore[arg-type]
    Reclassify(transient=("a@x.test",), permanent=["b@x.test"], classification="SpamBlock")


def test_what_the_readme_says_changing_a_hooks_object_raises_is_what_it_raises() -> None:
    """Found from outside: the README said assigning to `message.metadata` raises TypeError;
    it raises AttributeError (a frozen struct's field), and TypeError is changing the mapping."""
    message = ReceivedMessage(
        id="0000018c2f3a4b5c", listener="http", session="http-1", peer_ip="127.0.0.1", helo="", protocol="HTTP",
        tls=None, auth_user=None, sender="a@example.org", recipients=("b@example.net",), size=1,
        headers=Headers(b"Subject: x\r\n\r\n"), tenant=None, campaign=None, metadata=MappingProxyType({"user": "42"}),
    )  # fmt: skip
    with pytest.raises(AttributeError):
        message.metadata = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        message.metadata["user"] = "EVIL"  # type: ignore[index]
    readme = " ".join((Path(__file__).parents[3] / "README.md").read_text().split())
    assert "a hook that assigns to one of its fields (`message.metadata = {}`) raises `AttributeError`" in readme
    assert 'changes `message.metadata` (`message.metadata["user"] = "x"`) raises `TypeError`' in readme
