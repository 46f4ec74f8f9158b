"""Every regular expression run over text someone else chose (an admin's reason or selector, a
remote server's reply, anything that reaches a log line) takes time in proportion to the text:
a megabyte of the worst shapes for it is read well within a second. One that backtracks
quadratically freezes the worker that reads it (a 130 KB `reason` once stalled every worker
until the supervisor killed them).

Each case is timed at 32 K characters first, where a quadratic expression already takes
seconds, so that one fails fast rather than running for hours at a megabyte."""

from __future__ import annotations

import json
import logging
import time
import tracemalloc
from collections.abc import Callable

import pytest
from aiohttp import web

from pigeon.delivery.classify import Classifier
from pigeon.listener.http import admin
from pigeon.listener.http.admin import RULE_DURATION, validate
from pigeon.redaction import RedactingFormatter, redact, redact_url
from pigeon.shaping.reactions import Reactions
from pigeon.smtp.replies import Reply

SIZES = (32 * 1024, 1024 * 1024)
BUDGET = 1.0  # CPU seconds; linear ones take at most 0.4 at a megabyte (classifying it), quadratic ones seconds at 32 K


def _within_budget(process: Callable[[str], object], shape: Callable[[int], str]) -> None:
    for size in SIZES:
        text = shape(size)
        start = time.process_time()  # CPU time: other processes on the machine do not count
        process(text)
        spent = time.process_time() - start
        assert spent < BUDGET, f"{spent:.2f}s of CPU for {len(text)} characters like {text[:24]!r}"


# Shapes that made a backtracking expression try again from every position of a long run.
_LOG_TEXT: dict[str, Callable[[int], str]] = {
    "letters after =": lambda n: "reason=" + "a" * n,  # the admin reason of the report
    "letters and digits after ://": lambda n: "x ://" + "a1" * (n // 2),
    "scheme characters, no ://": lambda n: "x= " + "a.b+c-d0" * (n // 8) + ":/",
    "an unterminated quoted secret": lambda n: "password='" + "\\a" * (n // 2),
    "an unterminated double-quoted secret": lambda n: 'password="' + "a/" * (n // 2),
    "spaces after a secret's name": lambda n: "password" + " " * n + "x",
    "one secret name after another": lambda n: "token=" * (n // 6),
    "a URL of slashes": lambda n: "http://" + "/" * n,
    "a URL of a long token segment": lambda n: "http://h.example/" + "a1" * (n // 2),
    "a URL of a long parameter name": lambda n: "http://h.example/?" + "a" * n + "=1",
    "a URL of parameters": lambda n: "http://h.example/?" + "a=&" * (n // 3),
    "a URL with @ after @": lambda n: "http://" + "a@" * (n // 2),
    "a broken userinfo, then @ after # after @": lambda n: "http://:x" + "#a@" * (n // 3),
    "a broken userinfo, then # then /@": lambda n: "http://:x" + "#" * (n // 2) + "/@" * (n // 4),
    "controls": lambda n: "=\x1b\u202e" * (n // 3),
}


@pytest.mark.parametrize("shape", _LOG_TEXT.values(), ids=_LOG_TEXT.keys())
def test_redact_takes_linear_time_on_pathological_text(shape: Callable[[int], str]) -> None:
    _within_budget(redact, shape)


@pytest.mark.parametrize("shape", _LOG_TEXT.values(), ids=_LOG_TEXT.keys())
def test_redact_url_takes_linear_time_on_pathological_text(shape: Callable[[int], str]) -> None:
    _within_budget(redact_url, shape)


@pytest.mark.parametrize("shape", _LOG_TEXT.values(), ids=_LOG_TEXT.keys())
def test_a_log_line_is_formatted_in_linear_time_on_pathological_text(shape: Callable[[int], str]) -> None:
    formatter = RedactingFormatter("%(asctime)s w0 %(levelname)s %(name)s: %(message)s")

    def format_line(text: str) -> str:
        record = logging.LogRecord("pigeon.queue.admin", logging.WARNING, __file__, 1, "admin (%s)", (text,), None)
        return formatter.format(record)

    _within_budget(format_line, shape)


# A reply is one line per reply line, each at most 4096 octets, but there may be many lines.
_REPLY_TEXT: dict[str, Callable[[int], str]] = {
    "letters": lambda n: "a" * n,
    "spaces": lambda n: " " * n,
    "digits and spaces": lambda n: "0 " * (n // 2),
    "enhanced codes": lambda n: "5.7.1 4.7.0 " * (n // 12),
    "half a wording": lambda n: "mailbox is " * (n // 11),
    "words the rules look for, then none": lambda n: "relay rate try again later " * (n // 27),
}
_REPLIES: dict[str, tuple[int, str]] = {"550 5.7.1": (550, "5.7.1"), "421 4.7.0": (421, "4.7.0"), "451": (451, "")}


@pytest.mark.parametrize("code", _REPLIES.values(), ids=_REPLIES.keys())
@pytest.mark.parametrize("shape", _REPLY_TEXT.values(), ids=_REPLY_TEXT.keys())
def test_a_reply_is_classified_in_linear_time(shape: Callable[[int], str], code: tuple[int, str]) -> None:
    classifier = Classifier()
    _within_budget(lambda text: classifier.classify(Reply(code[0], code[1] or None, (text,))), shape)


@pytest.mark.parametrize("code", _REPLIES.values(), ids=_REPLIES.keys())
@pytest.mark.parametrize("shape", _REPLY_TEXT.values(), ids=_REPLY_TEXT.keys())
def test_the_shipped_reactions_match_a_reply_in_linear_time(shape: Callable[[int], str], code: tuple[int, str]) -> None:
    reactions = Reactions.from_config([])

    def every_rule(text: str) -> None:
        reply = Reply(code[0], code[1] or None, (text,))
        reactions.match(reply, "mx.example.net", "example.net")
        for rule in reactions.rules:  # those whose scopes leave this site out too
            rule.pattern.search(str(reply))

    _within_budget(every_rule, shape)


_DURATIONS: dict[str, Callable[[int], str]] = {
    "a number, then spaces": lambda n: "1" + " " * n + "x",
    "a number and a unit, then spaces": lambda n: "12 m" + " " * n + "x",
    "spaces, then a number": lambda n: " " * n + "1x",
    "zeros": lambda n: "0" * n + "x",
}


@pytest.mark.parametrize("shape", _DURATIONS.values(), ids=_DURATIONS.keys())
def test_an_admin_duration_is_refused_in_linear_time(shape: Callable[[int], str]) -> None:
    def post(duration: str) -> None:
        body = json.dumps({"domain": "x.test", "duration": duration}).encode()
        # Past an admin body's 64 KiB, refused by its size before anything reads the duration;
        # the pattern the duration is checked by is then asked of the text itself.
        with pytest.raises(web.HTTPBadRequest if len(body) <= admin.MAX_BODY else web.HTTPRequestEntityTooLarge):
            validate("POST", "/api/v1/admin/suspend", body)
        RULE_DURATION.fullmatch(duration)

    _within_budget(post, shape)


def test_classifying_long_replies_keeps_no_copy_of_them() -> None:
    classifier = Classifier()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(40):
            classifier.classify(Reply(550, "5.7.1", (f"{n} " + "x" * 4000,) * 25))  # 100 KB each, all different
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1_000_000, f"{kept} bytes kept for 4 MB of replies"
    assert classifier.classify(Reply(550, "5.7.1", ("relaying denied",))) == "RelayDenied"
