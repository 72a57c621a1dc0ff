"""Several streams over one loaded generator (`m.session()`, runtime/generate.py): each session
has its own caches, position and lock over the same weights and kernels, so streams
interleaved step by step, or run from threads at once, generate what each generates alone; a
weight swap through any session reaches all of them, after their calls in flight."""
from __future__ import annotations

import threading

import pytest
import torch

import aotc
from conftest import llama_sample

CACHE = 64


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    return aotc.export(llama_sample(), (ids,), tmp_path_factory.mktemp("s") / "l.aotc",
                       decode=True, max_cache_len=CACHE)


def _prompt(seed, t=9):
    return torch.randint(0, 500, (2, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_interleaved_sessions_generate_what_each_does_alone(path, runner):
    m = aotc.load(path, runner=runner)
    s = m.session()
    assert all(s.weights[k] is m.weights[k] for k in m.weights)          # one copy
    assert all(s.state[k].data_ptr() != m.state[k].data_ptr() for k in m.state)
    a, b = _prompt(1), _prompt(2, t=5)
    want_a, want_b = m.generate(a, 12), s.generate(b, 12)
    m.reset(), s.reset()
    ta, tb = [m.prefill(a).argmax(-1, keepdim=True)], [s.prefill(b).argmax(-1, keepdim=True)]
    for _ in range(11):                                                   # one step each, in turn
        ta.append(m.decode(ta[-1]).argmax(-1, keepdim=True))
        tb.append(s.decode(tb[-1]).argmax(-1, keepdim=True))
    assert torch.equal(torch.cat([a, *ta], 1), want_a)
    assert torch.equal(torch.cat([b, *tb], 1), want_b)
    assert m.position == 9 + 11 and s.position == 5 + 11


def test_sessions_in_threads(path):
    m = aotc.load(path)
    prompts = [_prompt(seed) for seed in range(4)]
    want = [m.generate(p, 16) for p in prompts]
    sessions = [m] + [m.session() for _ in range(3)]
    got = [None] * 4

    def run(i):
        for _ in range(3):
            got[i] = sessions[i].generate(prompts[i], 16)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_weight_swap_reaches_every_session(path):
    m = aotc.load(path)
    s = m.session()
    other = llama_sample()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.2)
    ids = _prompt(3)
    before = s.generate(ids, 12)
    s.load_state_dict(other.state_dict())          # through the session: the base sees it too
    fresh = aotc.load(path)
    fresh.load_state_dict(other.state_dict())
    want = fresh.generate(ids, 12)
    assert not torch.equal(want, before)
    assert torch.equal(m.generate(ids, 12), want) and torch.equal(s.generate(ids, 12), want)


def test_stream_yields_the_steps_of_generate(path):
    """`m.stream` yields each step's tokens as they are made: together, what `generate`
    returns; its arguments are checked when it is called, before any step; with an EOS it
    ends within 16 steps of every sequence having produced it."""
    from aotc.errors import GuardError, UsageError
    m = aotc.load(path)
    ids = _prompt(5)
    want = m.generate(ids, 20)
    steps = list(m.stream(ids, 20))
    assert len(steps) == 20 and all(s.shape == (2, 1) for s in steps)
    assert torch.equal(torch.cat([ids, *steps], 1), want)
    with pytest.raises(GuardError, match="do not fit the cache"):
        m.stream(ids, CACHE)
    with pytest.raises(UsageError, match="apply only to sampling"):
        m.stream(ids, 4, top_k=3)
    for bad in (ids[0], ids[None]):                # a prompt of another rank: the guards'
        with pytest.raises(GuardError, match=f"has rank {bad.dim()}, expected 2"):
            m.generate(bad, 4)
    eos = int(want[0, 9 + 2])                      # the first sequence's third new token
    got = torch.cat([ids, *m.stream(ids, 20, eos_token_id=eos)], 1)
    assert torch.equal(got[0, :12], want[0, :12]) and (got[0, 12:] == eos).all()
    if not (want[1, 9:] == eos).any():            # the other sequence runs on, as without
        assert torch.equal(got[1], want[1])
