"""aotc.serve.sampler: the engine's batched choice of tokens follows transformers' warpers
(runtime/sampling.Choice) row by row, and the engine's prefill budget."""
import pytest
import torch

import aotc
from aotc.runtime.sampling import Choice
from aotc.serve.engine import Engine, SamplingParams
from aotc.serve.sampler import Draws, choose, sample


def test_each_row_draws_from_its_own_warped_distribution():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    settings = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.6)]
    temperature = torch.tensor([[t] for t, _, _ in settings])
    top_k = torch.tensor([k or 50 for _, k, _ in settings])
    top_p = torch.tensor([[p] for _, _, p in settings])
    n = 4000
    u = torch.rand(n, 1)
    counts = torch.zeros(4, 50)
    for row in range(4):
        drawn = sample(logits[row:row + 1].expand(n, -1), temperature[row:row + 1].expand(n, 1),
                       top_k[row:row + 1].expand(n), top_p[row:row + 1].expand(n, 1), u)
        counts[row] = torch.bincount(drawn.view(-1), minlength=50).float() / n
    for row, (t, k, p) in enumerate(settings):
        want = Choice(sample=True, temperature=t, top_k=k, top_p=p).scores(
            logits[row:row + 1]).softmax(-1)[0]
        assert bool((counts[row][want == 0] == 0).all())      # nothing ruled out is drawn
        assert (counts[row] - want).abs().max() < 0.035, (row, counts[row], want)


def test_greedy_rows_keep_the_plans_token_and_seeded_rows_repeat():
    logits = torch.randn(3, 20)
    greedy = logits.argmax(-1, keepdim=True)
    rows = [(SamplingParams(temperature=0), None),
            (SamplingParams(temperature=1.0, seed=3), Draws(3)),
            (SamplingParams(temperature=0), None)]
    got = choose(logits, greedy, rows)
    assert got[0] == greedy[0] and got[2] == greedy[2]
    again = choose(logits, greedy, [rows[0], (rows[1][0], Draws(3)), rows[2]])
    assert torch.equal(got, again)
    one_k = choose(logits, greedy, [(SamplingParams(temperature=2.0, top_k=1), Draws(None))] * 3)
    assert torch.equal(one_k, greedy)


def test_prefill_budget_interleaves_prompts_with_decode(slot_llm):
    m = aotc.load(slot_llm)
    engine = Engine(m, prefill_chunk=4)
    running = engine.add([1, 2, 3], SamplingParams(max_tokens=12, temperature=0))
    engine.step()
    chunks = []
    prefill = m.prefill_slot
    m.prefill_slot = lambda ids, slot, start=0: chunks.append(ids.shape[1]) or \
        prefill(ids, slot, start)
    late = [engine.add(list(range(5, 18)), SamplingParams(max_tokens=3, temperature=0)),
            engine.add(list(range(20, 26)), SamplingParams(max_tokens=3, temperature=0))]
    for step in range(5):                     # 19 prompt tokens, 4 a step: 5 steps
        events = engine.step()
        assert sum(chunks) == min(4 * (step + 1), 19)
        assert any(e.request is running for e in events)   # it decodes every step
    engine.pow2 = True                        # as where graphs replay: power-of-two chunks
    chunks.clear()
    third = engine.add(list(range(30, 45)), SamplingParams(max_tokens=2, temperature=0))
    while engine.has_work():
        engine.step()
    assert chunks == [4, 4, 4, 2, 1]
    for r in (*late, third):
        want = m.generate(torch.tensor([r.prompt]), len(r.tokens))[0, len(r.prompt):].tolist()
        assert r.tokens == want


def test_incremental_detokenization_equals_decoding_the_whole_answer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from aotc.serve.text import TextStream
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = "héllo wörld, 中文字 and 🙂 emoji; naïve café 東京 " * 3
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))

    widths = []

    class Tok:
        def decode(self, ids):
            widths.append(len(ids))
            return tok.decode(list(ids))
    ids = tok.encode(text).ids
    stream = TextStream(Tok())
    sent = ""
    for t in ids:
        stream.add(t)
        part = stream.take()
        assert "\ufffd" not in part
        sent += part
    sent += stream.finish_delta()
    assert sent == stream.finish() == tok.decode(ids) == text
    assert len(ids) > 40 and max(widths) <= 8      # windows, not the whole answer each token


def test_deferred_checks_fold_replay_flags_until_the_step_reads_them(slot_llm):
    """GenerativeModule.deferred_checks (the engine's thread holds it): graph replays fold
    their index flags, read by check() once a step; a flagged index still raises there."""
    from types import SimpleNamespace
    m = aotc.load(slot_llm)
    seen = []

    def check_flag(flag, inputs=None):
        seen.append(int(flag.item()))
        raise aotc.GuardError("index out of range", where="kernel", expected="in range",
                              found=int(flag.item()), fix="-")
    graphed = SimpleNamespace(folding=None, entry=SimpleNamespace(
        function=SimpleNamespace(check_flag=check_flag)))
    m.graphs = {m.generation.decode: graphed}
    with m.deferred_checks() as check:
        flag = graphed.folding
        flag.fold(torch.tensor([0], dtype=torch.int32))
        flag.replayed(graphed.entry.function, ())
        check()                                   # nothing flagged: no error
        flag.fold(torch.tensor([2], dtype=torch.int32))
        flag.replayed(graphed.entry.function, ())
        with pytest.raises(aotc.GuardError):
            check()
    assert seen == [2] and graphed.folding is None
