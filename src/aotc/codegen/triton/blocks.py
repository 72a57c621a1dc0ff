"""Block planning for Triton kernels: one scheduler Kernel in, its launch shape out.

Simple heuristics, decided once per kernel before any code is written:

  * each node gets an R block over its inner elements: a reduction of up to MAX_PERSISTENT
    elements is persistent (one block holds the whole row), a longer one loops over LOOP_BLOCK
    elements at a time; pointwise nodes take blocks of up to MAX_POINTWISE elements, or of up to
    MAX_PERSISTENT in a kernel of at most FEW_ROWS static rows (latency-bound: a decode step's
    RMSNorm at batch 1 loads its row once, not once per loop pass), where a longer row loops
    over FEW_ROWS_LOOP elements at a time (the greedy token's argmax over a vocabulary);
  * XBLOCK (rows per program) fills a program with about TARGET_ELEMENTS elements, but never
    leaves the grid with fewer than MIN_PROGRAMS programs when there are enough rows;
  * an *outer* reduction kernel (`reduction_order`: its loads walk consecutive addresses along
    the kernel's rows and stride along the reduced elements, as a bias gradient's column sums
    do) is planned as Inductor plans one: a wide XBLOCK of OUTER_ELEMENTS // R block rows
    (OUTER_MIN_XBLOCK..OUTER_MAX_XBLOCK: 64 at the default R block) and a small R block of
    OUTER_RBLOCK elements (more with fewer than 64 rows), looped, so that a warp's lanes read
    consecutive addresses (the [XBLOCK, R] tile's X axis is the contiguous one, which Triton's
    coalescing finds from the index); a reduction whose loads are contiguous along the row
    keeps the plan above;
  * a pointwise-only kernel whose nodes do not read each other's outputs (and whose inner sizes
    are static) splits the inner elements over grid axis 1 (no loop); otherwise a program loops
    over them;
  * index arithmetic is int32 unless a size is dynamic or a buffer has 2**31 elements or more;
  * num_warps grows with the elements of the largest block (at least FEW_ROWS_WARPS in a kernel
    of at most FEW_ROWS rows: on an H100 a LLaMA-1B decode step took 834 -> 814 us;
    FEW_ROWS_LOOP_WARPS where such a kernel loops).

Long reductions onto few outputs are split in two (`split_reduction`, applied by the graph
lowering for CUDA targets): a first reduction writes S partial results per output (in the
accumulation dtype), a second reduces those; no atomics. See `split_reduction` for the rule.

A `BlockConfig` overrides the heuristics (XBLOCK, the block of every node that loops or splits
over its inner elements, or of every node of an outer reduction, num_warps): what `--autotune`
tries. Masks follow from the final block sizes, whichever chose them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from aotc.codegen.ir import FloorDiv, ModIndex, Reduction, ReductionType, product
from aotc.codegen.scheduler import Kernel, node_loads
from aotc.exporter.symbols import SymbolNamer

MAX_PERSISTENT = 4096
LOOP_BLOCK = 1024
MIN_HINTED_BLOCK = 64       # a dynamic loop's block, at least, whatever its example size
MAX_POINTWISE = 1024
# a kernel of at most FEW_ROWS static rows (a decode step's RMSNorm at batch 1: one program) is
# bound by latency: its pointwise nodes take one block up to MAX_PERSISTENT elements too, so
# a row is loaded in one round trip, not one per MAX_POINTWISE loop pass
FEW_ROWS = 16
FEW_ROWS_WARPS = 8   # and at least 8 warps: more loads in flight, a shorter reduction per thread
# a longer row loops FEW_ROWS_LOOP elements at a time with 16 warps (the greedy token's argmax
# over a vocabulary at batch 1: 4 round trips for 32000, 7 for GPT-2's 50257; on an H100 a
# decode step was 0.7-1.0% faster than with ATen's argmax after the plan, while loops of 4096
# with 8 warps were 0-1.2% slower; benchmarks/results/h100-generate/greedy-token/)
FEW_ROWS_LOOP = 8192
FEW_ROWS_LOOP_WARPS = 16
TARGET_ELEMENTS = {"pointwise": 1024, "reduction": 2048}
MIN_PROGRAMS = 128
MAX_GRID_Y = 65535            # CUDA's limit on grid dimension y
INT32_LIMIT = 2**31
TILED = ("loop", "split")     # node modes whose R block is a free choice (BlockConfig.rblock)
# outer reductions (rows contiguous in memory, reduced elements strided)
OUTER_RBLOCK = 32             # R block (looped) with at least OUTER_ELEMENTS // 32 = 64 rows
OUTER_ELEMENTS = 2048         # XBLOCK x R block
OUTER_MAX_XBLOCK = 128
OUTER_MIN_XBLOCK = 32         # XBLOCK never halves below this to make programs
# split reductions (two stages), for long reductions onto few outputs
SPLIT_PROGRAMS = 264          # programs the first stage aims for: 2 per SM of a 132-SM H100/H200
SPLIT_MIN_WORK = 8192         # elements a first-stage program reduces, at least
# transposing copies (a pointwise kernel whose loads walk memory along its rows while it stores
# along its inner elements): 2-d tiles, so that loads and stores both touch whole sectors
TRANSPOSE_XBLOCK = 64
TRANSPOSE_RBLOCK = 32
SPLITTABLE = frozenset({ReductionType.SUM, ReductionType.PROD, ReductionType.MAX,
                        ReductionType.MIN, ReductionType.ANY, ReductionType.ALL})


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
    tiled: bool = False     # its size is BlockConfig.rblock's to choose


@dataclass
class KernelBlocks:
    rows: sympy.Expr
    xblock: int
    xmask: bool
    wide: bool
    split: bool
    num_warps: int
    nodes: list = field(default_factory=list)
    outer: bool = False     # an outer reduction: wide XBLOCK, small looped R blocks

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
    blocks. Its rblock is the largest block of the nodes that loop or split, or of the nodes of
    an outer reduction (a node with fewer elements clamps it to its own size, as the heuristic
    did), None when there are none."""
    tiled = [b.size for b in blocks.nodes if b.tiled]
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


def _at(e, values: dict):
    """`e` with its size symbols replaced by their `values` (by name: symbols carry
    assumptions that a plain name would not match)."""
    e = sympy.sympify(e)
    return e.subs({s: values[s.name] for s in e.free_symbols if s.name in values})


@dataclass(frozen=True, slots=True)
class SizeHints:
    """What export knows of the size symbols (name -> size): the example each was exported
    at, which the heuristics size dynamic dims' blocks for (as Inductor does from its size
    hints), and its declared maximum, which bounds index arithmetic."""
    example: dict
    maximum: dict


def _is_wide(kernel: Kernel, buffers: dict, maximum: dict | None = None) -> bool:
    """Whether the kernel must index in 64 bits: a buffer or iteration space it touches may
    hold 2**31 elements or more. Dynamic sizes are taken at the symbols' declared maxima
    (`maximum`; sizes grow with every symbol, and the guards refuse anything larger), so a
    dynamic kernel keeps 32-bit index arithmetic (divisions by runtime sizes cost far less in
    32 bits) unless its range allows more."""
    names = {b.name for b in kernel.writes} | kernel.reads
    sizes = [product(buffers[n].shape) for n in names if n in buffers]
    sizes += [product(kernel.prefix) * product(_inner(kernel, n)) for n in kernel.nodes]
    sizes = [_static(_at(s, maximum)) if maximum else _static(s) for s in sizes]
    return any(s is None or s >= INT32_LIMIT for s in sizes)


def _independent(kernel: Kernel) -> bool:
    """No node reads a buffer an earlier node of the kernel wrote."""
    written: set = set()
    for node in kernel.nodes:
        if {n for n, _ in node_loads(node, len(kernel.prefix))[0]} & written:
            return False
        written |= {b.name for b in node.buffers}
    return True


def _node_block(j: int, numel, reduction: bool, split: bool, has_inner: bool,
                rblock: int | None, hint: int | None = None, few: bool = False) -> NodeBlock:
    """`hint`: the node's elements at the example sizes, when they are dynamic: the loop's
    block fits them (a softmax over a dynamic seq exported at 128 loops 128 at a time, not 1024
    with 7/8 of the lanes masked off). `few`: the kernel has at most FEW_ROWS rows."""
    n = _static(numel)
    if not has_inner and not reduction:
        return NodeBlock(None, 1, sympy.Integer(1), "none", None)
    cap = MAX_PERSISTENT if reduction or few else MAX_POINTWISE
    if n is not None and n <= cap:
        size, mode = pow2(n), ("split" if split else "single")
    else:   # a few-row kernel's loop takes long blocks too: fewer round trips a row
        size = FEW_ROWS_LOOP if few else LOOP_BLOCK if reduction else MAX_POINTWISE
        if n is None and hint is not None:
            size = min(size, max(MIN_HINTED_BLOCK, pow2(hint)))
        mode = "split" if split else "loop"
    if rblock is not None and mode in TILED:
        size = rblock if n is None else min(rblock, pow2(n))
    exact = n is not None and n % size == 0 and (mode != "single" or n == size)
    return NodeBlock(f"R{j}_BLOCK", size, sympy.sympify(numel), mode,
                     None if exact else f"rmask{j}", mode in TILED)


# ------------------------------------------------------------------------- outer reductions

def _innermost(ranges: dict):
    """The last loop variable of `ranges` (var -> size) whose dim is not of size 1."""
    return next((v for v, n in reversed(list(ranges.items())) if n != 1), None)


def _step(e, var):
    """How far `e` moves when `var` steps by one, for most values of `var` (a `% m` or `// m`
    of a smaller step wraps or carries only once every m / step values): an integer or size
    expression, None where that is not one number (`var` times another loop variable, inside a
    min, or a step that a division scales unevenly)."""
    if var not in e.free_symbols:
        return sympy.Integer(0)
    if e == var:
        return sympy.Integer(1)
    if e.is_Add:
        steps = [_step(a, var) for a in e.args]
        return None if None in steps else sympy.Add(*steps)
    if e.is_Mul:
        moving = [a for a in e.args if var in a.free_symbols]
        if len(moving) != 1 or any(not v.is_positive for a in e.args if a is not moving[0]
                                   for v in a.free_symbols):   # times another loop variable
            return None
        step = _step(moving[0], var)
        return None if step is None else sympy.Mul(*[a for a in e.args if a is not moving[0]],
                                                  step)
    if isinstance(e, (FloorDiv, ModIndex)) and var not in e.args[1].free_symbols:
        step, m = _step(e.args[0], var), e.args[1]
        if step is None or step == 0:
            return step
        if sympy.cancel(step / m).is_integer:     # whole turns of the modulus
            return sympy.Integer(0) if isinstance(e, ModIndex) else sympy.cancel(step / m)
        if isinstance(e, ModIndex):
            return step if (m - step).is_positive else None
        return sympy.Integer(0) if (m - step).is_positive else None
    return None


def order_votes(loads, rows: dict, inner: dict) -> int:
    """How much more `loads` ((buffer, index) over the row vars `rows` and the inner vars
    `inner`, each var -> size) walk memory along the rows than along the inner elements: +1
    for a load whose index steps by 1 along the innermost row and by something else along the
    innermost inner dim, -1 for one that steps by 1 along the inner dim (`_step`: a view's
    `% m` steps as its operand does). A load constant along either (a per-row or per-element
    operand, read once per program or per block) or whose steps are not one number does not
    vote."""
    x, r = _innermost(rows), _innermost(inner)
    if x is None or r is None:
        return 0
    votes = 0
    for _, index in loads:   # no need to simplify: `_step` reads `%` and `//` as they are
        index = sympy.sympify(index)
        cx, cr = _step(index, x), _step(index, r)
        if cx is None or cr is None or cx == 0 or cr == 0:
            continue
        votes += -1 if cr == 1 else 1 if cx == 1 else 0
    return votes


def reduction_order(loads, rows: dict, inner: dict) -> str:
    """'outer' where a reduction's loads (see `order_votes`) are mostly contiguous along its
    rows and strided along the reduced elements (a column sum), else 'inner'."""
    return "outer" if order_votes(loads, rows, inner) > 0 else "inner"


def _is_outer(kernel: Kernel) -> bool:
    """Whether `kernel` is an outer reduction: it has reductions, every node with inner
    elements is one, and their loads vote for the rows (`order_votes`)."""
    k = len(kernel.prefix)
    if not any(isinstance(n.body, Reduction) for n in kernel.nodes):
        return False
    votes = 0
    for node in kernel.nodes:
        if not isinstance(node.body, Reduction):
            if _inner(kernel, node):
                return False
            continue
        loads, pvars, inner = node_loads(node, k)
        votes += order_votes(loads, dict(zip(pvars, kernel.prefix)), inner)
    return votes > 0


def _outer_rblock(rows) -> int:
    """An outer reduction's R block: OUTER_RBLOCK, or more where fewer rows than
    OUTER_ELEMENTS // OUTER_RBLOCK leave XBLOCK narrower."""
    r = _static(rows)
    widest_x = OUTER_ELEMENTS // OUTER_RBLOCK
    return OUTER_RBLOCK if r is None or r >= widest_x else OUTER_ELEMENTS // pow2(max(r, 1))


def _outer_node_block(j: int, node, numel, rblock: int) -> NodeBlock:
    """Node j of an outer reduction: a reduction loops over R blocks of `rblock` elements
    (one block where its elements fit one); a pointwise node has no inner elements."""
    if not isinstance(node.body, Reduction):
        return NodeBlock(None, 1, sympy.Integer(1), "none", None)
    n = _static(numel)
    size = rblock if n is None else min(rblock, pow2(n))
    mode = "single" if n is not None and n <= size else "loop"
    exact = n is not None and n % size == 0 and (mode != "single" or n == size)
    return NodeBlock(f"R{j}_BLOCK", size, sympy.sympify(numel), mode,
                     None if exact else f"rmask{j}", True)


def _outer_xblock(rows, widest: int) -> int:
    """An outer reduction's XBLOCK: OUTER_ELEMENTS // its widest R block, within
    OUTER_MIN_XBLOCK..OUTER_MAX_XBLOCK, at most the rows; halved (not below OUTER_MIN_XBLOCK)
    while the grid has fewer than MIN_PROGRAMS programs and there are enough rows."""
    r = _static(rows)
    xblock = min(OUTER_MAX_XBLOCK, max(OUTER_MIN_XBLOCK, OUTER_ELEMENTS // widest))
    if r is not None:
        xblock = min(xblock, pow2(r))
        while xblock > OUTER_MIN_XBLOCK and -(-r // xblock) < MIN_PROGRAMS and r >= MIN_PROGRAMS:
            xblock //= 2
    return xblock


def _plan_outer(kernel: Kernel, buffers: dict, config: BlockConfig) -> KernelBlocks:
    rows = product(kernel.prefix)
    r = _static(rows)
    rblock = config.rblock or _outer_rblock(rows)
    nodes = [_outer_node_block(j, n, product(_inner(kernel, n)), rblock)
             for j, n in enumerate(kernel.nodes)]
    if config.xblock is not None:
        xblock = config.xblock if r is None else min(config.xblock, pow2(r))
    else:
        xblock = _outer_xblock(rows, _widest(nodes))
    return KernelBlocks(rows=rows, xblock=xblock, xmask=not (r is not None and r % xblock == 0),
                        wide=_is_wide(kernel, buffers), split=False,
                        num_warps=config.num_warps or heuristic_warps(xblock * _widest(nodes)),
                        nodes=nodes, outer=True)


# ------------------------------------------------------------------------- split reductions

def split_reduction(rows, rranges, outer: bool) -> tuple[int, int, int] | None:
    """Where to split a reduction of `rows` outputs over `rranges` into two stages, as
    (S, j, c): the first stage reduces S chunks of each output's elements (rows S x outputs),
    the second reduces the S partial results; a chunk is `c` consecutive indices of reduced dim
    j (c divides it) and all of the dims after j, so chunk indices are plain index arithmetic.
    None: one stage. Static sizes only. The rule:

      * the one-stage plan's programs: one per row (inner), one per OUTER_ELEMENTS //
        OUTER_RBLOCK rows (outer); at least SPLIT_PROGRAMS // 2 (one per SM) need no split;
      * S is the largest such chunk count of at most SPLIT_PROGRAMS / programs (two programs
        per SM) that leaves each first-stage program SPLIT_MIN_WORK elements or more, and at
        least 2.

    E.g. a bias gradient over 2048 rows of 768 columns (outer): 12 programs, S = 16 chunks of
    128 rows, 192 first-stage programs of 64 columns."""
    n = _static(product(rows))
    sizes = [_static(d) for d in rranges]
    if n is None or n == 0 or not sizes or None in sizes or 0 in sizes:
        return None
    per_program = min(OUTER_ELEMENTS // OUTER_RBLOCK, pow2(n)) if outer else 1
    programs = -(-n // per_program)
    if programs >= SPLIT_PROGRAMS // 2:
        return None
    most = min(-(-SPLIT_PROGRAMS // programs),
               int(product(sizes)) * per_program // SPLIT_MIN_WORK)
    best, lead = None, 1
    for j, d in enumerate(sizes):
        if lead > most:
            break
        for c in sympy.divisors(d)[:-1]:          # c < d: the dim is cut
            chunks = lead * (d // c)
            if 2 <= chunks <= most and (best is None or chunks > best[0]):
                best = (chunks, j, c)
        lead *= d
    return best


def plan_blocks(kernel: Kernel, buffers: dict, config: BlockConfig | None = None,
                hints: SizeHints | None = None) -> KernelBlocks:
    """The blocks of `kernel`: the heuristics, with what `config` overrides. `hints` size the
    blocks of dynamic dims for the sizes the model was exported at (masks keep every other
    size correct) and decide 32- or 64-bit indexing from the declared maxima."""
    config = config or BlockConfig()
    hinted = lambda e: _static(_at(e, hints.example)) if hints else None   # noqa: E731
    if _is_outer(kernel):
        return _plan_outer(kernel, buffers, config)
    reduction = any(isinstance(n.body, Reduction) for n in kernel.nodes)
    inner = [product(_inner(kernel, n)) for n in kernel.nodes]
    chunk = config.rblock or MAX_POINTWISE   # a split node's block, at most
    split = not reduction and _independent(kernel) and all(
        _static(n) is not None and -(-_static(n) // chunk) <= MAX_GRID_Y for n in inner)
    if split and config == BlockConfig() and _transposing(kernel):
        config = BlockConfig(xblock=TRANSPOSE_XBLOCK, rblock=TRANSPOSE_RBLOCK)
    rows = product(kernel.prefix)
    r = _static(rows)
    few = r is not None and r <= FEW_ROWS and not split and config.rblock is None
    nodes = [_node_block(j, numel, isinstance(n.body, Reduction), split, bool(_inner(kernel, n)),
                         config.rblock, hinted(numel), few)
             for j, (n, numel) in enumerate(zip(kernel.nodes, inner))]
    if config.xblock is not None:
        xblock = config.xblock if r is None else min(config.xblock, pow2(r))
    else:
        xblock = max(1, TARGET_ELEMENTS["reduction" if reduction else "pointwise"]
                     // _widest(nodes))
        rh = r if r is not None else hinted(rows)
        if rh is not None:
            xblock = min(xblock, pow2(rh))
            while xblock > 1 and -(-rh // xblock) < MIN_PROGRAMS and rh >= MIN_PROGRAMS:
                xblock //= 2
    if split:
        nodes = _split_masks(nodes)
    return KernelBlocks(rows=rows, xblock=xblock, xmask=not (r is not None and r % xblock == 0),
                        wide=_is_wide(kernel, buffers, hints.maximum if hints else None),
                        split=split,
                        num_warps=config.num_warps or _warps(xblock, nodes, few),
                        nodes=nodes)


def _transposing(kernel: Kernel) -> bool:
    """Whether a pointwise kernel's loads walk memory along its rows rather than along the
    inner elements it stores contiguously (`order_votes`): a transposed copy, such as a
    product computed transposed (codegen/lowering/matvec.py) read back in the layout eager
    gives, or NCHW data stored channels-last. Planned as rows x elements it would read each
    sector once per element of a block (XBLOCK 1 of 1024 elements: 16 rows of bf16 share a
    32-byte sector, read by 16 programs); as TRANSPOSE_XBLOCK x TRANSPOSE_RBLOCK tiles both
    its loads and its stores cover whole sectors (Triton converts the layout in between)."""
    k = len(kernel.prefix)
    votes = 0
    for node in kernel.nodes:
        loads, pvars, inner = node_loads(node, k)
        votes += order_votes(loads, dict(zip(pvars, kernel.prefix)), inner)
    return votes > 0


def _warps(xblock: int, nodes: list, few: bool) -> int:
    """The heuristic's warps: by a program's elements; a few-row kernel at least FEW_ROWS_WARPS,
    FEW_ROWS_LOOP_WARPS where a node loops."""
    if few and any(b.mode == "loop" for b in nodes):
        return max(heuristic_warps(xblock * _widest(nodes)), FEW_ROWS_LOOP_WARPS)
    return max(heuristic_warps(xblock * _widest(nodes)), FEW_ROWS_WARPS * few)


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
                   NodeBlock(b.rb, b.size, b.numel, b.mode, f"rmask{j}", b.tiled))
    return out
