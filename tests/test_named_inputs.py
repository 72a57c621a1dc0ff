"""Named inputs (issue 46, item 3): an artifact binds keyword arguments to the model's own
forward parameter names, recorded at export (manifest `parameters`, format 20), as Python
binds them; older artifacts take positional arguments and refuse keywords clearly."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import aotc
from aotc.errors import ArtifactError, GuardError, UsageError
from conftest import read_raw_manifest, write_manifest

FIXTURES = Path(__file__).parent / "fixtures"


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, mask, bias=None, scale=2.0, mode="sum", table=torch.ones(1), last=None):
        y = self.lin(x) * mask
        return {"y": y * scale, "total": y.sum(-1)}


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    torch.manual_seed(0)
    model = Scaled().eval()
    x, mask = torch.randn(3, 4), (torch.rand(3, 4) > 0.3).float()
    path = aotc.export(model, (x, mask), tmp_path_factory.mktemp("named") / "scaled.aotc")
    return model, (x, mask), path


def test_manifest_records_forward_names_and_scalar_defaults(scaled):
    _, _, path = scaled
    params = read_raw_manifest(path)["entries"]["forward"]["parameters"]
    # the recorded prefix stops at `table` (a tensor default): `last` is not recorded
    assert params == [{"name": "x"}, {"name": "mask"}, {"default": None, "name": "bias"},
                      {"default": 2.0, "name": "scale"}, {"default": "sum", "name": "mode"}]


@pytest.mark.parametrize("call", [
    lambda m, x, k: m(x, k),
    lambda m, x, k: m(x=x, mask=k),
    lambda m, x, k: m(mask=k, x=x),
    lambda m, x, k: m(x, mask=k),
    lambda m, x, k: m(x, k, None, 2.0, "sum"),
    lambda m, x, k: m(x, k, bias=None, scale=2, mode="sum"),
    lambda m, x, k: m.run("forward", mask=k, x=x),
], ids=["positional", "named", "any order", "mixed", "defaults by position",
        "defaults by name", "run"])
def test_named_calls_match_eager(scaled, call):
    model, (x, mask), path = scaled
    m = aotc.load(path)
    got, want = call(m, x, mask), model(x, mask)
    torch.testing.assert_close(got["y"], want["y"])
    torch.testing.assert_close(got["total"], want["total"])


@pytest.mark.parametrize("call, words", [
    (lambda m, x, k: m(x=x), ["missing", "'mask'", "(x, mask, bias=None, scale=2.0, "
                                                   "mode='sum')"]),
    (lambda m, x, k: m(x, k, nope=1), ["unexpected keyword argument 'nope'", "x, mask"]),
    (lambda m, x, k: m(x, k, last=None), ["unexpected keyword argument 'last'"]),
    (lambda m, x, k: m(x, k, scale=3.0), ["scale", "default scale=2.0", "re-export"]),
    (lambda m, x, k: m(x, k, bias=x), ["bias", "not an input of the export"]),
    (lambda m, x, k: m(x, k, scale=True), ["scale"]),
    (lambda m, x, k: m(x, x=x, mask=k), ["multiple values for argument 'x'"]),
    (lambda m, x, k: m(x, k, None, 2.0, "sum", 1, mask=k), ["at most 5 positional"]),
])
def test_bad_names_are_usage_errors_naming_them(scaled, call, words):
    _, (x, mask), path = scaled
    with pytest.raises(UsageError) as info:
        call(aotc.load(path), x, mask)
    text = str(info.value)
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("count", [1, 6])
def test_wrong_positional_count_is_the_guards_error(scaled, count):
    """By position alone, too few or too many tensors are a GuardError, as before names."""
    _, (x, _), path = scaled
    with pytest.raises(GuardError, match=f"expected 2, got {count}"):
        aotc.load(path)(*[x] * count)


def test_signature_shows_names_and_defaults(scaled):
    m = aotc.load(scaled[2])
    assert m.signature().startswith("forward(x: float32[3, 4], mask: float32[3, 4], bias=None, "
                                    "scale=2.0, mode='sum') -> ")


def test_inspect_shows_the_names(scaled):
    from aotc.cli.report import inspect_text
    assert "forward(x: float32[3, 4], mask: float32[3, 4], bias=None, scale=2.0, mode='sum')" \
        in inspect_text(scaled[2])


def test_older_format_takes_positionals_and_refuses_keywords():
    m = aotc.load(FIXTURES / "format_v13_tiny.aotc")
    inputs = m.random_inputs()
    m(*inputs)                                                 # positionals, as before
    assert m.signature().startswith(f"forward({m.inputs[0].name}: ")
    assert ", /)" in m.signature()                             # positional-only, shown
    with pytest.raises(UsageError, match="records no parameter names") as info:
        m(**{m.inputs[0].name: inputs[0]})
    assert "by position" in info.value.fix or "by position" in str(info.value)


def _edited(path: Path, tmp_path: Path, edit) -> Path:
    import shutil
    dest = tmp_path / "edited.aotc"
    shutil.copytree(path, dest)
    doc = read_raw_manifest(dest)
    edit(doc)
    write_manifest(dest, doc)
    return dest


@pytest.mark.parametrize("edit, words", [
    (lambda p: p.append({"name": "scale", "default": 1}), "repeats 'scale'"),
    (lambda p: p.append({"name": "not a name", "default": 1}), "parameter name"),
    (lambda p: p.append({"name": "class", "default": 1}), "parameter name"),
    (lambda p: p.append({"name": "big", "default": [1, 2]}), "null, a boolean"),
    (lambda p: p.append({"name": "nodefault"}), "a default"),
    (lambda p: p.__setitem__(0, {"name": "y"}), "input #0's parameter"),
    (lambda p: p.__setitem__(1, {"name": "mask", "default": None}), "input #1's parameter"),
    (lambda p: p.__delitem__(slice(1, None)), "2..256 items"),
    (lambda p: p.extend({"name": f"p{i}", "default": 0} for i in range(300)), "2..256 items"),
    (lambda p: p[2].update(extra=1), "extra"),
])
def test_hostile_parameters_are_refused(scaled, tmp_path, edit, words):
    def change(doc):
        edit(doc["entries"]["forward"]["parameters"])
    with pytest.raises(ArtifactError) as info:
        aotc.load(_edited(scaled[2], tmp_path, change))
    assert words in str(info.value), str(info.value)


def test_format_19_may_not_carry_parameters(scaled, tmp_path):
    def change(doc):
        doc["format_version"] = 19
    with pytest.raises(ArtifactError, match="parameters"):
        aotc.load(_edited(scaled[2], tmp_path, change))


def test_an_artifact_without_parameters_loads_positional_only(scaled, tmp_path):
    """The field is optional: without it, the artifact of this format behaves as before."""
    def change(doc):
        del doc["entries"]["forward"]["parameters"]
    m = aotc.load(_edited(scaled[2], tmp_path, change))
    model, (x, mask), _ = scaled
    torch.testing.assert_close(m(x, mask)["y"], model(x, mask)["y"])
    with pytest.raises(UsageError, match="records no parameter names"):
        m(x=x, mask=mask)


def test_forward_without_real_names_records_none():
    from aotc.exporter.signature import call_parameters

    class Star(torch.nn.Module):
        def forward(self, *xs):
            return xs[0]

    class PositionalOnly(torch.nn.Module):
        def forward(self, x, /, y=None):
            return x

    assert call_parameters(Star(), 1) is None
    assert call_parameters(PositionalOnly(), 1) is None
    assert call_parameters(Scaled(), 2)[:2] == [{"name": "x"}, {"name": "mask"}]


# ------------------------------------------------------------------ a BERT-like transformers model
def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog", "named inputs"] * 4,
                            trainers.WordPieceTrainer(vocab_size=60,
                                                      special_tokens=["[PAD]", "[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   model_input_names=["input_ids", "token_type_ids",
                                                      "attention_mask"])


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertModel
    tok = _tokenizer()
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64,
                                 max_position_embeddings=64)).eval()
    enc = tok(["the quick fox", "a lazy dog jumps over"], return_tensors="pt", padding=True)
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=32)
    dims = {0: batch, 1: seq}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = aotc.export(model, (enc["input_ids"], enc["attention_mask"],
                                   enc["token_type_ids"]),
                           tmp_path_factory.mktemp("bert") / "bert.aotc",
                           dynamic_shapes={"input_ids": dims, "attention_mask": dims,
                                           "token_type_ids": dims})
    return model, tok, path, [str(w.message) for w in caught]


def test_bert_takes_the_tokenizer_output(bert):
    model, tok, path, _ = bert
    m = aotc.load(path)
    for texts in (["the lazy dog", "fox"], ["named inputs jump over the quick brown fox"]):
        enc = tok(texts, return_tensors="pt", padding=True)
        got = m(**enc)
        with torch.no_grad():
            want = model(**enc)
        torch.testing.assert_close(got["last_hidden_state"], want.last_hidden_state,
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got["pooler_output"], want.pooler_output,
                                   rtol=1e-4, atol=1e-4)
    assert "token_type_ids: int64[batch, seq], position_ids=None" in m.signature()


def test_bert_without_a_needed_input_names_it(bert):
    _, tok, path, _ = bert
    enc = tok(["the fox"], return_tensors="pt")
    with pytest.raises(UsageError) as info:
        aotc.load(path)(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    assert "'token_type_ids'" in str(info.value)
    assert "input_ids, attention_mask, token_type_ids" in str(info.value)


def test_bert_export_warns_no_side_effects(bert):
    """torch's side-effects warning on transformers models is filtered during capture."""
    assert not [w for w in bert[3] if "side effects" in w], bert[3]


def test_format_20_fixture_binds_by_name():
    m = aotc.load(FIXTURES / "format_v20_tiny.aotc")
    (x,) = m.random_inputs()
    torch.testing.assert_close(m(x=x), m(x))
