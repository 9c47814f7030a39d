"""One view of a server run by several workers: every worker's answer, added up.

Each function takes (worker, status or None when unreachable, body) for every worker and
answers for the whole server. Counts add up (calls, legs, slots, counters, histogram
buckets); what is the same everywhere (the plugin, the settings) is taken from the first
worker that answered; `/health` also lists each worker with its own counts.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

Answers = list[tuple[int, int | None, bytes]]
SUMMED_HEALTH = ("active_calls", "pending_calls", "capacity", "plugin_slots",
                 "event_loop_tasks")


def _answered(answers: Answers) -> list[tuple[int, bytes]]:
    return [(index, body) for index, status, body in answers if status == 200]


def merge_health(answers: Answers) -> web.Response:
    parts = [(index, json.loads(body)) for index, body in _answered(answers)]
    merged: dict[str, Any] = dict(parts[0][1]) if parts else {"status": "ok"}
    for key in SUMMED_HEALTH:
        merged[key] = sum(int(part.get(key) or 0) for _, part in parts)
    legs: Counter[str] = Counter()
    for _, part in parts:
        legs.update(part.get("legs") or {})
    merged["legs"] = dict(legs)
    merged.pop("pid", None)  # each worker's is in `workers`
    tickers = [part["ticker"] for _, part in parts if isinstance(part.get("ticker"), dict)]
    if tickers:
        merged["ticker"] = merge_tickers(tickers)
    reachable = {index for index, _ in parts}
    merged["workers"] = [
        {"worker": index, "pid": part.get("pid"), "active_calls": part.get("active_calls"),
         "legs": part.get("legs"), "plugin_slots": part.get("plugin_slots"),
         "ticker": part.get("ticker")}
        for index, part in parts
    ] + [{"worker": index, "status": "unreachable"}
         for index, _, _ in answers if index not in reachable]
    merged["workers"].sort(key=lambda worker: worker["worker"])
    return web.json_response(merged)


def merge_tickers(tickers: list[dict[str, Any]]) -> dict[str, Any]:
    """Counters and totals add up, maxima take the largest; a last or mean value is one
    worker's (the first's) and says so by its name only."""
    merged = dict(tickers[0])
    for key in merged:
        values = [ticker.get(key, 0) for ticker in tickers]
        if key.startswith("max_"):
            merged[key] = max(values)
        elif not key.startswith(("last_", "mean_")):
            merged[key] = sum(values)
    return merged


def merge_calls(answers: Answers) -> web.Response:
    calls: list[Any] = []
    for _, body in _answered(answers):
        calls.extend(json.loads(body).get("calls", []))
    return web.json_response({"calls": calls})


def merge_metrics(answers: Answers) -> web.Response:
    """Every worker's Prometheus samples with the same name and labels, summed (counters,
    histogram buckets, sums and counts, and gauges that count things all add up). The
    `_created` timestamps are dropped: they do not add up and are optional."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for _, body in _answered(answers):
        for family in text_string_to_metric_families(body.decode()):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, {}))
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = samples.get(key, 0.0) + sample.value
    lines = []
    for name, (kind, documentation, samples) in families.items():
        lines.append(f"# HELP {name} {_escape_help(documentation)}")
        lines.append(f"# TYPE {name} {kind}")
        for (sample_name, labels), value in samples.items():
            label_text = ",".join(f'{key}="{_escape_label(text)}"' for key, text in labels)
            labelled = f"{sample_name}{{{label_text}}}" if labels else sample_name
            lines.append(f"{labelled} {floatToGoString(value)}")
    response = web.Response(body=("\n".join(lines) + "\n").encode())
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
