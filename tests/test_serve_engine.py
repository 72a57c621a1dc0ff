"""aotc.serve.engine: continuous batching over a generator's slots. A request's tokens must not
depend on what runs beside it; requests join and leave between steps."""
import random

import pytest
import torch

import aotc
from aotc.serve.engine import Engine, QueueFull, SamplingParams


def drain(engine: Engine) -> list:
    events = []
    while engine.has_work():
        events += engine.step()
    return events


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, **kw)


@pytest.fixture(scope="module")
def module(slot_llm):
    return aotc.load(slot_llm)


def test_batched_greedy_tokens_equal_each_request_alone(module):
    rng = random.Random(0)
    asks = [([rng.randrange(96) for _ in range(rng.randint(1, 13))], rng.randint(1, 20))
            for _ in range(9)]
    engine = Engine(module, prefill_chunk=4)        # 9 requests over 4 slots, chunked prompts
    together = [engine.add(p, greedy(n)) for p, n in asks]
    events = drain(engine)
    for r, (p, n) in zip(together, asks):
        alone = Engine(module)
        one = alone.add(p, greedy(n))
        drain(alone)
        want = module.generate(torch.tensor([p]), n)[0, len(p):].tolist()
        assert r.tokens == one.tokens == want
        assert r.finish_reason == "length"
        assert [e.token for e in events if e.request is r] == r.tokens


def test_stop_tokens_end_a_request(module):
    engine = Engine(module)
    probe = engine.add([7, 8, 9], greedy(10))
    drain(engine)
    stop = probe.tokens[3]
    first = probe.tokens.index(stop)
    r = engine.add([7, 8, 9], greedy(10, stop_token_ids=(stop,)))
    events = drain(engine)
    assert r.finish_reason == "stop" and r.tokens == probe.tokens[:first]
    assert events[-1].request is r and events[-1].finish_reason == "stop"


def test_cancel_frees_the_slot_for_a_waiting_request(module):
    engine = Engine(module)
    running = [engine.add([1, 2, 3], greedy(30)) for _ in range(4)]
    waiting = engine.add([4, 5], greedy(3))
    engine.step()
    assert engine.active == 4 and engine.queued == 1 and waiting.slot is None
    engine.cancel(running[1].id)
    events = engine.step()
    assert running[1].finish_reason == "cancelled"
    assert waiting.slot == running[1].slot and len(waiting.tokens) == 1
    assert any(e.request is running[1] and e.finish_reason == "cancelled" for e in events)
    for r in running:
        engine.cancel(r.id)
    drain(engine)
    assert waiting.finish_reason == "length" and len(waiting.tokens) == 3


def test_seeded_sampling_does_not_depend_on_the_batch(module):
    params = SamplingParams(max_tokens=12, temperature=1.3, top_p=0.9, seed=5)
    engine = Engine(module)
    alone = engine.add([3, 1, 4], params)
    drain(engine)
    others = [engine.add([9, 9, i], SamplingParams(max_tokens=8, temperature=0.7))
              for i in range(3)]
    again = engine.add([3, 1, 4], params)
    drain(engine)
    assert again.tokens == alone.tokens and all(o.finished for o in others)


def test_requests_are_checked(module):
    engine = Engine(module, max_waiting=2)
    with pytest.raises(aotc.UsageError, match="exceed the cache"):
        engine.add(list(range(40)), greedy(9))
    for bad in ([], [96], ["a"], "text"):
        with pytest.raises(aotc.UsageError, match="prompt"):
            engine.add(bad, greedy(2))
    for kw in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -2},
               {"seed": -1}, {"stop_token_ids": ("x",)}):
        with pytest.raises(aotc.UsageError):
            SamplingParams(**kw)
    engine.add([1], greedy(1))
    engine.add([1], greedy(1))
    with pytest.raises(QueueFull):
        engine.add([1], greedy(1))
    assert [len(r.tokens) for r in (e.request for e in drain(engine))] == [1, 1]
    with pytest.raises(aotc.UsageError, match="slots"):
        Engine(object())


def test_choices_share_one_prefill(module, monkeypatch):
    """n choices over one prompt: the prompt is prefilled once, the other choices copy its slot
    (module.copy_slot), and each draws as the same request alone does (greedy and seeded)."""
    prompt = [5, 9, 2, 11, 40, 3, 7]
    params = [greedy(12), SamplingParams(max_tokens=12, temperature=0.9, seed=3),
              SamplingParams(max_tokens=12, temperature=0.9, seed=4)]
    calls = []
    prefill = module.prefill_slot
    monkeypatch.setattr(module, "prefill_slot", lambda *a: calls.append(a[1:]) or prefill(*a))
    engine = Engine(module, prefill_chunk=4)
    choices = engine.add_choices(prompt, params)
    drain(engine)
    assert [c for _, c in calls] == [0, 4]       # one prompt of 7 tokens: chunks at 0 and 4
    monkeypatch.undo()
    for r, p in zip(choices, params):
        alone = Engine(module, prefill_chunk=4)
        one = alone.add(prompt, p)
        drain(alone)
        assert r.tokens == one.tokens and len(r.tokens) == 12
    assert choices[1].tokens != choices[2].tokens


def test_a_choice_without_a_slot_prefills_the_prompt_itself(module):
    engine = Engine(module, max_active=2)        # 3 choices, 2 slots: the third waits
    choices = engine.add_choices([1, 2, 3], [greedy(4)] * 3)
    drain(engine)
    assert [r.tokens for r in choices] == [choices[0].tokens] * 3
    assert all(r.finish_reason == "length" for r in choices)


def test_copy_slot(slot_llm):
    m = aotc.load(slot_llm)
    m.prefill_slot(torch.tensor([[4, 5, 6]]), 0)
    m.copy_slot(0, 3)
    assert m.slot_position(3) == 3 and m.state["pos"][3].item() == 3
    assert all(torch.equal(t[3], t[0]) for t in m.state.values())
    with pytest.raises(aotc.errors.UsageError):
        m.copy_slot(0, 4)
