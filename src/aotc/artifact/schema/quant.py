"""The manifest's `quantization` (format 24, optional; int4 since 26): which weights are stored
quantized.

    "quantization": {
      "scheme": "int8",
      "layers": {"fc1.weight": {"kind": "linear", "scheme": "int8", "dtype": "float32",
                                "shape": [N, K], "weight": "fc1.weight_int8",
                                "scale": "fc1.weight_scale"}, ...},
      "accuracy": {...}            # optional, display: measured at export (exporter/quantize.py)
    }

Each layer is keyed by the full-precision weight's state_dict key it replaced; `weight` names
the stored int8 values [N, K] and `scale` the float32 scales [N], one per output channel (per
row of an embedding table), both stored tensors of the weights index; `dtype` is the dtype the
model computes in. An int4 layer (format 26) also says its "group_size" G (32, 64 or 128,
dividing K); its `weight` (`fc1.weight_int4`) names packed uint8 [N, K/2], two values a byte,
and `scale` float32 [N, K/G] (the layout: artifact/quant.py). An fp8 layer (format 26) is
stored as int8's is, its values float8_e4m3fn [N, K] under `fc1.weight_fp8`. Parsing checks
every field; `check_plan` then checks each plan that reads them against it (the values' slot
has their stored dtype and shape, the scales' float32 [N] or [N, K/G]) before the plan is bound
to any weight. An artifact without the field has no quantized weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotc.artifact.quant import GROUP_SIZES, SCHEMES, check_group, stored_names, stored_shapes
from aotc.artifact.schema.fields import At
from aotc.artifact.schema.types import WEIGHT_NAME

FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16"})
KINDS = frozenset({"linear", "embedding"})
STORED_DTYPE = {"int8": "int8", "int4": "uint8", "fp8": "float8_e4m3fn"}
SCALE_DTYPE = "float32"
MAX_DIM = 1 << 40
SINCE = {"int8": 24, "int4": 26, "fp8": 26}


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantLayer:
    key: str
    kind: str
    scheme: str
    dtype: str
    shape: tuple          # (N, K)
    weight: str
    scale: str
    group_size: int | None = None     # int4 only

    @property
    def stored_shapes(self) -> tuple[tuple, tuple]:
        """(values' shape, scales' shape) as stored (artifact/quant.py)."""
        return stored_shapes(self.scheme, self.shape, self.group_size)

    @property
    def bytes_saved(self) -> int:
        """Bytes the quantized layer stores fewer than its full-precision weight."""
        n, k = self.shape
        (vn, vk), scales = self.stored_shapes
        full = n * k * (4 if self.dtype == "float32" else 2)
        return full - vn * vk - 4 * _numel(scales)

    def describe(self) -> str:
        """The scheme in words: "int8 per channel", "int4 per group of 64"."""
        return f"{self.scheme} per group of {self.group_size}" if self.group_size else \
            f"{self.scheme} per channel"

    def to_json(self) -> dict:
        out = {"dtype": self.dtype, "kind": self.kind, "scale": self.scale,
               "scheme": self.scheme, "shape": list(self.shape), "weight": self.weight}
        if self.group_size is not None:
            out["group_size"] = self.group_size
        return out


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Quantization:
    scheme: str
    layers: dict                       # key -> QuantLayer
    accuracy: dict | None = None       # display only

    def stored(self, resolve=lambda name: name) -> dict:
        """stored name (`resolve`: a name -> the stored tensor it is) -> (layer, "weight" or
        "scale")."""
        out = {}
        for layer in self.layers.values():
            out[resolve(layer.weight)] = (layer, "weight")
            out[resolve(layer.scale)] = (layer, "scale")
        return out

    def to_json(self) -> dict:
        out = {"layers": {k: v.to_json() for k, v in self.layers.items()},
               "scheme": self.scheme}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        return out


def parse_quantization(a: At, weights, version: int) -> Quantization:
    """The field, every name a stored tensor of `weights` (the manifest's index) and no stored
    tensor claimed by two layers."""
    a.check(version >= SINCE["int8"], f"format version {SINCE['int8']} or later",
            "appears in an earlier format")
    a.obj(required=("scheme", "layers"), optional=("accuracy",))
    scheme = a.get("scheme").str(choices=set(SCHEMES))
    layers, claimed = {}, set()
    for key, la in a.get("layers").items(1 << 20):
        la.check(bool(WEIGHT_NAME.match(key)), "weight names", "is not a weight name")
        layer = _layer(la, key)
        la.check(version >= SINCE[layer.scheme], f"{layer.scheme} in format version "
                 f"{SINCE[layer.scheme]} or later", f"is {layer.scheme} in format {version}")
        for name, what in ((layer.weight, "weight"), (layer.scale, "scale")):
            at = la.get(what)
            at.check(name not in claimed, "a stored tensor of one layer only", "repeats one")
            at.check(weights.map is None or weights.stored(name) in weights.map,
                     "a stored tensor (or a tied alias of one)", "names none")
            claimed.add(name)
        layers[key] = layer
    accuracy = a.get("accuracy")
    if a.has("accuracy"):
        accuracy.check(isinstance(accuracy.value, dict), "an object", "is not an object")
    return Quantization(scheme=scheme, layers=layers,
                        accuracy=accuracy.value if a.has("accuracy") else None)


def _layer(a: At, key: str) -> QuantLayer:
    a.obj(required=("kind", "scheme", "dtype", "shape", "weight", "scale"),
          optional=("group_size",))
    scheme = a.get("scheme").str(choices=set(SCHEMES))
    shape = tuple(d.int(1, MAX_DIM) for d in a.get("shape").list(2, 2))
    weight = a.get("weight").str(pattern=WEIGHT_NAME, max_len=1024)
    scale = a.get("scale").str(pattern=WEIGHT_NAME, max_len=1024)
    a.check(weight != scale, "distinct weight and scale names", "names one tensor twice")
    names = stored_names(key, scheme)
    a.check((weight, scale) == names, f"the stored names {list(names)}",
            f"names {[weight[:80], scale[:80]]}")
    a.check(a.has("group_size") == (scheme == "int4"), "a group_size for int4 layers only",
            f"{'has' if a.has('group_size') else 'lacks'} one for {scheme}")
    group = a.get("group_size").int(1, max(GROUP_SIZES)) if a.has("group_size") else None
    if group is not None:
        why = check_group(shape[1], group)
        a.get("group_size").check(why is None, f"one of {list(GROUP_SIZES)} dividing K "
                                  f"{shape[1]}", str(why))
    return QuantLayer(key=key, kind=a.get("kind").str(choices=KINDS), scheme=scheme,
                      dtype=a.get("dtype").str(choices=FLOAT_DTYPES), shape=shape,
                      weight=weight, scale=scale, group_size=group)


def check_plan(plan, quant: Quantization | None, resolve, doc: At) -> None:
    """Each weight slot of `plan` holding a quantized layer's values or scales has the dtype
    and shape the layer says (`resolve`: a slot's weight name -> its stored name)."""
    if quant is None:
        return
    stored, slots = quant.stored(resolve), doc.get("slots")
    for s in plan.slots:
        if s.weight is None or resolve(s.weight) not in stored:
            continue
        layer, what = stored[resolve(s.weight)]
        values, scales = layer.stored_shapes
        dtype, shape = (STORED_DTYPE[layer.scheme], values) if what == "weight" else \
            (SCALE_DTYPE, scales)
        slots.check(s.dtype == dtype and tuple(s.shape) == shape,
                    f"the {what} of quantized layer {layer.key!r} as {dtype}{list(shape)}",
                    f"has slot {s.id} for {s.weight!r} as {s.dtype}{list(s.shape)}")
