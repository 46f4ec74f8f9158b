"""A template cannot make a worker allocate hundreds of megabytes: what one render makes is
counted in bytes, as Python holds it, and bounded (`pigeon.rendering`, "memory").

Each template here kept every value under the output limit and "characters made" (an outside
review), yet made 150 to 400 MB: many small strings (`split`, `|list` of emoji), copies of a
big string kept in a list (`map`, `.upper()` in a namespace, slices), lists made by a generator
(`batch`), values written out whole (`tojson` of a list holding one string a million times),
literals made again at every loop step, text kept by a `{% set %}` block or a macro, and
an escaped value in HTML.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from pigeon import rendering

MAX_OUTPUT = 8 * 1024 * 1024
CAP = 3 * MAX_OUTPUT
"""What a refused render may have held at its peak: the values it may make (twice the output
limit) and one value of the output limit's size being made when it was refused."""

NS = "{% set ns = namespace(l=[]) %}"
HOSTILE = [
    pytest.param('{{ ("ab " * 2500000).split()|length }}', id="split-into-small-strings"),
    pytest.param('{{ ("\U0001f600" * 2000000)|list|length }}', id="list-of-emoji"),
    pytest.param('{% set a = "x" * 8000000 %}{{ ([a] * 30)|map("upper")|list|length }}', id="map-copies"),
    pytest.param(
        '{% set a = "x" * 8000000 %}' + NS + "{% for i in range(30) %}{% set ns.l = ns.l + [a.upper()] %}{% endfor %}",
        id="method-copies-kept-in-a-namespace",
    ),
    pytest.param(
        '{% set a = "x" * 8000000 %}' + NS + "{% for i in range(30) %}{% set ns.l = ns.l + [a[::-1]] %}{% endfor %}",
        id="slice-copies",
    ),
    pytest.param('{{ ("x" * 2000000)|batch(1)|list|length }}', id="lists-made-by-a-generator"),
    pytest.param('{{ ([["x" * 1000] * 1000] * 30)|tojson|length }}', id="tojson-of-a-shared-string"),
    pytest.param('{{ ([["x" * 1000] * 1000] * 30)|pprint|length }}', id="pprint-of-a-shared-string"),
    pytest.param('{{ [["x" * 1000] * 1000] * 30 }}', id="a-list-written-out"),
    pytest.param('{{ ([["x" * 1000] * 1000] * 30)|join|length }}', id="join-of-lists"),
    pytest.param(
        '{% set a = "x" * 1000000 %}{% set b %}{% for i in range(100) %}{{ a }}{% endfor %}{% endset %}',
        id="a-captured-block",
    ),
    pytest.param(
        '{% set d = "\U0001f600" %}{% macro m() %}{% for c in d * 4000000 %}{{ c }}{% endfor %}{% endmacro %}{{ m() }}',
        id="a-macro-writing-a-string-made-per-step",
    ),
    pytest.param("{{ ([[1] * 1000] * 200)|tojson(indent=100)|length }}", id="tojson-indented"),
    pytest.param('{{ "x".center(8000000, "\U0001f600")|length }}', id="padding-with-an-emoji"),
    pytest.param('{{ ("x".encode() * 30000000)|length }}', id="bytes-repeated"),
    pytest.param('{{ {"a": q * 8000000}|xmlattr|length }}', id="xmlattr-escaping"),
    pytest.param(
        NS + "{% for i in range(30000) %}{% set ns.l = ns.l + [[" + ",".join(["i"] * 2000) + "]] %}{% endfor %}",
        id="a-literal-made-at-every-step",
    ),
]


def _peak(source: str, autoescape: bool = False, q: str = '"', **variables: Any) -> tuple[int, BaseException | str]:
    template = rendering.environment(autoescape).from_string(source)
    tracemalloc.start()
    try:
        outcome: BaseException | str = rendering.render(template, {"q": q, **variables}, max_output=MAX_OUTPUT)
    except Exception as error:
        outcome = error
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, outcome


@pytest.mark.parametrize("source", HOSTILE)
def test_a_template_making_hundreds_of_megabytes_is_refused_before_it_holds_them(source: str) -> None:
    peak, outcome = _peak(source)
    assert (type(outcome).__name__, peak < CAP) == ("RenderLimit", True), (outcome, f"{peak / 2**20:.0f} MiB")


def test_a_value_escaped_in_html_output_is_refused_before_it_is_escaped() -> None:
    peak, outcome = _peak("{{ q * 8000000 }}", autoescape=True)
    assert isinstance(outcome, rendering.RenderLimit) and "output limit" in str(outcome), outcome
    assert peak < CAP, f"{peak / 2**20:.0f} MiB"


def test_the_refusal_names_the_bytes_limit_and_how_it_follows_from_the_output_limit() -> None:
    _, outcome = _peak('{{ ("ab " * 2500000).split()|length }}')
    assert str(outcome) == (
        f"more than {2 * MAX_OUTPUT} bytes of values made in one render (2 times the output limit, at least 8 MiB)"
    )


# What a render is given (the request's substitutions) or made before is not charged again,
# however often a template uses it: a large body written out, filtered, taken apart.
BODY = "Dear customer, here is your statement.\n" * 25_000  # 1 MB
ROWS = [{"name": f"item {i}", "price": i, "tags": ["a", "b"]} for i in range(20_000)]
LEGIT = [
    pytest.param("{% for i in range(300) %}{{ body|default('')|length }}{{ body|first }}{% endfor %}", id="reused"),
    pytest.param("{{ body|upper|length }} {{ body.split('\\n')|length }} {{ body|wordcount }}", id="text"),
    pytest.param("{% for r in rows|sort(attribute='price') %}{{ r.name }};{% endfor %}", id="sorted-rows"),
    pytest.param("{{ rows|map(attribute='name')|join(', ')|length }}", id="joined-rows"),
    pytest.param("{% for r in rows|selectattr('price')|list %}{{ r.tags|join }}{% endfor %}", id="selected-rows"),
    pytest.param("{{ range(100000)|list|length }} {{ rows|batch(3)|list|length }}", id="batches"),
    pytest.param("{% for g in rows|groupby('price') %}{{ g.grouper }}{% endfor %}", id="groups"),
    pytest.param("{{ rows[:10000]|tojson|length }} {{ body[::-1]|length }}", id="written-out"),
]


@pytest.mark.parametrize("source", LEGIT)
def test_a_template_working_on_large_substitutions_still_renders(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # What is proved is that the memory budget lets these through; the time budget (1 s) is
    # not, and a loaded machine took longer than that to group 20,000 rows.
    monkeypatch.setattr(rendering, "MAX_RENDER_SECONDS", 30.0)
    template = rendering.environment(False).from_string(source)
    assert rendering.render(template, {"body": BODY, "rows": ROWS}, max_output=2_000_000)
