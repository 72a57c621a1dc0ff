"""Generators with cache slots (`--max-batch N`): each slot at its own position, a prompt
written into one slot while the others keep theirs, padded batches generated row by row
(exporter/generate.py, runtime/slots.py)."""
from pathlib import Path

import pytest
import torch

import aotc
from conftest import llama_sample

FIXTURES = Path(__file__).parent / "fixtures"


def eager_greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    """Greedy tokens of the plain model (no cache: the whole sequence each step)."""
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[0, prompt.shape[1]:].tolist()


def padded(prompts: list[list[int]], pad: int = 0):
    """Left-padded ids and their attention mask, as transformers' tokenizers give them."""
    t = max(map(len, prompts))
    ids = torch.tensor([[pad] * (t - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def test_manifest_and_state(slot_llm):
    m = aotc.load(slot_llm)
    assert m.slots == 4 and m.generation.slots == 4 and m.generation.batch == 4
    assert m.state["pos"].shape == (4,)
    assert [i.name for i in m.entries["prefill"].spec.inputs] == ["input_ids", "slot", "start"]
    assert m.generation.buckets == ((2, "decode_2"),)


def test_a_decode_bucket_steps_the_first_slots_alone(slot_llm):
    m = aotc.load(slot_llm)
    for s, p in enumerate(([4, 5, 6], [7, 8], [9], [1, 2, 3, 4])):
        m.prefill_slot(torch.tensor([p]), s)
    feed = torch.tensor([[11], [12], [13], [14]])
    kept = {n: t[2:].clone() for n, t in m.state.items()}
    small = m.decode_slots(feed, live=[0, 1])                  # the bucket of 2 slots
    assert small[0].shape == (2, 96) and m.state["pos"].tolist() == [4, 3, 1, 4]
    assert all(torch.equal(t[2:], kept[n]) for n, t in m.state.items())
    full = aotc.load(slot_llm)
    for s, p in enumerate(([4, 5, 6], [7, 8], [9], [1, 2, 3, 4])):
        full.prefill_slot(torch.tensor([p]), s)
    whole = full.decode_slots(feed)                            # every slot
    assert whole[0].shape == (4, 96) and full.state["pos"].tolist() == [4, 3, 2, 5]
    torch.testing.assert_close(small[0], whole[0][:2], rtol=1e-5, atol=1e-5)
    assert torch.equal(small[1], whole[1][:2])


def test_padded_batch_equals_each_prompt_alone_and_eager(slot_llm):
    m = aotc.load(slot_llm)
    model = llama_sample(vocab=96, dim=32, hidden=64)
    prompts = [[5, 17, 3, 9, 44, 2, 71], [8, 1], [60, 61, 62, 63, 7]]
    ids, mask = padded(prompts, pad=11)
    out = m.generate(ids, 12, attention_mask=mask)
    assert out.shape == (3, 7 + 12) and torch.equal(out[:, :7], ids)
    for row, p in enumerate(prompts):
        alone = m.generate(torch.tensor([p]), 12)[0, len(p):].tolist()
        assert out[row, 7:].tolist() == alone == eager_greedy(model, torch.tensor([p]), 12)


def test_sampled_padded_batch(slot_llm):
    m = aotc.load(slot_llm)
    ids, mask = padded([[5, 17, 3, 9], [8, 1]])
    greedy = m.generate(ids, 8, attention_mask=mask)
    top1 = m.generate(ids, 8, attention_mask=mask, do_sample=True, top_k=1)
    assert torch.equal(top1, greedy)
    draw = lambda: m.generate(ids, 8, attention_mask=mask, do_sample=True,   # noqa: E731
                              temperature=1.5, generator=torch.Generator().manual_seed(3))
    a, b = draw(), draw()
    assert torch.equal(a, b) and int(a.max()) < 96 and not torch.equal(a, greedy)


def test_prefill_into_a_slot_keeps_the_others(slot_llm):
    m = aotc.load(slot_llm)
    p0, p1 = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[9, 8, 7, 6, 5, 4]])
    m.prefill_slot(p0, 0)
    before = {n: t.clone() for n, t in m.state.items()}
    m.prefill_slot(p1, 2)
    for name, t in m.state.items():
        if name != "pos":
            assert torch.equal(t[[0, 1, 3]], before[name][[0, 1, 3]]), name
    assert m.state["pos"].tolist() == [4, 0, 6, 0]
    assert [m.slot_position(s) for s in range(4)] == [4, 0, 6, 0]


def test_chunked_prefill_equals_one_prefill(slot_llm):
    m = aotc.load(slot_llm)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
    whole = m.prefill_slot(prompt, 1)[0]
    m.prefill_slot(prompt[:, :4], 3)
    m.prefill_slot(prompt[:, 4:7], 3, 4)
    last = m.prefill_slot(prompt[:, 7:], 3, 7)[0]
    torch.testing.assert_close(last, whole, rtol=1e-5, atol=1e-5)
    feed = torch.tensor([[1], [7], [0], [7]])
    logits = m.decode_slots(feed, live=[1, 3])[0]
    torch.testing.assert_close(logits[3], logits[1], rtol=1e-5, atol=1e-5)


def test_slot_guards(slot_llm):
    m = aotc.load(slot_llm)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(aotc.UsageError, match="not a slot"):
        m.prefill_slot(ids, 4)
    with pytest.raises(aotc.UsageError, match="not a slot"):    # a bool is no slot's index
        m.prefill_slot(ids, True)
    with pytest.raises(aotc.GuardError, match="does not fit"):
        m.prefill_slot(torch.zeros(1, 47, dtype=torch.int64), 0, 2)
    with pytest.raises(aotc.GuardError, match="cannot take a token"):
        m.decode_slots(torch.zeros(4, 1, dtype=torch.int64), live=[0])
    with pytest.raises(aotc.UsageError, match="lockstep"):
        m.prefill(ids)
    with pytest.raises(aotc.UsageError, match="left-padded"):
        m.generate(torch.ones(2, 3, dtype=torch.int64), 2,
                   attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(aotc.UsageError, match="exceeds"):
        m.generate(torch.ones(5, 3, dtype=torch.int64), 2)
    m.prefill_slot(torch.zeros(1, 47, dtype=torch.int64), 0)
    m.decode_slots(torch.zeros(4, 1, dtype=torch.int64), live=[0])      # position 47: the last
    with pytest.raises(aotc.GuardError, match="cannot take a token"):
        m.decode_slots(torch.zeros(4, 1, dtype=torch.int64), live=[0])


def test_padding_refused_without_slots():
    m = aotc.load(FIXTURES / "format_v18_generator.aotc")
    with pytest.raises(aotc.UsageError, match="slots"):
        m.generate(torch.ones(1, 3, dtype=torch.int64), 2,
                   attention_mask=torch.tensor([[0, 1, 1]]))
    with pytest.raises(aotc.UsageError, match="needs a generator with slots"):
        m.prefill_slot(torch.ones(1, 3, dtype=torch.int64), 0)


def test_max_batch_needs_decode():
    from aotc.options import ExportOptions
    with pytest.raises(aotc.UsageError, match="--max-batch gives a generator"):
        aotc.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),), "unused.aotc", max_batch=4)
    with pytest.raises(aotc.UsageError, match="--max-batch"):
        ExportOptions(max_batch=4, train=True)
    with pytest.raises(aotc.UsageError, match="--max-batch"):
        ExportOptions(decode=True, max_batch=5000)
    with pytest.raises(aotc.UsageError, match="--slot-buckets"):
        ExportOptions(decode=True, max_batch=4, slot_buckets="2,4")
    assert ExportOptions(decode=True, max_batch=8, target="cuda").bucket_rows() == (1, 2, 4)
    assert ExportOptions(decode=True, max_batch=8).bucket_rows() == ()


def test_transformers_padded_batch_equals_hf_generate(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   pad_token_id=0, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 80, (1, 5))
    path = aotc.export(model, (ids,), tmp_path / "hf.aotc", decode=True, max_cache_len=32,
                       max_batch=3, codegen=False)
    m = aotc.load(path)
    prompts = [[3, 14, 15, 9, 26, 5], [35, 8], [9, 7, 9, 3]]
    batch, mask = padded(prompts)
    want = model.generate(batch, attention_mask=mask, max_new_tokens=12, do_sample=False,
                          pad_token_id=0)
    got = m.generate(batch, 12, attention_mask=mask)
    assert got.tolist() == want.tolist()
    sampled = m.generate(batch, 12, attention_mask=mask, do_sample=True, top_k=1)
    assert torch.equal(sampled, got)
