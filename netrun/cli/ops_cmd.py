"""`netrun ops [TYPE]`: the operator catalogue, generated from the registered schemas."""
from __future__ import annotations

from typing import Any

import click

from netrun.cli.console import console


@click.command("ops", short_help="The operator catalogue, or one operator's schema.")
@click.argument("type", metavar="[TYPE]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue (or the schema of "
              "TYPE) as JSON.")
def ops(type: str | None, as_json: bool) -> None:
    """List every operator, or show the full schema of one TYPE: its inputs and outputs,
    arguments (type, default, allowed values), in-place pairs and whether it has a gradient.
    TYPE is an operator type as Caffe2 names it (Conv, FC, SoftmaxWithLoss).

    \b
    Examples:
      netrun ops
      netrun ops Conv
      netrun ops SoftmaxWithLoss --json
    """
    from netrun.core.schema import all_schemas  # lazy: loaded when the command runs

    if type is None:
        rows = [_summary(s) for s in all_schemas().values()]
        if as_json:
            console.json(rows)
            return
        console.table(["type", "family", "inputs", "outputs", "gradient", "doc"],
                      ([r["type"], r["family"], _io_text(r["inputs"]), _io_text(r["outputs"]),
                        "yes" if r["gradient"] else "no", _clip(r["doc"], 72)] for r in rows))
        console.info(f"{len(rows)} operators; `netrun ops TYPE` shows one in full")
        return
    from netrun.model.yaml_model import lookup_schema  # lazy: loaded when the command runs

    detail = _detail(lookup_schema(type))
    if as_json:
        console.json(detail)
    else:
        _print_detail(detail)


def _io(names: tuple[str, ...], counts: tuple[int, int]) -> dict[str, Any]:
    from netrun.core.schema import MANY  # lazy: loaded when the command runs

    lo, hi = counts
    return {"min": lo, "max": None if hi >= MANY else hi, "names": list(names)}


def _io_text(io: dict[str, Any]) -> str:
    """"X, W, b?" (optional ones marked) or a count like "1", "2+", "1-3"."""
    lo, hi, names = io["min"], io["max"], io["names"]
    if names:
        text = ", ".join(n + ("?" if i >= lo else "") for i, n in enumerate(names))
        return text + (", ..." if hi is None or hi > len(names) else "")
    if hi == lo:
        return str(lo)
    return f"{lo}+" if hi is None else f"{lo}-{hi}"


def _summary(schema) -> dict[str, Any]:
    from netrun.core.gradient import has_gradient  # lazy: loaded when the command runs

    return {"type": schema.type, "family": schema.family,
            "inputs": _io(schema.input_names, schema.inputs),
            "outputs": _io(schema.output_names, schema.outputs),
            "gradient": not schema.no_gradient and has_gradient(schema.type),
            "doc": _first_sentence(schema.doc)}


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    end = text.find(". ")
    return text[:end + 1] if end >= 0 else text


def _detail(schema) -> dict[str, Any]:
    d = _summary(schema)
    d["doc"] = schema.doc.strip()
    d["args"] = [{"name": a.name, "type": a.type, "required": a.required,
                  "default": None if a.required else a.default,
                  "allowed": list(a.allowed) if a.allowed is not None else None, "doc": a.doc}
                 for a in schema.args]
    d["inplace"] = [list(p) for p in schema.inplace]
    d["enforce_inplace"] = [list(p) for p in schema.enforce_inplace]
    d["non_differentiable"] = list(schema.non_differentiable)
    return d


def _print_detail(d: dict[str, Any]) -> None:
    console.line(d["type"], style="bold")
    if d["doc"]:
        console.text(d["doc"])
    console.line()
    console.line(f"family:   {d['family'] or '-'}")
    console.line(f"gradient: {'yes' if d['gradient'] else 'no'}")
    for what in ("inputs", "outputs"):
        io = d[what]
        count = _io_text({**io, "names": []})
        console.line(f"{what + ':':9} {_io_text(io) if io['names'] else '-'}  (count {count})")
    if d["non_differentiable"]:
        console.line(f"no gradient for inputs: {', '.join(map(str, d['non_differentiable']))}")
    pairs = [f"input {i} -> output {o}" for i, o in d["inplace"]]
    pairs += [f"input {i} -> output {o} (required)" for i, o in d["enforce_inplace"]]
    console.line(f"in place: {', '.join(pairs) if pairs else 'no'}")
    if d["args"]:
        console.line()
        console.table(["argument", "type", "default", "allowed", "doc"],
                      ([a["name"], a["type"], "required" if a["required"] else repr(a["default"]),
                        ", ".join(map(repr, a["allowed"])) if a["allowed"] else "", a["doc"]]
                       for a in d["args"]))
