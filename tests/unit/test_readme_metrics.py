"""The README's "Metrics" lists every metric `/metrics` exports: one left out
(`pigeon_smtp_connections_evicted_total`) is one an operator never learns to watch."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _exported() -> set[str]:
    """The names the collectors and the node's tally give their metrics, as `/metrics` shows
    them: a counter's with `_total`."""
    names = set()
    for source in ("src/pigeon/metrics.py", "src/pigeon/node/tally.py"):
        text = (ROOT / source).read_text()
        for kind, name in re.findall(r'(\w+)\(\s*"(pigeon_[a-z0-9_]+)"', text, re.DOTALL):
            names.add(f"{name}_total" if "Counter" in kind else name)
    return names


def test_every_exported_metric_is_listed_in_the_readme_metrics_section() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    exported = _exported()
    assert "pigeon_smtp_connections_evicted_total" in exported and len(exported) > 30
    missing = sorted(name for name in exported if not re.search(rf"`{name}[{{`]", section))
    assert missing == []
