"""Migrations: documents of older format versions rewritten into the current form before they
are parsed (artifact/format.py's changelog says what each version added).

Versions 1-8 differ from 9 in what later versions made explicit or added, never in meaning
(8 only added the optional tensor_parallel section):
  * slots may lack `contiguous` (a dense row-major layout was assumed where it was missing);
    it is computed from the slot's own shape and strides (before 5);
  * slots may carry `local` (a kernel-internal buffer, informational; 5 drops it);
  * a C++ kernel library has no kernel table (kernels are found by their aotc names; before 5);
  * the weights are one file, weights.safetensors, when there are any (before 7: `shards`
    names it; no index `map`, no `state_dict` keys, which loading then takes to be every
    weight name);
  * a C++ kernel library is one file at one CPU level (before 9: target.native.isa and
    .library; `libraries` maps that level to it).
"""
from __future__ import annotations

CURRENT = 9
_PLANS = 5     # the last version whose plans changed form


def migrate_manifest(raw: dict, version: int | None = None) -> dict:
    version = raw.get("format_version") if version is None else version
    if not isinstance(version, int) or version >= CURRENT:
        return raw
    out = dict(raw)
    native = (out.get("target") or {}).get("native")
    if version < 5 and isinstance(native, dict) and "kind" not in native:
        out["target"] = dict(out["target"], native=dict(native, table=False))
    native = (out.get("target") or {}).get("native")
    if isinstance(native, dict) and "kind" not in native and isinstance(native.get("isa"), str):
        rest = {k: v for k, v in native.items() if k not in ("isa", "library")}
        out["target"] = dict(out["target"], native=dict(
            rest, libraries={native["isa"]: native.get("library")}))
    weights = out.get("weights")
    if isinstance(weights, dict) and "shards" not in weights:
        count = weights.get("count")
        out["weights"] = dict(weights, shards=["weights.safetensors"] if count else [])
    return out


def migrate_plan(raw, version: int) -> dict:
    if version >= _PLANS or not isinstance(raw, dict) or not isinstance(raw.get("slots"), list):
        return raw
    slots = []
    for s in raw["slots"]:
        if isinstance(s, dict):
            s = {k: v for k, v in s.items() if k != "local"}
            if "shape" in s and "contiguous" not in s:
                s["contiguous"] = _dense(s.get("shape"), s.get("stride"))
        slots.append(s)
    return dict(raw, slots=slots)


def _dense(shape, stride) -> bool:
    if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride):
        return False
    expect = 1
    for size, st in reversed(list(zip(shape, stride))):
        if not isinstance(size, int) or not isinstance(st, int):
            return False
        if size != 1 and st != expect:
            return False
        expect *= size
    return True
