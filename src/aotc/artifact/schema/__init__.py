"""The artifact schema: one typed description of manifest.json, plans/<entry>.json and
kernels/<name>.json that codegen writes through and the runtime reads through.

Parsing is validation (fields.py): every field has a type and a range, names are identifiers,
dtypes and extern ops come from fixed tables (types.py, ops.py), sizes are integers or
expressions of a small grammar over declared symbols (expr.py), plans are checked as programs
(flow.py), and older format versions are migrated before parsing (migrate.py). A malformed
document raises ArtifactError naming the file, the field, the expected and the found value.
"""
from aotc.artifact.schema.fields import At, load_json
from aotc.artifact.schema.launch import LaunchSpec, parse_launch
from aotc.artifact.schema.manifest import Manifest, parse_manifest
from aotc.artifact.schema.plan import Plan, parse_plan

__all__ = ["At", "load_json", "LaunchSpec", "parse_launch", "Manifest", "parse_manifest",
           "Plan", "parse_plan"]
