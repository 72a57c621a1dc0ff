"""Unit tests: the --example-input mini-language (exporter/specs.py)."""
from __future__ import annotations

import pytest
import torch

from aotc.errors import UsageError
from aotc.exporter.specs import InputSpec, make_inputs, parse_dtype, parse_input_spec


@pytest.mark.parametrize("text,shape,dtype,values", [
    ("32x64", (32, 64), torch.float32, None),
    ("8x3x224x224", (8, 3, 224, 224), torch.float32, None),
    ("7", (7,), torch.float32, None),
    ("1x1x1x1x1x1", (1,) * 6, torch.float32, None),
    (" 8 x 128 ", (8, 128), torch.float32, None),
    ("scalar", (), torch.float32, None),
    ("SCALAR:float64", (), torch.float64, None),
    ("8x128:int64", (8, 128), torch.int64, None),
    ("8x128:int64:0..30521", (8, 128), torch.int64, (0, 30521)),
    ("8x128:int32:-5..5", (8, 128), torch.int32, (-5, 5)),
    ("4:int64: 3 .. 3 ", (4,), torch.int64, (3, 3)),
    ("2x2:bf16", (2, 2), torch.bfloat16, None),
    ("2x2:fp16", (2, 2), torch.float16, None),
    ("2x2:half", (2, 2), torch.float16, None),
    ("2x2:double", (2, 2), torch.float64, None),
    ("2x2:long", (2, 2), torch.int64, None),
    ("2x2:int", (2, 2), torch.int32, None),
    ("2x2:Float32", (2, 2), torch.float32, None),
    ("2x2:bool", (2, 2), torch.bool, None),
    ("2x2:uint8:0..255", (2, 2), torch.uint8, (0, 255)),
])
def test_valid_specs(text, shape, dtype, values):
    spec = parse_input_spec(text)
    assert isinstance(spec, InputSpec)
    assert (spec.shape, spec.dtype, spec.values) == (shape, dtype, values)


# Words of a bad-shape message (a name where a size belongs reads as an undeclared named dim).
SHAPE_ERROR = ("malformed shape", "used before it is declared")


@pytest.mark.parametrize("text,fragment", [
    ("", "malformed example input"),
    ("   ", "malformed example input"),
    (":float32", "malformed example input"),
    ("32xx64", SHAPE_ERROR),
    ("a x b", SHAPE_ERROR),
    ("x64", SHAPE_ERROR),
    ("32x", "malformed shape"),
    ("32x-4", "malformed shape"),
    ("3.5x2", "malformed shape"),
    ("1e3", "malformed shape"),
    ("32,64", "malformed shape"),
    ("0x4", "zero-sized"),
    ("4x0", "zero-sized"),
    ("32x64:float33", "unknown dtype"),
    ("32x64:", "unknown dtype"),
    ("32x64:torch.float32", "unknown dtype"),
    ("32x64:int64:0..9:3", "malformed example input"),
    ("32x64:int64:9..0", "malformed value range"),
    ("32x64:int64:0-9", "malformed value range"),
    ("32x64:int64:..9", "malformed value range"),
    ("32x64:int64:a..b", "malformed value range"),
    ("32x64:float32:0..9", "only applies to integer"),
    ("32x64:bool:0..1", "only applies to integer"),
])
def test_invalid_specs(text, fragment):
    with pytest.raises(UsageError) as info:
        parse_input_spec(text)
    fragments = fragment if isinstance(fragment, tuple) else (fragment,)
    assert any(f in str(info.value) for f in fragments), str(info.value)
    assert info.value.where == f"--example-input {text!r}"
    assert info.value.exit_code == 2
    assert info.value.fix          # every error suggests a fix


def test_error_names_the_offending_spec():
    with pytest.raises(UsageError) as info:
        parse_input_spec("32xx64:int64")
    assert info.value.where == "--example-input '32xx64:int64'"
    assert "32xx64" in str(info.value)


@pytest.mark.parametrize("text", ["2x2:int8:0..1000", "2x2:uint8:-5..5", "2x2:int16:0..70000",
                                  "2x2:int64:0..99999999999999999999", "2x2:complex64:0..3"])
def test_value_range_must_fit_dtype(text):
    try:
        parse_input_spec(text)
    except UsageError:
        return
    raise AssertionError(f"{text!r} was accepted")


def test_parse_dtype_lists_known_names():
    with pytest.raises(UsageError) as info:
        parse_dtype("float33", where="here")
    assert "float32" in str(info.value.expected) and "int64" in str(info.value.expected)
    assert info.value.where == "here"


def test_make_inputs_shapes_dtypes_ranges_and_determinism():
    specs = [parse_input_spec(s) for s in ("4x5", "3x7:int64:10..12", "2:int32", "6:bool",
                                           "scalar:float64")]
    a = make_inputs(specs)
    b = make_inputs(specs)
    c = make_inputs(specs, seed=1)
    assert [t.shape for t in a] == [torch.Size(s.shape) for s in specs]
    assert [t.dtype for t in a] == [torch.float32, torch.int64, torch.int32, torch.bool,
                                    torch.float64]
    assert int(a[1].min()) >= 10 and int(a[1].max()) <= 12
    assert int(a[2].min()) >= 0 and int(a[2].max()) <= 9          # default range 0..9
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_make_inputs_covers_whole_range():
    t = make_inputs([parse_input_spec("1000:int64:-2..2")])[0]
    assert set(t.tolist()) == {-2, -1, 0, 1, 2}
