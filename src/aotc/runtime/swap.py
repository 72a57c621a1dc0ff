"""`aotc swap-weights ART NEW.safetensors -o OUT`: the same compiled model with other weights.

A fine-tuned (or LoRA-merged) variant of the exported model shares its kernels and plans; only
the weights differ. The new artifact copies every file of the old one byte for byte except the
weights, which are rewritten from the new state dict into the layout the plans read (a weight
the CPU plans store transposed is stored transposed again; dtypes cast to the artifact's, as
`load_state_dict` casts), with the non-persistent buffers and constants the plans need carried
over from the old artifact. The new state dict is checked first, as strictly as
`load_state_dict` checks it. The recorded samples are dropped (their outputs were computed with
the old weights), and so is any signature: the result is a new artifact, to be signed anew.
"""
from __future__ import annotations

from pathlib import Path

from aotc.artifact import format as fmt
from aotc.artifact.reader import Artifact
from aotc.artifact.publish import check_destination
from aotc.runtime.room import plan_extents
from aotc.runtime.runner_file import runner_files
from aotc.artifact.schema.launch import EXTENTS_SINCE
from aotc.artifact.shards import Lazy, resolve_aliases, stored_tensors
from aotc.runtime.statedict import StateMap, check, read_weights_file

SAMPLES = (fmt.SAMPLE_INPUTS, fmt.SAMPLE_OUTPUTS, fmt.SAMPLE_REFERENCE)
PLANS_CHANGED = 5      # plans of earlier versions are migrated when read (schema/migrate.py)


def swap_weights(source, weights_file, dest, *, trusted_keys=None) -> tuple[Path, list[str]]:
    """Write the artifact at `source` with the weights of `weights_file` to `dest`:
    (its path, the files left out). A `dest` named *.aotcpkg is written as a package."""
    import dataclasses
    from aotc.artifact.package import SUFFIX
    if str(dest).endswith(SUFFIX):
        return _swap_to_package(source, weights_file, dest, trusted_keys)
    check_destination(dest)
    art = Artifact(source, trusted_keys=trusted_keys)
    try:
        _refuse_parallel(art.manifest, source)
        old = stored_tensors(art)
        named = resolve_aliases(dict(old), art.manifest)
        smap = StateMap(art.manifest, named)
        copies, _, _ = check(smap, named, read_weights_file(weights_file), True,
                             f"artifact {Path(source).name}")
        stored = dict(old)
        for c in copies:    # last one wins within a tied group, as in load_state_dict
            held = old[c.stored]
            flip = c.stored in smap.transposed
            stored[c.stored] = Lazy(tuple(held.shape), held.dtype,
                                    lambda s=c.source, d=held.dtype, f=flip:
                                    (s.t() if f else s).to(d))
        dropped = [rel for rel in SAMPLES if art.listed(rel)]
        keep = set(art.manifest.weights.shards) | set(dropped)
        files = {rel: art.read(rel) for rel in art.manifest.files if rel not in keep}
        if art.version < PLANS_CHANGED:   # written in the current form, as loading migrated them
            files.update({spec.plan: fmt.dumps(art.plan(name).to_json())
                          for name, spec in art.manifest.entries.items()})
        # the artifact is written in the current format, so its runner files are too (an old
        # artifact lacks them, or has an earlier form; the weights' names, dtypes and shapes
        # do not change)
        plans = {name: art.plan(name) for name in art.manifest.entries}
        if art.version < EXTENTS_SINCE and art.manifest.target.native is not None and \
                art.manifest.target.device.value != "cpu":
            files.update(plan_extents(plans, files))
        files.update(runner_files(dataclasses.replace(art.manifest,
                                                      format_version=fmt.FORMAT_VERSION),
                                  plans, files.__getitem__))
        manifest = dataclasses.replace(
            art.manifest, weights=dataclasses.replace(art.manifest.weights, shards=(), map=None))
        cap = _cap(art.manifest)
        path = fmt.write_artifact(dest, files, manifest, weights=stored, shard_size=cap)
        return path, dropped
    finally:
        art.close()


def _refuse_parallel(manifest, source) -> None:
    """A tensor-parallel artifact's weights are split per rank; a state dict is the whole
    model's, which this does not split (yet)."""
    tp = manifest.tensor_parallel
    if tp is not None:
        from aotc.errors import UsageError
        raise UsageError(f"{source} is split over {tp.world_size} ranks; swapping its weights "
                         "would need the state dict split the same way",
                         where="aotc swap-weights", expected="an artifact that is not "
                         "tensor-parallel", found=f"tensor_parallel world size {tp.world_size}",
                         fix="re-export the model with the new weights and --tensor-parallel "
                             f"{tp.world_size}")


def _swap_to_package(source, weights_file, dest, trusted_keys) -> tuple[Path, list[str]]:
    """swap_weights into a staging directory beside `dest`, then packed to `dest`."""
    from aotc.artifact.package import check_package_destination, pack
    from aotc.artifact.staging import Staging
    dest = check_package_destination(dest)
    with Staging(f".{dest.name}.tmp-", dest.parent) as tmp:
        path, dropped = swap_weights(source, weights_file, Path(tmp) / "swapped.aotc",
                                     trusted_keys=trusted_keys)
        return pack(path, dest), dropped


def _cap(manifest) -> int | None:
    """The shard size the artifact was exported with (None: the default)."""
    from aotc.options import ExportOptions
    size = manifest.options.get("shard_size")
    return ExportOptions(shard_size=size).shard_bytes() if isinstance(size, str) else None
