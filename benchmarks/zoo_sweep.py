"""Sweeps: breadth beyond the zoo's hand-picked models, each model built from its library's own
registry, so a new release's architectures join without an entry here.

    python -m benchmarks.zoo --families timm-sweep,torchvision-sweep --no-compile --out DIR
    python -m benchmarks.zoo --models timm-sweep/hiera_tiny_224 --no-compile

- `timm-sweep`: one model of every timm module, its smallest registered architecture
  (parameters counted on the meta device, no weights made);
- `torchvision-sweep`: every torchvision classification, segmentation and video model of at
  most 150M parameters (detection needs torchvision's compiled ops; optical flow takes pairs);
- `transformers-sweep`: every transformers model type that takes token ids or pixels and that
  the zoo's own entries lack, from its default config shrunk (benchmarks/zoo_hf_sweep.py).

At size 'small' a model runs at the first input size that builds and runs eagerly: 96 or 112
pixels asked of the model (`img_size` / `image_size`, for models whose position tables depend
on it), the same without asking, then the model's own input size; at 'full', its own size.
"""
from __future__ import annotations

import functools

import torch

from benchmarks import zoo_hf_sweep
from benchmarks.models import ModelSpec, quietly
from benchmarks.zoo_models import ZOO_BATCHES

SMALL_RES = (96, 112)     # 112: a multiple of patches of 14 (and of 16, 8, 7)
MAX_PARAMS = 150_000_000


# ---------------------------------------------------------------------------------- libraries
@quietly
def _timm(name: str, kwargs: dict):
    import timm
    return timm.create_model(name, pretrained=False, **kwargs)


@quietly
def _torchvision(name: str, kwargs: dict):
    import torchvision
    extra = {"weights_backbone": None} if name in _tv_names("segmentation") else {}
    return torchvision.models.get_model(name, weights=None, **extra, **kwargs)


def _params(build, name: str) -> int | None:
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in build(name, {}).parameters())
    except Exception:
        return None


def _tv_names(kind: str) -> tuple[str, ...]:
    import torchvision.models as m
    return tuple(m.list_models(module=getattr(m, kind) if kind else m))


@functools.lru_cache(maxsize=None)
def timm_names() -> tuple[str, ...]:
    import timm
    out = []
    for module in timm.list_modules():
        sizes = [(n, name) for name in timm.list_models(module=module)
                 for n in (_params(_timm, name),) if n is not None]
        out += [min(sizes)[1]] if sizes else []
    return tuple(sorted(out))


@functools.lru_cache(maxsize=None)
def torchvision_names() -> tuple[str, ...]:
    names = [*_tv_names(""), *_tv_names("segmentation"), *_tv_names("video")]
    return tuple(n for n in names if (_params(_torchvision, n) or MAX_PARAMS + 1) <= MAX_PARAMS)


# ------------------------------------------------------------------------------------ shapes
def _shapes(family: str, name: str) -> list[tuple[dict, tuple]]:
    """Candidate (keywords, one sample's input shape) at size 'small', in order."""
    if family == "torchvision-sweep" and name in _tv_names("video"):
        return [({}, (3, 8, 64, 64)), ({}, (3, 16, 112, 112))]
    key = "img_size" if family == "timm-sweep" else "image_size"
    sizes = [(3, r, r) for r in SMALL_RES]
    return [({key: s[-1]}, s) for s in sizes] + [({}, s) for s in sizes]


def _default(family: str, name: str) -> tuple:
    if family == "torchvision-sweep":
        return (3, 16, 224, 224) if name in _tv_names("video") else (3, 224, 224)
    with torch.device("meta"):
        cfg = _timm(name, {}).pretrained_cfg
    return tuple(cfg.get("input_size", (3, 224, 224)))


@functools.lru_cache(maxsize=None)
def shape(family: str, name: str, size: str) -> tuple[dict, tuple]:
    """(keywords, one sample's input shape) the sweep runs `name` at (see the module's doc)."""
    if size == "small":
        for kwargs, dims in _shapes(family, name):
            try:
                torch.manual_seed(0)
                model = BUILDERS[family](name, kwargs).eval()
                with torch.no_grad():
                    model(torch.randn(1, *dims))
                return kwargs, dims
            except Exception:
                continue
    return {}, _default(family, name)


BUILDERS = {"timm-sweep": _timm, "torchvision-sweep": _torchvision}
NAMES = {"timm-sweep": timm_names, "torchvision-sweep": torchvision_names}
REQUIRES = {"timm-sweep": "timm", "torchvision-sweep": "torchvision"}


def sweep_spec(family: str, name: str) -> ModelSpec:
    """The ModelSpec of `name` in sweep `family`."""
    if family == zoo_hf_sweep.FAMILY:
        return zoo_hf_sweep.sweep_spec(name)
    def build(cfg):
        return BUILDERS[family](name, shape(family, name, cfg["size"])[0])

    def inputs(size, batch, gen):
        return (torch.randn(batch, *shape(family, name, size)[1], generator=gen),)
    return ModelSpec(name=name, family=family, requires=REQUIRES[family], build=build,
                     configs={s: {"size": s} for s in ("small", "full")}, inputs=inputs,
                     batches=ZOO_BATCHES)


def sweep(family: str) -> list[ModelSpec]:
    return [sweep_spec(family, n) for n in NAMES[family]()]


NAMES[zoo_hf_sweep.FAMILY] = zoo_hf_sweep.names
FAMILIES = tuple(NAMES)
