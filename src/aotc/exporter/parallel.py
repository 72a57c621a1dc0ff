"""Tensor parallelism at export (`--tensor-parallel N`): the model split Megatron-style into N
rank models before capture, one captured per artifact.

Rules, by module (`RULES`; the first whose projections a module has claims it):
  * attention (aotc's convention, samples/llama.py: wq/wk/wv/wo with `heads`, `kv_heads`; or
    transformers': q_proj/k_proj/v_proj/o_proj): q, k and v column-parallel, split by heads
    (heads/N query heads and kv_heads/N KV heads per rank, so each rank's KV cache holds its
    heads); the output projection row-parallel, its partial sums added by `aotc::all_reduce`;
  * GPT-2's attention (transformers' `Conv1D`s c_attn/c_proj, y = x @ W + b): the fused
    c_attn column-parallel, its columns regrouped so that each rank holds its heads' slices of
    q, k and v ([q_r | k_r | v_r], the bias likewise), the module's head count and split size
    divided by N; c_proj row-parallel (partial sums all-reduced, the bias added once);
  * SwiGLU MLPs (w1/w3/w2, or gate_proj/up_proj/down_proj): gate and up column-parallel by the
    intermediate size, down row-parallel with an all-reduce; GPT-2's MLP (c_fc/c_proj, an
    elementwise activation between them) the same way;
  * the LM head (a projection onto the vocabulary): split by vocabulary, its logits gathered
    (`aotc::all_gather`); a vocabulary the ranks do not divide (GPT-2's 50257) is padded to
    the next multiple of N with zero rows on the last rank, and the gathered logits cut back;
  * the embedding of that vocabulary: split by vocabulary too, each rank looking up the ids it
    holds (zeros for the others), summed by an all-reduce; a tied head and embedding share
    their slice;
  * norms, position embeddings and the rest: replicated.
Any other projection is an ExportError naming it. Every rank model has the same shapes, so one
captured graph (rank 0's) serves all ranks; the others contribute only their weights, under
the same names (so whatever differs between ranks is tensor data, never a Python constant the
graph would bake in: the embedding's first id is a buffer). The samples an artifact records are
the unsharded model's, which every rank must reproduce.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import aotc.nn  # noqa: F401 - registers aotc::all_reduce
from aotc.errors import ExportError

_EXPECTED = ("attention with wq/wk/wv/wo, q_proj/k_proj/v_proj/o_proj or GPT-2's c_attn/c_proj, "
             "an MLP with w1/w3/w2, gate_proj/up_proj/down_proj or GPT-2's c_fc/c_proj, or an "
             "LM head onto the vocabulary")


class RowParallelLinear(nn.Module):
    """A linear layer over this rank's slice of the input features: the partial products of
    all ranks summed (`aotc::all_reduce`), then the bias, once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x):
        y = torch.ops.aotc.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class RowParallelConv1D(RowParallelLinear):
    """transformers' `Conv1D` (y = x @ W + b, W [in, out]: the weight kept as the model holds
    it) over this rank's slice of the input features, rows of W."""

    def forward(self, x):
        y = torch.ops.aotc.all_reduce(torch.matmul(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelHead(nn.Module):
    """An LM head over this rank's slice of the vocabulary: every rank's logits gathered
    (`aotc::all_gather`) along the last dim, rank 0's first, and cut back to the `vocab` of the
    model where the last rank's slice is padded."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, world: int, vocab: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.world, self.vocab = world, vocab

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        y = torch.ops.aotc.all_gather(y, y.dim() - 1, self.world)
        return y if y.shape[-1] == self.vocab else y[..., :self.vocab]


class VocabParallelEmbedding(nn.Module):
    """An embedding of this rank's slice of the vocabulary (ids `start`..): the rows of the ids
    it holds, zeros for the others, summed over the ranks (`aotc::all_reduce`)."""

    def __init__(self, weight: torch.Tensor, start: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        # a tensor, not a Python number: the graph captured on rank 0 serves every rank, so
        # what differs between ranks must be data of the rank's weights
        self.register_buffer("start", torch.tensor(start, dtype=torch.int64), persistent=False)

    def forward(self, ids):
        local = ids - self.start
        held = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(torch.where(held, local, torch.zeros_like(local)), self.weight)
        return torch.ops.aotc.all_reduce(rows * held.unsqueeze(-1).to(rows.dtype))


def _split(n: int, world: int, unit: int, what: str, where: str) -> tuple[int, int]:
    if n % (world * unit):
        raise ExportError(f"{where}: {what} ({n // unit}) does not divide by the {world} ranks",
                          where=where, expected=f"{what} a multiple of {world}",
                          found=n // unit, fix="export with a --tensor-parallel that divides "
                                               f"{n // unit}")
    return n // world


def _linear(m, where: str) -> nn.Linear:
    if type(m) is not nn.Linear:
        raise ExportError(f"{where} is a {type(m).__name__}, not an nn.Linear", where=where,
                          expected="nn.Linear", found=type(m).__name__,
                          fix="export without --tensor-parallel")
    return m


def _column(parent, attr, rank, world, unit, what, where) -> dict:
    lin = _linear(getattr(parent, attr), f"{where}.{attr}")
    n = _split(lin.out_features, world, unit, what, f"{where}.{attr}")
    lo = rank * n
    new = nn.Linear(lin.in_features, n, bias=lin.bias is not None, device="meta")
    new.weight = nn.Parameter(lin.weight.detach()[lo:lo + n].clone(), requires_grad=False)
    if lin.bias is not None:
        new.bias = nn.Parameter(lin.bias.detach()[lo:lo + n].clone(), requires_grad=False)
    setattr(parent, attr, new)
    return {f"{attr}.weight": 0, **({f"{attr}.bias": 0} if lin.bias is not None else {})}


def _row(parent, attr, rank, world, unit, what, where) -> dict:
    lin = _linear(getattr(parent, attr), f"{where}.{attr}")
    n = _split(lin.in_features, world, unit, what, f"{where}.{attr}")
    lo = rank * n
    bias = None if lin.bias is None else lin.bias.detach().clone()
    setattr(parent, attr, RowParallelLinear(lin.weight.detach()[:, lo:lo + n].clone(), bias))
    return {f"{attr}.weight": 1}


def _attention(q, k, v, o):
    def rule(m, rank, world, where, config):
        head_dim = m.head_dim
        out = {}
        for attr, what in ((q, "query heads"), (k, "KV heads"), (v, "KV heads")):
            out |= _column(m, attr, rank, world, head_dim, what, where)
        out |= _row(m, o, rank, world, head_dim, "query heads", where)
        if hasattr(m, "heads"):     # aotc's convention keeps the head counts on the module
            m.heads, m.kv_heads = m.heads // world, m.kv_heads // world
        return out
    return (q, k, v, o), rule


def _mlp(gate, up, down):
    def rule(m, rank, world, where, config):
        out = _column(m, gate, rank, world, 1, "the intermediate size", where)
        out |= _column(m, up, rank, world, 1, "the intermediate size", where)
        return out | _row(m, down, rank, world, 1, "the intermediate size", where)
    return (gate, up, down), rule


def _conv1d(m, where: str) -> nn.Module:
    w = getattr(m, "weight", None)
    if type(m).__name__ != "Conv1D" or not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ExportError(f"{where} is a {type(m).__name__}, not transformers' Conv1D",
                          where=where, expected="Conv1D (weight [in, out])",
                          found=type(m).__name__, fix="export without --tensor-parallel")
    return m


def _conv1d_column(parent, attr, rank, world, groups, unit, what, where) -> dict:
    """Conv1D `attr` column-parallel: its output features are `groups` equal parts (GPT-2's
    c_attn: q, k, v), each split over the ranks; the rank keeps its slice of every part, in
    order ([q_r | k_r | v_r]), and stays a Conv1D."""
    c = _conv1d(getattr(parent, attr), f"{where}.{attr}")
    part = c.weight.shape[1] // groups
    n = _split(part, world, unit, what, f"{where}.{attr}")
    cols = torch.cat([torch.arange(g * part + rank * n, g * part + (rank + 1) * n)
                      for g in range(groups)])
    c.weight = nn.Parameter(c.weight.detach()[:, cols].contiguous(), requires_grad=False)
    if c.bias is not None:
        c.bias = nn.Parameter(c.bias.detach()[cols].contiguous(), requires_grad=False)
    c.nf = len(cols)
    return {f"{attr}.weight": 1, **({f"{attr}.bias": 0} if c.bias is not None else {})}


def _conv1d_row(parent, attr, rank, world, unit, what, where) -> dict:
    c = _conv1d(getattr(parent, attr), f"{where}.{attr}")
    n = _split(c.weight.shape[0], world, unit, what, f"{where}.{attr}")
    lo = rank * n
    bias = None if c.bias is None else c.bias.detach().clone()
    setattr(parent, attr, RowParallelConv1D(c.weight.detach()[lo:lo + n].clone(), bias))
    return {f"{attr}.weight": 0}


# what transformers' GPT2Attention (4.4x to 5.x) reads of itself: its head count, and the width
# of q (the size c_attn's output is split by; the attention output's width before c_proj)
_GPT2_HEADS, _GPT2_WIDTHS = ("num_heads", "n_head"), ("split_size", "embed_dim")


def _gpt2_attention(m, rank, world, where, config):
    width = _conv1d(m.c_proj, f"{where}.c_proj").weight.shape[0]
    fused = _conv1d(m.c_attn, f"{where}.c_attn").weight.shape[1]
    if hasattr(m, "q_attn") or fused != 3 * width or not isinstance(m.split_size, int):
        raise ExportError(f"{where}: c_attn is not a self-attention's fused q, k and v",
                          where=f"{where}.c_attn", expected=f"{3 * width} output features "
                          "(q, k, v) and an int split_size, no q_attn",
                          found=f"{fused} output features" + (", q_attn" * hasattr(m, "q_attn")),
                          fix="export without --tensor-parallel (cross-attention is not split)")
    head_dim = getattr(m, "head_dim", None) or width // getattr(m, "num_heads")
    out = _conv1d_column(m, "c_attn", rank, world, 3, head_dim, "heads", where)
    out |= _conv1d_row(m, "c_proj", rank, world, head_dim, "heads", where)
    for name in _GPT2_HEADS + _GPT2_WIDTHS:
        if isinstance(getattr(m, name, None), int):
            setattr(m, name, getattr(m, name) // world)
    return out


def _gpt2_mlp(m, rank, world, where, config):
    out = _conv1d_column(m, "c_fc", rank, world, 1, 1, "the intermediate size", where)
    return out | _conv1d_row(m, "c_proj", rank, world, 1, "the intermediate size", where)


RULES = (_attention("wq", "wk", "wv", "wo"), _attention("q_proj", "k_proj", "v_proj", "o_proj"),
         _mlp("w1", "w3", "w2"), _mlp("gate_proj", "up_proj", "down_proj"),
         (("c_attn", "c_proj"), _gpt2_attention), (("c_fc", "c_proj"), _gpt2_mlp))


def _text_config(model):
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "num_attention_heads"):
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else None
    return cfg if cfg is not None and hasattr(cfg, "num_attention_heads") else None


def _shard_config(model, world: int) -> None:
    """transformers models: the config a rank sees (its heads; the head size kept)."""
    cfg = _text_config(model)
    if cfg is None or not hasattr(cfg, "num_hidden_layers"):
        return
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    cfg.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    for what, n in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        _split(n, world, 1, what, "config")
        setattr(cfg, what, n // world)


def shard_model(model: nn.Module, rank: int, world: int) -> tuple[nn.Module, dict]:
    """Rank `rank`'s copy of `model`, and the sharding of its weights: {name: dim of the
    model's tensor that is split} (names not listed are replicated)."""
    m = copy.deepcopy(model)
    sharding, claimed = {}, set()
    for where, mod in list(m.named_modules()):
        for attrs, rule in RULES:
            if all(isinstance(getattr(mod, a, None), nn.Module) for a in attrs):
                local = rule(mod, rank, world, where or type(m).__name__, None)
                sharding |= {f"{where}.{k}" if where else k: d for k, d in local.items()}
                claimed |= {f"{where}.{a}" if where else a for a in attrs}
                break
    _refuse_unclaimed(m, claimed)
    sharding |= _shard_heads(m, claimed, rank, world)
    if not sharding:
        raise ExportError(f"no module of {type(model).__name__} matches a tensor-parallel rule",
                          where=type(model).__name__, expected=_EXPECTED, found="none",
                          fix="export without --tensor-parallel")
    _shard_config(m, world)
    return m, sharding


def _refuse_unclaimed(m: nn.Module, claimed: set) -> None:
    """Every projection is claimed by a rule or is an LM head onto the vocabulary."""
    vocab = {e.num_embeddings for e in m.modules() if isinstance(e, nn.Embedding)}
    for name, mod in m.named_modules():
        linear = isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D"
        if not linear or name in claimed:
            continue
        if isinstance(mod, nn.Linear) and mod.out_features in vocab:
            continue    # the LM head (_shard_heads)
        raise ExportError(f"{name} ({type(mod).__name__}) matches no tensor-parallel rule",
                          where=name, expected=_EXPECTED, found=type(mod).__name__,
                          fix="export without --tensor-parallel")


def _replace(m: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(m.get_submodule(parent) if parent else m, attr, new)


def _vocab_rows(t: torch.Tensor | None, rank: int, world: int) -> torch.Tensor | None:
    """Rank `rank`'s rows of a tensor over the vocabulary (dim 0): ceil(vocab / world) of them,
    the last rank's padded with zero rows where the ranks do not divide the vocabulary (so
    every rank's tensor has the same shape, as one plan for all ranks needs)."""
    if t is None:
        return None
    n = -(-t.shape[0] // world)
    rows = t.detach()[rank * n:(rank + 1) * n]
    pad = n - rows.shape[0]
    return torch.cat([rows, rows.new_zeros((pad, *rows.shape[1:]))]) if pad else rows.clone()


def _shard_heads(m: nn.Module, claimed: set, rank: int, world: int) -> dict:
    """LM heads (projections onto the vocabulary) and the embeddings of that vocabulary, split
    by vocabulary (a tied pair stays tied); a vocabulary the ranks do not divide is padded
    (`_vocab_rows`): ids past it are never looked up, and its logits are cut after the gather."""
    heads = {name: mod for name, mod in m.named_modules() if type(mod) is nn.Linear
             and name not in claimed}
    vocab = {h.out_features for h in heads.values()}
    embeds = {name: mod for name, mod in m.named_modules()
              if type(mod) is nn.Embedding and mod.num_embeddings in vocab}
    heads = {n: h for n, h in heads.items()
             if h.out_features in {e.num_embeddings for e in embeds.values()}}
    out, split = {}, {}
    for name, e in embeds.items():
        new = VocabParallelEmbedding(_vocab_rows(e.weight, rank, world),
                                     rank * -(-e.num_embeddings // world))
        split[id(e.weight)] = new.weight
        _replace(m, name, new)
        out[f"{name}.weight"] = 0
    for name, h in heads.items():
        b = _vocab_rows(h.bias, rank, world)
        new = VocabParallelHead(_vocab_rows(h.weight, rank, world), b, world, h.out_features)
        if id(h.weight) in split:      # tied to an embedding: the same slice, one tensor
            new.weight = split[id(h.weight)]
        _replace(m, name, new)
        out |= {f"{name}.weight": 0, **({f"{name}.bias": 0} if b is not None else {})}
    return out


def rank_weights(model: nn.Module, names, rank0: dict, rank: int) -> dict:
    """Rank model `model`'s tensors under the program's weight names `names`; a name the model
    does not hold (a constant lifted by capture) is rank 0's, which every rank shares."""
    own = dict(model.named_parameters(remove_duplicate=False))
    own |= dict(model.named_buffers(remove_duplicate=False))
    out = {}
    for name in names:
        t = own.get(name, rank0[name])
        if tuple(t.shape) != tuple(rank0[name].shape) or t.dtype != rank0[name].dtype:
            raise ExportError(f"rank {rank}'s weight {name!r} differs in shape "
                              "from rank 0's", where=name, expected=list(rank0[name].shape),
                              found=list(t.shape), fix="report this as an aotc bug")
        out[name] = t.detach().contiguous()
    return out


def export_parallel(model: nn.Module, inputs: tuple, options, capture_one):
    """The Program of rank 0's model (`capture_one(rank model)` captures it), with the
    unsharded model's samples and every other rank's weights under the same names."""
    import dataclasses
    world = options.tensor_parallel
    first, sharding = shard_model(model, 0, world)
    program = capture_one(first)
    del first
    ranks = []
    for rank in range(1, world):
        m, _ = shard_model(model, rank, world)
        ranks.append(rank_weights(m, program.weights, program.weights, rank))
        del m
    samples = _samples(model, inputs, options) if program.samples is not None else None
    parallel = {"world_size": world, "sharding": {k: v for k, v in sharding.items()
                                                  if k in program.weights}, "ranks": ranks}
    return dataclasses.replace(program, samples=samples, tensor_parallel=parallel)


def _samples(model: nn.Module, inputs: tuple, options) -> tuple:
    """(inputs, flat outputs) of the unsharded model: what every rank's call returns."""
    from aotc.exporter.outputs import follow, tree_spec
    m = copy.deepcopy(model).eval()
    with torch.no_grad():
        if not options.decode:
            out = m(*inputs)
            return inputs, tuple(follow(out, p).detach() for p in tree_spec(out)[1])
        from aotc.exporter.generate import Generator, adapt, eager_generate
        ids = inputs[0]
        g = Generator(adapt(m, ids.shape[0], options.max_cache_len), options.max_cache_len)
        try:
            tokens = eager_generate(g, ids, min(16, options.max_cache_len - ids.shape[1]))
        finally:
            if hasattr(g.decoder, "release"):
                g.decoder.release()
        return (ids,), (tokens,)
