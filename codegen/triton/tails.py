"""Tails: a kernel of a few programs run by the last program of the kernel before it.

A decode step at batch 1 is a chain of kernels, each waiting for the one before. Measured in
place on an H100 (scripts/gpu_marginal.py, LLaMA-1B), each RMSNorm kernel (one program: the
residual add, the mean of squares, the scaled row) costs 2.5 us of a 787 us step and each rotary
kernel (three programs) 2.8 us, 127 us in all, almost none of it work: the time goes to the
boundaries, the predecessor's last programs draining, the wait's release, the loads' latency.

So such a kernel B (a static grid of at most TAIL_PROGRAMS programs) becomes the tail of the
kernel A scheduled just before it (a static grid): each program of A, once its own stores are
done, takes a ticket from a counter (an atomic add with release and acquire order, after a block
barrier, so the ticket publishes the program's stores); the program that draws the last ticket
knows every other program's stores are visible, runs B's programs one after the other, and sets
the counter back to 0 for the next kernel. The counter is element 1 of the plan's error flag
(element 0 keeps the index-error code), which the runtime allocates with zeros at each run
(format 18): each run has its own, so concurrent runs never share one, and kernels in stream
order take turns with it (each waits for the one before to finish, its tail included).

B's values are computed exactly as its own kernel would (the same loop IR, blocks and order).
Only B's steps leave the plan; its reads and writes become A's, and what B reads of A's results
is stored by A (codegen._stored counts a tail's reads as another kernel's).
"""
from __future__ import annotations

from dataclasses import dataclass

from aotc.codegen.scheduler import Kernel
from aotc.codegen.triton.blocks import plan_blocks

TAIL_PROGRAMS = 4     # the most programs of a tail (run one after another by one program)
COUNTER = 1           # the ticket counter's element of the error flag


def _grid(kernel: Kernel, buffers: dict, hints) -> list[int] | None:
    """A generated kernel's launch grid when it is static, else None."""
    grid = plan_blocks(kernel, buffers, None, hints).grid()
    return [int(g) for g in grid] if all(g.isdigit() for g in grid) else None


def _generated(step) -> bool:
    return type(step) is Kernel and step.tail is None


def attach_tails(steps: list, kernels: list, buffers: dict, hints) -> list[str]:
    """Make each small static kernel that directly follows a static generated kernel that
    kernel's tail: removed from `steps` and `kernels` (in place). Returns the decisions."""
    decisions, i = [], 0
    while i + 1 < len(steps):
        a, b = steps[i], steps[i + 1]
        if _generated(a) and _generated(b):
            ga, gb = _grid(a, buffers, hints), _grid(b, buffers, hints)
            if ga is not None and gb is not None and gb[1] == gb[2] == 1 \
                    and gb[0] <= TAIL_PROGRAMS:
                a.tail = b
                why = (f"ends with {b.name} ({gb[0]} program{'s' * (gb[0] > 1)}), run by its "
                       "last program: a kernel boundary fewer")
                a.reasons.append(why)
                del steps[i + 1]
                kernels.remove(b)
                decisions.append(f"{a.name}: {why}")
        i += 1
    return decisions


@dataclass
class Tail:
    """A tail as its kernel's writer needs it: B's body lines (program id `aotc_pid`), what B
    writes, its blocks and its program count."""
    lines: list
    written: list
    constexprs: dict
    programs: int


def write_tail(writer) -> Tail:
    """B's body, written by its own KernelWriter (its blocks, its error code: the kernel's),
    and B's reads, sizes and index checks added to `writer`'s."""
    from aotc.codegen.triton.kernel import KernelWriter
    b = writer.k.tail
    tw = KernelWriter(b, writer.buffers, writer.stored, writer.error_code, None, writer.hints)
    lines = [ln.replace("tl.program_id(0)", "aotc_pid").replace("tl.program_id(1)", "0")
             for ln in [*tw._rows(), *tw._nodes()]]   # (its grid is [programs, 1, 1])
    writer.reads |= tw.reads
    writer.address_sizes |= tw.address_sizes
    writer.uses_err = True          # the counter lives in the error flag
    constexprs = {"XBLOCK": tw.blocks.xblock}
    constexprs.update({n.rb: n.size for n in tw.blocks.nodes if n.rb})
    programs = int(tw.blocks.grid()[0])
    return Tail(lines, [w.name for w in b.writes], constexprs, programs)


def tail_text(name: str, tail: Tail, params: list[str], programs: int) -> tuple[str, list]:
    """(the tail's @triton.jit function, the lines that end kernel `name`, of `programs`
    programs, by running it in its last program)."""
    consts = [f"{c}: tl.constexpr" for c in tail.constexprs]
    text = "\n".join(["@triton.jit", f"def {name}_tail({', '.join([*params, 'aotc_pid', *consts])}):",
                      *("    " + ln for ln in tail.lines)]) + "\n\n\n"
    args = ", ".join([*params, "aotc_pid", *(str(v) for v in tail.constexprs.values())])
    return text, [
        "tl.debug_barrier()   # every thread's stores are done before the ticket publishes them",
        f"aotc_ticket = tl.atomic_add(aotc_err + {COUNTER}, 1, sem='release')",
        f"if aotc_ticket == {programs - 1}:   # the last program to finish runs the tail",
        f"    tl.atomic_add(aotc_err + {COUNTER}, 0, sem='acquire')   # sees every store",
        f"    for aotc_pid in range({tail.programs}):",
        f"        {name}_tail({args})",
        f"    tl.atomic_xchg(aotc_err + {COUNTER}, 0)"]
