"""Codegen's side of the schema: the documents it produced, checked by the parsers that
loading uses and returned typed, so an export never writes what a loader would refuse.

A failure here is aotc's own (a plan codegen built that its runtime would not run) or a model
that needs an ATen op outside the runtime's table; both are LoweringErrors at export.
"""
from __future__ import annotations

from aotc.errors import ArtifactError, LoweringError
from aotc.artifact.schema.fields import At
from aotc.artifact.schema.manifest import Manifest, parse_manifest
from aotc.artifact.schema.ops import is_extern_op
from aotc.artifact.schema.plan import Plan, parse_plan

_PENDING = "0" * 64     # the self-hash and file table are filled in by format.write_artifact


def typed_plan(plan: dict, entry: str, symbols) -> Plan:
    for step in plan["steps"]:
        op = step.get("op")
        if op is not None and not is_extern_op(op):
            raise LoweringError(f"the model needs {op}, which aotc's runtime does not call",
                                where=f"plan {entry}", expected="an op of "
                                "artifact/schema/extern_ops.txt", found=op,
                                fix="report this op to aotc (it may need a lowering or a "
                                    "place in the op table), or export the model without it")
    try:
        return parse_plan(At.root(f"plans/{entry}.json (being written)", plan), entry,
                          set(symbols))
    except ArtifactError as e:
        raise LoweringError(f"codegen built a plan its runtime refuses: {e.what}",
                            where=e.where, expected=e.expected, found=e.found,
                            fix="report this as an aotc bug with the model") from None


def build_manifest(doc: dict) -> Manifest:
    doc = dict(doc, files={}, manifest_sha256=_PENDING)
    try:
        return parse_manifest(At.root("manifest.json (being written)", doc), complete=False)
    except ArtifactError as e:
        raise LoweringError(f"codegen built a manifest its runtime refuses: {e.what}",
                            where=e.where, expected=e.expected, found=e.found,
                            fix="report this as an aotc bug with the model") from None
