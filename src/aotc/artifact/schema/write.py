"""Codegen's side of the schema for manifests: the manifest it produced, checked by the
parser loading uses and returned typed, so an export never writes what a loader would refuse.
(Plans are built typed and checked as they are made: artifact/builder.py.)

A failure here is aotc's own (a manifest its runtime would not read): a LoweringError at export.
"""
from __future__ import annotations

from aotc.errors import ArtifactError, LoweringError
from aotc.artifact.schema.fields import At
from aotc.artifact.schema.manifest import Manifest, parse_manifest

_PENDING = "0" * 64     # the self-hash and file table are filled in by format.write_artifact


def build_manifest(doc: dict) -> Manifest:
    doc = dict(doc, files={}, manifest_sha256=_PENDING)
    try:
        return parse_manifest(At.root("manifest.json (being written)", doc), complete=False)
    except ArtifactError as e:
        raise LoweringError(f"codegen built a manifest its runtime refuses: {e.what}",
                            where=e.where, expected=e.expected, found=e.found,
                            fix="report this as an aotc bug with the model") from None
