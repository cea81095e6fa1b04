"""The operator table (Markdown), generated from the schema, kernel and gradient registries.

    python3 -m netrun.tools.ops_table > docs/operators.md

The output depends only on the registries, so a test regenerates it and compares it with the
committed docs/operators.md: whoever adds or changes an op reruns the command above.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from netrun.core.gradient import gradient_ops, has_gradient
from netrun.core.registry import kernel_backends
from netrun.core.schema import MANY, OpSchema, all_schemas, get_schema
from netrun.errors import NetrunError
from netrun.ops import FAMILIES, family_of
from netrun.proto.defs import OperatorDef

COMMAND = "python3 -m netrun.tools.ops_table > docs/operators.md"
COLUMNS = ("type", "family", "inputs", "outputs", "gradient", "CPU", "GPU", "doc")

# Why no gradient flows through an op, by family; a type may have its own reason.
_NO_GRADIENT_FAMILY = {"fill": "filler", "solver_ops": "update op", "optimizers": "update op",
                       "db": "I/O", "metrics": "metric"}
_NO_GRADIENT_TYPE = {"StopGradient": "stops gradients by definition"}


@dataclass(frozen=True)
class OpRow:
    """One line of the table."""

    type: str
    family: str
    inputs: str
    outputs: str
    gradient: str
    cpu: str
    gpu: str
    doc: str

    def cells(self) -> tuple[str, ...]:
        return (f"`{self.type}`", self.family or "-", self.inputs, self.outputs, self.gradient,
                self.cpu, self.gpu, self.doc)


def forward_of(type: str, schemas: dict[str, OpSchema]) -> str | None:
    """The forward op a gradient op belongs to (ReluGradient -> Relu, DropoutGrad -> Dropout)."""
    for suffix in ("Gradient", "Grad"):
        base = type[: -len(suffix)]
        if type.endswith(suffix) and base in schemas:
            return base
    return None


def _io(names: tuple[str, ...], counts: tuple[int, int]) -> str:
    """"X, W, b?" with optional ones marked, "..." when more may follow; or a bare count."""
    lo, hi = counts
    if names:
        text = ", ".join(n + ("?" if i >= lo else "") for i, n in enumerate(names))
        more = hi > len(names) and not names[-1].endswith("...")
        return text + (", ..." if more else "")
    if lo == hi:
        return str(lo)
    return f"{lo}+" if hi >= MANY else f"{lo}-{hi}"


def sample_def(schema: OpSchema) -> OperatorDef:
    """A representative def: every named input and output the counts allow."""
    def count(counts: tuple[int, int], named: int) -> int:
        return max(counts[0], min(counts[1], named))

    n_in = count(schema.inputs, len(schema.input_names))
    n_out = count(schema.outputs, len(schema.output_names))
    return OperatorDef(schema.type, tuple(f"in{i}" for i in range(n_in)),
                       tuple(f"out{j}" for j in range(n_out)))


def _gradient(schema: OpSchema, schemas: dict[str, OpSchema]) -> str:
    base = forward_of(schema.type, schemas)
    if base is not None and not has_gradient(schema.type):
        return f"(gradient of {base})"
    if schema.no_gradient:
        reason = (_NO_GRADIENT_TYPE.get(schema.type) or _NO_GRADIENT_FAMILY.get(schema.family)
                  or ("filler" if schema.type.endswith("Fill") else None))
        return f"none: {reason}" if reason else "none"
    if not has_gradient(schema.type):
        return "**missing**"
    try:
        sample = sample_def(schema)
        ops, grad_of = gradient_ops(sample)
    except NetrunError:
        return "maker"
    types = ", ".join(f"`{t}`" for t in dict.fromkeys(o.type for o in ops))
    skipped = [schema.input_names[i] if i < len(schema.input_names) else f"input {i}"
               for i, name in enumerate(sample.inputs) if grad_of.get(name) is None]
    return types + (f" (not for {', '.join(skipped)})" if skipped else "")


def _kernel(type: str, backend: str) -> str:
    backends = kernel_backends(type)
    if backend in backends:
        # No netrun GPU kernel has run on a real GPU yet (only on the CPU emulator in tests).
        return f"{backend} kernel" + (" (unverified on GPU)" if backend == "gpu" else "")
    if "any" in backends:
        # Shared kernels are written against xp; none has been run on a GPU yet. The conv ops'
        # shared kernels run the backend's own algorithms (netrun.conv.gpu on a GPU).
        if backend == "cpu":
            return "shared"
        algorithms = ", GPU algorithms" if get_schema(type).family == "conv" else ""
        return f"shared{algorithms} (unverified on GPU)"
    return "**missing**"


def _first_sentence(doc: str) -> str:
    """Up to the first full stop that ends a sentence ("e.g. the" does not), pipes escaped."""
    text = " ".join(doc.split())
    end = re.search(r"(?<!\.)\.\s+(?=[A-Z(])", text)
    return (text[:end.start() + 1] if end else text).replace("|", "\\|")


def _family_order() -> dict[str, int]:
    return {f: i for i, f in enumerate(FAMILIES)}


def netrun_schemas() -> dict[str, OpSchema]:
    """The schemas of netrun's own ops (netrun.ops), not those registered by tests."""
    return {t: s for t, s in all_schemas().items() if family_of(t) is not None}


def op_rows() -> list[OpRow]:
    """Every netrun op, grouped by family (in netrun.ops.FAMILIES order), then by type."""
    schemas = netrun_schemas()
    order = _family_order()
    rows = [OpRow(s.type, s.family, _io(s.input_names, s.inputs), _io(s.output_names, s.outputs),
                  _gradient(s, schemas), _kernel(s.type, "cpu"), _kernel(s.type, "gpu"),
                  _first_sentence(s.doc))
            for s in schemas.values()]
    return sorted(rows, key=lambda r: (order.get(r.family, len(order)), r.family, r.type))


def render(rows: list[OpRow]) -> str:
    """The Markdown document: a short legend, then one table row per op."""
    forward = sum(1 for r in rows if not r.gradient.startswith("(gradient of"))
    lines = [
        "# Operators",
        "",
        f"Generated from the registries by `{COMMAND}`; do not edit by hand.",
        f"{len(rows)} operator types ({forward} forward or standalone, "
        f"{len(rows) - forward} gradient ops). `netrun ops TYPE` shows one schema in full.",
        "",
        "- **gradient**: the ops a forward op's gradient maker emits (with the inputs that get "
        "no gradient), `none: reason` where no gradient flows, or the forward op a gradient op "
        "belongs to.",
        "- **CPU / GPU**: `shared` kernels are written once against the backend's array module "
        "(NumPy or CuPy); a `cpu kernel` / `gpu kernel` is the backend's own. No shared kernel "
        "has been run on a GPU yet, hence *unverified*.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the table to stdout."""
    sys.stdout.write(render(op_rows()))


if __name__ == "__main__":
    main()
