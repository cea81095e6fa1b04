"""Save and Load: the only operators that touch files, through the DB interface."""
from __future__ import annotations

import json

from netrun.core.db import DB_TYPES, open_db
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, MANY, REQUIRED, register_schema
from netrun.errors import CheckpointError, SchemaError

# Save ------------------------------------------------------------------------------------


def _check_groups(op, args) -> None:
    groups = args.groups
    if groups and len(groups) != len(op.inputs if op.type == "Save" else op.outputs):
        raise SchemaError(f"op {op.label}: argument 'groups' must name one group per blob "
                          f"({len(groups)} given)")


register_schema(
    "Save", inputs=(1, MANY), outputs=0, no_gradient=True, family="db", check_fn=_check_groups,
    args=[Arg("db", "str", REQUIRED, doc="file to write"),
          Arg("db_type", "str", "h5", allowed=tuple(DB_TYPES)),
          Arg("groups", "strs", (), doc="group of each blob (params, optimizer, state); default 'blobs'"),
          Arg("attrs", "str", "{}", doc="JSON object of metadata stored next to the blobs")],
    shape_fn=lambda args, ins: [],
    doc="Write the input blobs (host copies) and metadata to one file, atomically.")


@register_kernel("Save")
def save(ctx, *blobs):
    args = ctx.args
    groups = args.groups or ["blobs"] * len(blobs)
    with open_db(args.db, "w", args.db_type) as db:
        for name, group, value in zip(ctx.def_.inputs, groups, blobs):
            db.put(f"{group}/{name}", ctx.backend.to_host(value))
        for key, value in json.loads(args.attrs).items():
            db.put_json(f"meta/{key}", value)


# Load ------------------------------------------------------------------------------------
register_schema(
    "Load", inputs=0, outputs=(1, MANY), no_gradient=True, family="db", check_fn=_check_groups,
    args=[Arg("db", "str", REQUIRED), Arg("db_type", "str", "h5", allowed=tuple(DB_TYPES)),
          Arg("groups", "strs", ())],
    doc="Read the named blobs from a file written by Save onto this workspace's device.")


@register_kernel("Load")
def load(ctx):
    args = ctx.args
    groups = args.groups or ["blobs"] * len(ctx.def_.outputs)
    with open_db(args.db, "r", args.db_type) as db:
        missing = [f"{g}/{n}" for n, g in zip(ctx.def_.outputs, groups) if not db.has(f"{g}/{n}")]
        if missing:
            raise CheckpointError(f"checkpoint '{args.db}' lacks {', '.join(missing)}")
        return tuple(ctx.backend.to_device(db.get(f"{g}/{n}"))
                     for n, g in zip(ctx.def_.outputs, groups))
