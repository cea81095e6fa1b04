"""NetDef as YAML: `{name, external_inputs, external_outputs, ops: [{type, inputs, ...}]}`.

Lossless and deterministic: dump -> load -> dump is byte-identical. Reading goes through the
YAML node tree (not plain `yaml.load`) so every error can name the line and column.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from netrun.errors import ParseError, suggest
from netrun.proto.defs import ArgValue, NetDef, OperatorDef, normalize_arg
from netrun.util import safe_yaml

_NET_KEYS = ("name", "external_inputs", "external_outputs", "ops")
_OP_KEYS = ("type", "inputs", "outputs", "args", "name", "device", "engine")
_STR = "tag:yaml.org,2002:str"


class _Loader(safe_yaml.LimitedLoader):
    """The size-limited SafeLoader; also reads `1e-5` as a float (YAML 1.1 wants `1.0e-5`)."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes whatever _Loader would not read back as the same string."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a list shared by two ops is written twice, never as &id001 / *id001


def _represent_str(dumper: _Dumper, data: str) -> yaml.ScalarNode:
    # With allow_unicode, PyYAML may write NEL/LS/PS raw in a plain or single-quoted scalar, and
    # the reader folds them into spaces; double quotes make the emitter escape them.
    style = '"' if any(c in data for c in "\x85\u2028\u2029") else None
    return dumper.represent_scalar(_STR, data, style=style)


_Dumper.add_representer(str, _represent_str)

# Without this, a hand-written `epsilon: 1e-5` would silently load as the string "1e-5". The
# dumper gets the same rule so that the string "1e-5" is quoted and stays a string.
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789"))


# Writing ----------------------------------------------------------------------------------
def netdef_to_yaml(net: NetDef) -> str:
    """The NetDef as YAML; empty optional fields are left out."""
    doc: dict[str, Any] = {}
    if net.name:
        doc["name"] = net.name
    if net.external_inputs:
        doc["external_inputs"] = list(net.external_inputs)
    if net.external_outputs:
        doc["external_outputs"] = list(net.external_outputs)
    if net.ops:
        doc["ops"] = [_op_dict(op) for op in net.ops]
    # default_flow_style=None: lists and mappings of scalars on one line ([data, W]), the rest
    # in block style; sort_keys=False keeps the field order above.
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                     allow_unicode=True, width=100)


def _op_dict(op: OperatorDef) -> dict[str, Any]:
    d: dict[str, Any] = {"type": op.type}
    if op.inputs:
        d["inputs"] = list(op.inputs)
    if op.outputs:
        d["outputs"] = list(op.outputs)
    if op.args:
        d["args"] = dict(op.args)
    if op.name:
        d["name"] = op.name
    if op.device is not None:
        d["device"] = op.device
    if op.engine:
        d["engine"] = op.engine
    return d


# Reading ----------------------------------------------------------------------------------
def netdef_from_yaml(text: str, filename: str | None = None) -> NetDef:
    """Parse a NetDef written as YAML; errors are ParseErrors with file:line:col."""
    return _Reader(text, filename).net()


class _Reader:
    def __init__(self, text: str, file: str | None):
        self.text, self.file = text, file
        self.lines = text.split("\n")
        self.constructor = _Loader("")  # builds Python values from nodes we already hold

    def error(self, message: str, node: yaml.Node | None) -> ParseError:
        if node is None:
            return ParseError(message, self.file)
        return self.at(message, node.start_mark.line, node.start_mark.column)

    def at(self, message: str, line: int, column: int) -> ParseError:
        source = self.lines[line] if line < len(self.lines) else None
        return ParseError(message, self.file, line + 1, column + 1, source)

    def net(self) -> NetDef:
        # Limits (depth, aliases, string length) and error positions: netrun.util.safe_yaml.
        loader, root = safe_yaml.compose(self.text, self.file, _Loader)
        loader.dispose()
        if root is None:
            raise ParseError("empty file: expected a NetDef mapping (name, ops, ...)", self.file)
        keys = self.mapping(root, _NET_KEYS, "NetDef")
        ops = keys.get("ops")
        if ops is not None and not isinstance(ops, yaml.SequenceNode):
            raise self.error("'ops' must be a list of operators", ops)
        return NetDef(name=self.string(keys.get("name"), "name") or "",
                      ops=[self.op(node) for node in (ops.value if ops else [])],
                      external_inputs=self.blobs(keys.get("external_inputs"), "external_inputs"),
                      external_outputs=self.blobs(keys.get("external_outputs"),
                                                  "external_outputs"))

    def mapping(self, node: yaml.Node, known: tuple[str, ...], what: str) -> dict[str, yaml.Node]:
        """The key -> value node mapping, rejecting unknown and duplicate keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{what} must be a mapping", node)
        out: dict[str, yaml.Node] = {}
        for key, value in node.value:
            name = self.value(key)
            if not isinstance(name, str):
                raise self.error(f"keys of {what} must be strings, got {name!r}", key)
            if known and name not in known:
                raise self.error(f"unknown key '{name}' in {what}{suggest(name, known)}", key)
            if name in out:  # PyYAML would silently keep the last one
                raise self.error(f"duplicate key '{name}' in {what}", key)
            out[name] = value
        return out

    def value(self, node: yaml.Node) -> Any:
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as e:  # e.g. a !!python/object tag, which SafeLoader refuses
            raise self.error(f"{e.problem}", node) from None

    def string(self, node: yaml.Node | None, what: str, null: bool = False) -> str | None:
        if node is None:
            return None
        value = self.value(node)
        if value is None and null:
            return None
        if not isinstance(value, str):
            raise self.error(f"{what} must be a string, got {value!r} (quote it)", node)
        return value

    def blobs(self, node: yaml.Node | None, what: str) -> list[str]:
        if node is None:
            return []
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR:
            return [self.value(node)]  # a single blob name written without brackets
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(f"{what} must be a list of blob names", node)
        return [self.string(item, f"a blob name in {what}") for item in node.value]

    def op(self, node: yaml.Node) -> OperatorDef:
        keys = self.mapping(node, _OP_KEYS, "op")
        if "type" not in keys:
            raise self.error("op has no 'type'", node)
        args = self.mapping(keys["args"], (), "args") if "args" in keys else {}
        return OperatorDef(self.string(keys["type"], "op type"),
                           tuple(self.blobs(keys.get("inputs"), "inputs")),
                           tuple(self.blobs(keys.get("outputs"), "outputs")),
                           {name: self.arg(name, value) for name, value in args.items()},
                           self.string(keys.get("name"), "op name") or "",
                           self.string(keys.get("device"), "device", null=True),
                           self.string(keys.get("engine"), "engine") or "")

    def arg(self, name: str, node: yaml.Node) -> ArgValue:
        value = self.value(node)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if not isinstance(item, (bool, int, float, str)):
                where = node.value[i] if isinstance(value, list) else node
                raise self.error(f"argument '{name}' must be an int, float, string or a list "
                                 f"of them, got {item!r}", where)
        return normalize_arg(value)
