"""Adding up answers: one API answer from several workers' (or nodes') answers to one request."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from pigeon.metrics import MAX_CLASSIFICATION_LABELS, MAX_QUEUE_LABELS, MAX_SITE_LABELS, MAX_SOURCE_LABELS
from pigeon.queue.admin import NOT_FOUND


def merge_answers(answers: list[tuple[int, Any]]) -> tuple[int, Any]:
    """One answer from every worker's: the first refusal (4xx/5xx but 404) as it is; else
    counts added up, lists joined (rules by id once), "cancelled" if any worker cancelled,
    and 404 only if no worker had what was asked for."""
    for status, answer in answers:
        if status >= 400 and status != 404:
            return status, answer
    found = [answer for status, answer in answers if status < 400]
    if not found:
        return answers[0]
    merged: dict[str, Any] = {}
    for answer in found:
        for key, value in answer.items():
            if isinstance(value, bool):
                merged[key] = merged.get(key, False) or value
            elif isinstance(value, int | float) and key not in ("created", "next_due", "size", "attempts"):
                merged[key] = merged.get(key, 0) + value
            elif key == "messages" and isinstance(value, list):
                merged[key] = _merge_by_id(merged.get(key, []), value)
            elif (
                isinstance(value, list)
                and value
                and isinstance(value[0], dict)
                and ("queue" in value[0] or "path" in value[0] or "operation" in value[0])
            ):
                merged[key] = _merge_rows(merged.get(key, []), value)
            elif isinstance(value, list):
                seen = {item.get("id") for item in merged.get(key, []) if isinstance(item, dict)}
                merged[key] = merged.get(key, []) + [
                    v for v in value if not isinstance(v, dict) or v.get("id") not in seen
                ]
            elif merged.get(key) is None:
                merged[key] = value
    return 200, merged


def _merge_by_id(rows: list[Any], more: list[Any]) -> list[Any]:
    """What became of each message a bounce or retry named by id, as several workers (or nodes)
    said it: every one says it of every id, `not_found` of those it does not hold, so the word
    of the one that found it stands, in the order asked. (One id found by two nodes, whose ids
    collided: the first found.)"""
    merged = list(rows)
    at = {row.get("id"): index for index, row in enumerate(merged) if isinstance(row, dict)}
    for row in more:
        if not isinstance(row, dict) or row.get("id") not in at:
            at[row.get("id") if isinstance(row, dict) else None] = len(merged)
            merged.append(row)
        elif merged[at[row["id"]]].get("result") == NOT_FOUND and row.get("result") != NOT_FOUND:
            merged[at[row["id"]]] = row
    return merged


def _merge_rows(rows: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Queue rows of several workers, one per queue: counts added, the oldest kept."""
    by_key = {_row_key(row): dict(row) for row in rows}
    for row in more:
        key = _row_key(row)
        mine = by_key.setdefault(key, {})
        for name, value in row.items():
            if name in ("oldest", "started", "rule_created"):
                mine[name] = min(mine.get(name, value), value)
            elif name == "next_due":  # (None: that worker has none due later)
                times = [t for t in (mine.get(name), value) if t is not None]
                mine[name] = min(times) if times else None
            elif name == "finished":
                mine[name] = max(mine.get(name, value), value)
            elif isinstance(value, bool):  # a ready queue's "down": as any worker found it
                mine[name] = mine.get(name, False) or value
            elif isinstance(value, int | float):
                mine[name] = mine.get(name, 0) + value
            elif isinstance(value, list):  # a ready queue's effects: each once, by id
                known = {item.get("id") for item in mine.get(name, []) if isinstance(item, dict)}
                mine[name] = mine.get(name, []) + [
                    v for v in value if not isinstance(v, dict) or v.get("id") not in known
                ]
            elif mine.get(name) is None:  # the first known (a worker may not know a queue's provider yet)
                mine[name] = value
    if any("operation" in row for row in by_key.values()):
        # Operations read as a history: oldest first (their ids are random).
        return sorted(by_key.values(), key=lambda r: (r.get("started") or 0, str(_row_key(r))))
    return sorted(by_key.values(), key=lambda r: str(_row_key(r)))


def _row_key(row: dict[str, Any]) -> Any:
    if "operation" in row:
        # A resume is told from an earlier resume of the same rule id by the rule it ended.
        return row["operation"], row.get("rule_created")
    return row.get("queue") or row.get("path")


Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric family of an exposition: its type, its help text and its samples."""

    kind: str
    doc: str
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)


Exposition = dict[str, Family]
"""Metric families by name (as the parser names them: a counter without its "_total")."""

_CUMULATIVE: Final = frozenset({"counter", "histogram", "summary"})
# 0/1 gauges that say whether something is wrong anywhere: the node's value is the highest.
_HIGHEST: Final = frozenset({"pigeon_log_failing"})


# Families with a label value per queue or site, and how many values they show (`pigeon.metrics`).
CAPPED: Final = {
    "pigeon_queue_recipients": ("queue", MAX_QUEUE_LABELS),
    "pigeon_site_recipients": ("site", MAX_SITE_LABELS),
    "pigeon_classified_recipients": ("classification", MAX_CLASSIFICATION_LABELS),
    "pigeon_source_recipients": ("source", MAX_SOURCE_LABELS),
}
OTHER: Final = "_other"


def merge_metrics(texts: list[str]) -> str:
    """Sum the samples of several Prometheus text expositions (see `merge_expositions`), the
    queues and sites beyond the cap as `_other` (`cap_labels`)."""
    return render_exposition(cap_labels(merge_expositions([parse_exposition(text) for text in texts])))


def cap_labels(exposition: Exposition, labelled: dict[str, set[str]] | None = None) -> Exposition:
    """The `CAPPED` families with at most their cap of queue (site) values, the samples of the
    others added to `_other`'s. Each worker keeps to the cap, but each sees other queues: their
    sum did not (1,200 tenants showed 1,422 queues). `labelled`: the values given their own
    series by earlier calls, kept (and added to) so that a queue keeps its series from one scrape
    to the next; the first values in sorted order get the room left. Changes `exposition`."""
    labelled = {} if labelled is None else labelled
    for name, (label, most) in CAPPED.items():
        family = exposition.get(name)
        if family is None:
            continue
        mine = labelled.setdefault(name, set())
        values = {value for _, labels in family.samples for key, value in labels if key == label}
        for value in sorted(values - mine - {OTHER})[: max(0, most - len(mine))]:
            mine.add(value)
        if values <= mine | {OTHER}:
            continue
        samples: dict[tuple[str, Labels], float] = {}
        for (sample, labels), number in family.samples.items():
            folded = tuple((key, OTHER if key == label and value not in mine else value) for key, value in labels)
            key = (sample, folded)
            if key not in samples:
                samples[key] = number
            elif sample.endswith("_created"):
                samples[key] = min(samples[key], number)
            else:
                samples[key] += number
        family.samples = samples
    return exposition


def parse_exposition(text: str) -> Exposition:
    """A Prometheus text exposition's families (raises ValueError if it is not one)."""
    families: Exposition = {}
    for parsed in text_string_to_metric_families(text):
        family = families.setdefault(parsed.name, Family(parsed.type, parsed.documentation))
        for sample in parsed.samples:
            family.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families


def merge_expositions(parts: Iterable[Exposition]) -> Exposition:
    """Add up several expositions sample by sample: every Pigeon metric adds up, but `_created`
    samples keep the earliest value, and the `_HIGHEST` gauges (0/1) the highest."""
    merged: Exposition = {}
    for part in parts:
        for name, family in part.items():
            mine = merged.setdefault(name, Family(family.kind, family.doc))
            samples = mine.samples
            for key, value in family.samples.items():
                if key not in samples:
                    samples[key] = value
                elif key[0].endswith("_created"):
                    samples[key] = min(samples[key], value)
                elif name in _HIGHEST:
                    samples[key] = max(samples[key], value)
                else:
                    samples[key] += value
    return merged


def cumulative(exposition: Exposition) -> Exposition:
    """The families that only ever grow while a process runs (counters, histograms) of an
    exposition: what a process that ended has counted, to carry into the node's totals."""
    return {name: family for name, family in exposition.items() if family.kind in _CUMULATIVE}


def render_exposition(families: Exposition) -> str:
    out = []
    for name, family in families.items():
        # The parser names a counter family without its "_total"; the exposition needs it back.
        header = f"{name}_total" if family.kind == "counter" else name
        out.append(f"# HELP {header} {family.doc}")
        out.append(f"# TYPE {header} {family.kind}")
        for (sample_name, labels), value in family.samples.items():
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            out.append(f"{sample_name}{{{label_text}}} {value!r}" if label_text else f"{sample_name} {value!r}")
    return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def merge_metric_answers(answers: list[tuple[int, Any]]) -> tuple[int, Any]:
    """Answers `{"text": <exposition>}` (one per worker or node) added up into one."""
    texts = [answer["text"] for status, answer in answers if status == 200 and isinstance(answer, dict)]
    return 200, {"text": merge_metrics(texts)}
