"""A generator manifest's `generation` object (artifact/schema): which entries prefill and
decode, the position state, the cache, and with slots (format 22) the slots and decode buckets.
Parsed after the entries and state, against them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from aotc.artifact.schema.fields import At


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """How a generator's entries are driven: prefill a prompt of up to max_cache_len - 1
    tokens, then decode one token a step; `position` names the state holding the next
    position; batch is fixed at export. `token` (format 18) is the index of both entries'
    flat output holding the logits' argmax [batch, 1] int64, the greedy token (None: the
    runtime takes the argmax itself). `slots` (format 22): the cache holds that many
    sequences, each at its own position (position is int64 [slots]); prefill takes
    (input_ids [1, T], slot [1], start [1]) and decode input_ids [slots, 1] (continuous
    batching, exporter/generate.py); batch equals it. None: one batch in lockstep. `buckets`
    (format 22, with slots): ((K, entry), ...), decode entries stepping slots 0..K-1 only."""
    prefill: str
    decode: str
    position: str
    max_cache_len: int
    batch: int
    vocab: int
    token: int | None = None
    slots: int | None = None
    buckets: tuple = ()

    def to_json(self) -> dict:
        out = {"batch": self.batch, "decode": self.decode, "max_cache_len": self.max_cache_len,
               "position": self.position, "prefill": self.prefill, "vocab": self.vocab}
        if self.token is not None:
            out["token"] = self.token
        if self.slots is not None:
            out["slots"] = self.slots
        if self.buckets:
            out["buckets"] = [{"rows": k, "entry": e} for k, e in self.buckets]
        return out


def parse_generation(a: At, m) -> Generation:
    """The manifest's generation, checked against its entries and state (`m`: the Manifest)."""
    optional = ("token",) * (m.format_version >= 18) + \
        ("slots", "buckets") * (m.format_version >= 22)
    a.obj(required=("prefill", "decode", "position", "max_cache_len", "batch", "vocab"),
          optional=optional)
    g = Generation(prefill=a.get("prefill").str(choices=set(m.entries)),
                   decode=a.get("decode").str(choices=set(m.entries)),
                   position=a.get("position").str(choices={s.name for s in m.state}),
                   max_cache_len=a.int_of("max_cache_len", 2, 1 << 24),
                   batch=a.int_of("batch", 1, 1 << 16), vocab=a.int_of("vocab", 1, 1 << 26),
                   token=a.get("token").int(0, 1 << 16) if a.has("token") else None,
                   slots=a.get("slots").int(1, 1 << 16) if a.has("slots") else None)
    if g.slots is not None:
        a.get("slots").check(g.slots == g.batch, f"the batch ({g.batch})", "differs from it")
    if a.has("buckets"):
        g = dataclasses.replace(g, buckets=_buckets(a.get("buckets"), m, g))
    pos = next(s for s in m.state if s.name == g.position)
    a.get("position").check(pos.dtype == "int64" and pos.shape == (g.slots or 1,),
                            f"an int64 state of shape [{g.slots or 1}]",
                            "names another kind of state")
    if g.token is not None:
        for name in dict.fromkeys((g.prefill, g.decode)):
            outs = m.entries[name].outputs
            meta = outs[g.token] if g.token < len(outs) else None
            rows = 1 if g.slots and name == g.prefill else g.batch
            a.get("token").check(meta is not None and meta.dtype == "int64"
                                 and meta.shape == (rows, 1),
                                 f"the index of an int64 [{rows}, 1] output of {name!r}",
                                 f"names {meta.dtype}{list(meta.shape)}" if meta is not None
                                 else f"names none of its {len(outs)} outputs")
    return g


def _buckets(a: At, m, g: Generation) -> tuple:
    """generation.buckets: decode entries over the first K < slots slots, K increasing."""
    a.check(g.slots is not None, "buckets only with slots", "buckets without slots")
    out = []
    for b in a.list(64):
        b.obj(required=("rows", "entry"))
        rows = b.get("rows").int(1, (g.slots or 2) - 1)
        entry = b.get("entry").str(choices=set(m.entries))
        spec = m.entries[entry].inputs
        b.check(len(spec) == 1 and tuple(spec[0].shape) == (rows, 1),
                f"an entry taking input_ids [{rows}, 1]", "names another entry")
        b.check(not out or rows > out[-1][0], "rows increasing", "out of order")
        out.append((rows, entry))
    return tuple(out)
