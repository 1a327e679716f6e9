"""Rendering of ``shardplan diff`` for people (stderr), from the same dict ``--json`` prints."""
from __future__ import annotations

from typing import Any

from rich.table import Table

from cli.console import console, line, styled


def _v(value: Any) -> str:
    if value is None:  # a setting one plan leaves out (dp_shard: over all of dp, no layout)
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _delta(pair: dict[str, Any]) -> str:
    if "delta" not in pair:
        return ""
    d = pair["delta"]
    return f"{d:+.4g}" if isinstance(d, float) else f"{d:+d}"


def print_diff(doc: dict[str, Any], a: str, b: str) -> None:
    console.print(line("A: ", (a, "bold"), "   B: ", (b, "bold")), soft_wrap=True)
    if doc["identical"]:
        console.print(line(("identical", "green"), ": same degrees, placement, memory and time"))
        return
    for role, item in doc["inputs"].items():
        a, b = item["a"], item["b"]
        if a == b:  # same name, other content (a re-plan's cluster cut to its survivors)
            a, b = (f"{spec} ({(digest or '')[7:19]})" for spec, digest in
                    ((a, item["sha256"]["a"]), (b, item["sha256"]["b"])))
        console.print(line(("input changed", "yellow"), f": {role} {a} -> {b}"))
    table = Table(title="Predicted")
    for column in ("", "A", "B", "change"):
        table.add_column(column, justify="right")
    for key, pair in doc["predicted"].items():
        table.add_row(key, _v(pair["a"]), _v(pair["b"]), _delta(pair))
    console.print(table)
    for title, section in (("Degrees and batch", doc["degrees"]), ("Runtime", doc["runtime"])):
        if section:
            table = Table(title=title)
            for column in ("setting", "A", "B"):
                table.add_column(column)
            for key, pair in section.items():
                table.add_row(key, _v(pair["a"]), _v(pair["b"]))
            console.print(table)
    layers = doc["layers"]
    if not layers["compared"]:
        console.print(line("layers: not compared: ", layers["reason"]))
    elif layers["changed"]:
        table = Table(title=f"Layer moves ({len(layers['changed'])})")
        for column in ("layer", "stage", "recompute", "layout"):
            table.add_column(column)
        for move in layers["changed"]:
            table.add_row(move["name"], *(f"{move[k]['a']} -> {move[k]['b']}" if k in move else ""
                                          for k in ("stage", "recompute", "layout")))
        console.print(table)
    table = Table(title="Per stage (GiB per GPU, seconds per micro-batch)")
    for column in ("stage", "total A", "total B", "change", "activations", "s/mb A", "s/mb B",
                   "change"):
        table.add_column(column, justify="right")
    for s in doc["stages"]:
        if "only_in" in s:
            table.add_row(str(s["index"]), styled(f"only in {s['only_in'].upper()}", "yellow"),
                          _v(s["memory_gib"]["total"]), "", "", "", _v(s["time_s"]), "")
            continue
        m, t = s["memory_gib"], s["time_s"]
        table.add_row(str(s["index"]), _v(m["total"]["a"]), _v(m["total"]["b"]),
                      _delta(m["total"]), _delta(m["activations"]), _v(t["a"]), _v(t["b"]),
                      _delta(t))
    console.print(table)
