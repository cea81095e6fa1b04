"""Graphviz DOT text of a net: a node per op (type, name, output shapes, parameters), edges
by blob."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from netrun.errors import NetrunError

# How to get Graphviz's `dot`, named wherever a picture could not be drawn.
GET_DOT = ("Graphviz's `dot` is not installed; get it with `apt install graphviz` (Debian, "
           "Ubuntu), `brew install graphviz` (macOS) or from https://graphviz.org/download/")

# Fill colours by op family, so a drawing reads at a glance; anything else is grey.
COLOURS = {"Conv": "#cfe2f3", "FC": "#d9ead3", "MaxPool": "#fff2cc", "AveragePool": "#fff2cc",
           "Relu": "#f4cccc", "Softmax": "#ead1dc", "SpatialBN": "#d0e0e3",
           "Dropout": "#eeeeee", "Concat": "#fce5cd", "Sum": "#fce5cd"}


def _quote(text: str) -> str:
    """A DOT double-quoted string (backslashes and quotes escaped; \\n kept as a line break)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _shape(blob: dict[str, Any]) -> str:
    if blob["shape"] is None:
        return "?"
    return "×".join(map(str, blob["shape"])) if blob["shape"] else "scalar"


def net_dot(report: dict[str, Any]) -> str:
    """DOT text of one net from `netrun inspect`'s report (same report, same bytes)."""
    title = (f"{report['model']}: {report['net']} net, batch {report['batch']}, "
             f"{report['total_params']:,} parameters")
    lines = [f"digraph {_quote(report['net_name'] or report['model'])} {{",
             "  rankdir=TB;",
             f"  label={_quote(title)};",
             "  labelloc=t;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];']
    writer: dict[str, str] = {}          # blob -> the node that last wrote it
    edges: list[str] = []
    for blob in report["inputs"]:
        node = f"in:{blob['name']}"
        writer[blob["name"]] = node
        lines.append(f"  {_quote(node)} [shape=ellipse, style=filled, fillcolor=\"#ffffff\", "
                     f"label={_quote(blob['name'] + chr(10) + _shape(blob))}];")
    for i, op in enumerate(report["ops"]):
        node = f"op{i}"
        label = [op["name"] or f"#{i}", op["type"]]
        label += [f"→ {b['name']} {_shape(b)}" for b in op["outputs"]]
        if op["params"]:
            label.append(f"params {op['params']:,}")
        colour = COLOURS.get(op["type"], "#f3f3f3")
        lines.append(f"  {node} [label={_quote(chr(10).join(label))}, "
                     f"fillcolor={_quote(colour)}];")
        for b in op["inputs"]:
            # Params are counted in the node, not drawn: a weight edge per op hides the flow.
            if b["param"] or b["name"] not in writer:
                continue
            edges.append(f"  {_quote(writer[b['name']])} -> {node} [label={_quote(b['name'])}];")
        for b in op["outputs"]:
            writer[b["name"]] = node     # in-place ops (ReLU) take over their blob
    for blob in report["outputs"]:
        if blob["name"] in writer:
            node = f"out:{blob['name']}"
            lines.append(f"  {_quote(node)} [shape=ellipse, style=filled, fillcolor=\"#ffffff\", "
                         f"label={_quote(blob['name'] + chr(10) + _shape(blob))}];")
            edges.append(f"  {_quote(writer[blob['name']])} -> {_quote(node)};")
    return "\n".join(lines + edges + ["}"]) + "\n"


def render(dot_text: str, path: str | os.PathLike) -> Path | None:
    """Write `path` (.svg or .png) with Graphviz's `dot`; None when `dot` is not on PATH."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png"):
        raise NetrunError(f"{path}: cannot draw a '{path.suffix}' file; use .svg, .png or .dot")
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=dot_text.encode(),
                              capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise NetrunError(f"Graphviz's dot took over 5 minutes to draw {path}") from None
    if done.returncode != 0:
        raise NetrunError(f"Graphviz's dot failed to draw {path} (exit status "
                          f"{done.returncode}): {done.stderr.decode(errors='replace').strip()}")
    return path
