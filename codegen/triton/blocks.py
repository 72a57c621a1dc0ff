"""Block planning for Triton kernels: one scheduler Kernel in, its launch shape out.

Simple heuristics, decided once per kernel before any code is written:

  * each node gets an R block over its inner elements: a reduction of up to MAX_PERSISTENT
    elements is persistent (one block holds the whole row), a longer one loops over LOOP_BLOCK
    elements at a time; pointwise nodes take blocks of up to MAX_POINTWISE elements;
  * XBLOCK (rows per program) fills a program with about TARGET_ELEMENTS elements, but never
    leaves the grid with fewer than MIN_PROGRAMS programs when there are enough rows;
  * a pointwise-only kernel whose nodes do not read each other's outputs (and whose inner sizes
    are static) splits the inner elements over grid axis 1 (no loop); otherwise a program loops
    over them;
  * index arithmetic is int32 unless a size is dynamic or a buffer has 2**31 elements or more;
  * num_warps grows with the elements of the largest block.

A `BlockConfig` overrides the heuristics (XBLOCK, the block of every node that loops or splits
over its inner elements, num_warps): what `--autotune` tries. Masks follow from the final block
sizes, whichever chose them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from aotc.codegen.ir import Reduction, product
from aotc.codegen.scheduler import Kernel, node_loads
from aotc.exporter.symbols import SymbolNamer

MAX_PERSISTENT = 4096
LOOP_BLOCK = 1024
MAX_POINTWISE = 1024
TARGET_ELEMENTS = {"pointwise": 1024, "reduction": 2048}
MIN_PROGRAMS = 128
MAX_GRID_Y = 65535            # CUDA's limit on grid dimension y
INT32_LIMIT = 2**31
TILED = ("loop", "split")     # node modes whose R block is a free choice (BlockConfig.rblock)


def pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True, slots=True)
class BlockConfig:
    """Overrides of the heuristics for one kernel; None keeps the heuristic's choice.

    `xblock`: rows per program (at most the rows, rounded up to a power of two, when they are
    static). `rblock`: the R block of the nodes that loop or split over their inner elements
    (at most their elements, rounded up, when static); a persistent reduction's block holds its
    whole row, and a pointwise node that fits one block keeps it, so neither changes.
    `num_warps`: warps per program."""
    xblock: int | None = None
    rblock: int | None = None
    num_warps: int | None = None

    def __post_init__(self):
        for name in ("xblock", "rblock", "num_warps"):
            v = getattr(self, name)
            if v is not None and (v < 1 or v & (v - 1)):
                raise ValueError(f"BlockConfig.{name} must be a power of two, got {v}")

    def to_json(self) -> dict:
        return {"xblock": self.xblock, "rblock": self.rblock, "num_warps": self.num_warps}


@dataclass(frozen=True, slots=True)
class NodeBlock:
    rb: str | None          # constexpr name of the node's R block, None without inner elements
    size: int               # elements per R block
    numel: sympy.Expr       # inner elements of the node
    mode: str               # "none" | "single" | "loop" | "split"
    rmask: str | None       # name of the R mask, None where every lane is valid


@dataclass
class KernelBlocks:
    rows: sympy.Expr
    xblock: int
    xmask: bool
    wide: bool
    split: bool
    num_warps: int
    nodes: list = field(default_factory=list)

    @property
    def widest(self) -> int:
        """Elements of the largest R block (1 without any)."""
        return _widest(self.nodes)

    def grid(self) -> list[str]:
        """The launch grid as Python expressions over the plan's size symbols."""
        name = SymbolNamer().expr
        x = _cdiv(self.rows, self.xblock)
        y = sympy.Integer(1)
        if self.split:
            y = sympy.Max(*[_cdiv(b.numel, b.size) for b in self.nodes if b.rb] or [y])
        return [name(x), name(y), "1"]


def _widest(nodes: list) -> int:
    return max([b.size for b in nodes if b.rb] or [1])


def heuristic_warps(elems: int) -> int:
    """Warps for a program holding blocks of `elems` elements."""
    return 1 if elems <= 128 else 2 if elems <= 512 else 4 if elems <= 2048 else 8


def heuristic_config(blocks: KernelBlocks) -> BlockConfig:
    """The config that `blocks` was planned with, as overrides: planning with it gives the same
    blocks. Its rblock is the largest block of the nodes that loop or split (a node with fewer
    elements clamps it to its own size, as the heuristic did), None when no node does."""
    tiled = [b.size for b in blocks.nodes if b.mode in TILED]
    return BlockConfig(xblock=blocks.xblock, rblock=max(tiled) if tiled else None,
                       num_warps=blocks.num_warps)


def _cdiv(a, b: int):
    from aotc.codegen.ir import FloorDiv
    return FloorDiv(a + b - 1, b) if b != 1 else a


def _inner(kernel: Kernel, node) -> tuple:
    body = node.body
    if isinstance(body, Reduction):
        return tuple(body.reduction_ranges)
    return tuple(body.ranges[len(kernel.prefix):])


def _static(e) -> int | None:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else None


def _is_wide(kernel: Kernel, buffers: dict) -> bool:
    names = {b.name for b in kernel.writes}
    for node in kernel.nodes:
        names |= {n for n, _ in node_loads(node, len(kernel.prefix))[0]}
    sizes = [product(buffers[n].shape) for n in names if n in buffers]
    sizes += [product(kernel.prefix) * product(_inner(kernel, n)) for n in kernel.nodes]
    return any(_static(s) is None or _static(s) >= INT32_LIMIT for s in sizes)


def _independent(kernel: Kernel) -> bool:
    """No node reads a buffer an earlier node of the kernel wrote."""
    written: set = set()
    for node in kernel.nodes:
        if {n for n, _ in node_loads(node, len(kernel.prefix))[0]} & written:
            return False
        written |= {b.name for b in node.buffers}
    return True


def _node_block(j: int, numel, reduction: bool, split: bool, has_inner: bool,
                rblock: int | None) -> NodeBlock:
    n = _static(numel)
    if not has_inner and not reduction:
        return NodeBlock(None, 1, sympy.Integer(1), "none", None)
    cap = MAX_PERSISTENT if reduction else MAX_POINTWISE
    if n is not None and n <= cap:
        size, mode = pow2(n), ("split" if split else "single")
    else:
        size = LOOP_BLOCK if reduction else MAX_POINTWISE
        mode = "split" if split else "loop"
    if rblock is not None and mode in TILED:
        size = rblock if n is None else min(rblock, pow2(n))
    exact = n is not None and n % size == 0 and (mode != "single" or n == size)
    return NodeBlock(f"R{j}_BLOCK", size, sympy.sympify(numel), mode,
                     None if exact else f"rmask{j}")


def plan_blocks(kernel: Kernel, buffers: dict, config: BlockConfig | None = None) -> KernelBlocks:
    """The blocks of `kernel`: the heuristics, with what `config` overrides."""
    config = config or BlockConfig()
    reduction = any(isinstance(n.body, Reduction) for n in kernel.nodes)
    inner = [product(_inner(kernel, n)) for n in kernel.nodes]
    chunk = config.rblock or MAX_POINTWISE   # a split node's block, at most
    split = not reduction and _independent(kernel) and all(
        _static(n) is not None and -(-_static(n) // chunk) <= MAX_GRID_Y for n in inner)
    nodes = [_node_block(j, product(_inner(kernel, n)), isinstance(n.body, Reduction), split,
                         bool(_inner(kernel, n)), config.rblock)
             for j, n in enumerate(kernel.nodes)]
    rows = product(kernel.prefix)
    r = _static(rows)
    if config.xblock is not None:
        xblock = config.xblock if r is None else min(config.xblock, pow2(r))
    else:
        xblock = max(1, TARGET_ELEMENTS["reduction" if reduction else "pointwise"]
                     // _widest(nodes))
        if r is not None:
            xblock = min(xblock, pow2(r))
            while xblock > 1 and -(-r // xblock) < MIN_PROGRAMS and r >= MIN_PROGRAMS:
                xblock //= 2
    if split:
        nodes = _split_masks(nodes)
    return KernelBlocks(rows=rows, xblock=xblock, xmask=not (r is not None and r % xblock == 0),
                        wide=_is_wide(kernel, buffers), split=split,
                        num_warps=config.num_warps or heuristic_warps(xblock * _widest(nodes)),
                        nodes=nodes)


def _split_masks(nodes: list) -> list:
    """In a split kernel every node sees as many chunks as the node with the most; a node
    with fewer (or a dynamic count anywhere) masks its lanes."""
    counts = [-(-_static(b.numel) // b.size) if _static(b.numel) is not None else None
              for b in nodes if b.rb]
    most = None if None in counts else max(counts, default=1)
    out = []
    for j, b in enumerate(nodes):
        full = most is not None and _static(b.numel) == b.size * most
        out.append(b if b.rb is None or b.rmask or full else
                   NodeBlock(b.rb, b.size, b.numel, b.mode, f"rmask{j}"))
    return out
