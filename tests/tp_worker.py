"""One rank of a tensor-parallel run (tests/test_tensor_parallel.py starts one process per rank;
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment, as torchrun sets
them).

    python tests/tp_worker.py ARTIFACT OUT_DIR [--new-tokens N] [--time N] [--no-group] [--sample]

Loads ARTIFACT after init_process_group("gloo") and runs it on its recorded sample inputs:
a forward artifact's outputs, or a generator's greedy tokens; writes them to
OUT_DIR/rank<R>.safetensors with a JSON line of facts (runner, timings). `--time N` also times
N calls, and N calls of the same collectives alone (tensors of the plans' collective shapes),
to measure what the collectives cost; `--identity` replaces the collectives by copies (the
outputs are then wrong: for timing the rest of the call). `--no-group` loads without a process group and records
the error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

import aotc
from aotc.errors import AotcError


def _collectives(m, entry: str) -> list:
    """(op, shape of its tensor) of each collective step of the entry's plan."""
    plan = m.entries[entry].plan
    return [(s.op, plan.slots[s.args[0].slot].shape) for s in plan.steps
            if getattr(s, "op", "") in ("aotc::all_reduce.default", "aotc::all_gather.default")]


def _time_collectives(steps, calls: int) -> float:
    """Seconds per call of the same collectives alone, on tensors of their shapes."""
    world = dist.get_world_size()
    tensors = [(op, torch.randn([d if isinstance(d, int) else 1 for d in shape]))
               for op, shape in steps]
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        for op, t in tensors:
            if op == "aotc::all_gather.default":
                dist.all_gather([torch.empty_like(t) for _ in range(world)], t)
            else:
                dist.all_reduce(t.clone())
    return (time.perf_counter() - start) / calls


def _run(m, args, facts) -> dict:
    inputs, _ = m.recorded_samples()
    if getattr(m, "generation", None) is not None:
        torch.manual_seed(dist.get_rank())      # --sample: each rank's own random state
        sampling = dict(do_sample=True, temperature=1.5) if args.sample else {}
        out = {"tokens": m.generate(inputs[0], args.new_tokens, **sampling)}
        entry, call = "decode", lambda: m.decode(inputs[0][:, -1:])
    else:
        out = {str(i): t for i, t in enumerate(m.run_flat("forward", inputs))}
        entry, call = "forward", lambda: m.run_flat("forward", inputs)
    if args.time:
        if entry == "decode":
            m.reset()
            m.prefill(inputs[0])
        call()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.time):
            call()
        facts["call_s"] = (time.perf_counter() - start) / args.time
        steps = _collectives(m, entry)
        facts["collectives"] = [op.split("::")[1] for op, _ in steps]
        facts["collectives_s"] = _time_collectives(steps, args.time)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("artifact")
    p.add_argument("out")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--time", type=int, default=0)
    p.add_argument("--no-group", action="store_true")
    p.add_argument("--sample", action="store_true", help="sampled generation (temperature "
                   "1.5), each rank seeded with its rank")
    p.add_argument("--identity", action="store_true",
                   help="replace the collectives by copies (timing only: outputs are wrong)")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    facts = {"rank": rank}
    if not args.no_group:
        dist.init_process_group("gloo")
    if args.identity:
        from aotc.runtime import aotc_ops
        aotc_ops.OPS["aotc::all_reduce.default"] = (torch.clone, "T", 1)
        aotc_ops.OPS["aotc::all_gather.default"] = (
            lambda x, dim, world: torch.cat([x] * world, dim), "Tii", 3)
    try:
        m = aotc.load(args.artifact)
    except AotcError as e:
        facts.update(error=type(e).__name__, what=e.what, expected=str(e.expected),
                     found=str(e.found), fix=e.fix)
        m = None
    out = {}
    if m is not None:
        facts["runtime"] = m.runtime
        out = _run(m, args, facts)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()},
              str(Path(args.out) / f"rank{rank}.safetensors"))
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(facts))
    if not args.no_group:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
