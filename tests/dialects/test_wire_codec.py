"""The wire's JSON and base64 give what the standard library gives: the same values, the same errors."""

from __future__ import annotations

import base64
import binascii
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_gateway.dialects import wire_codec

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_what_it_writes_reads_back_as_the_standard_library_reads_it(value: object) -> None:
    text = wire_codec.dumps(value)
    assert json.loads(text) == value
    assert wire_codec.loads(text) == value


@pytest.mark.parametrize(
    "text",
    [
        '{"type":"input_audio_buffer.append","audio":"AAAA"}',
        '{"a": 1, "a": 2}',  # the last of a repeated key, as json.loads
        "[1e400, -0.0, 1.5]",
        '{"n": 123456789012345678901234567890}',  # past 64 bits: orjson refuses, the result stands
        '{"x": NaN, "y": Infinity}',  # not JSON, but json.loads reads it
        '"\\ud800"',  # a lone surrogate
        '"caf\u00e9 \\u00e9"',
        " [] ",
    ],
)
def test_it_reads_what_the_standard_library_reads(text: str) -> None:
    expected = json.loads(text)
    got = wire_codec.loads(text)
    assert json.dumps(got) == json.dumps(expected)


@pytest.mark.parametrize("text", ["", "{", '{"a":}', "[1,]", "{'a': 1}", '"\x01"', "1 2", "[" * 2000])
def test_it_refuses_what_the_standard_library_refuses_in_its_words(text: str) -> None:
    try:
        json.loads(text)
    except (ValueError, RecursionError) as exc:
        expected: BaseException = exc
    else:  # pragma: no cover - every input above is bad
        pytest.fail(f"json.loads read {text!r}")
    with pytest.raises(type(expected)) as got:
        wire_codec.loads(text)
    assert str(got.value) == str(expected)


def test_what_orjson_cannot_write_is_written_by_the_standard_library() -> None:
    assert json.loads(wire_codec.dumps({"big": 2**70, "nested": [2**65]})) == {
        "big": 2**70,
        "nested": [2**65],
    }
    assert wire_codec.dumps({"a": "x", "b": [1, 2]}) == '{"a":"x","b":[1,2]}'  # compact, in order


def test_a_float_json_cannot_hold_is_written_as_null() -> None:
    # The standard library wrote NaN and Infinity, which a strict client's parser refuses.
    assert json.loads(wire_codec.dumps([float("nan"), float("inf"), -float("inf")])) == [None, None, None]


@given(st.binary(max_size=4096))
def test_base64_is_the_standard_alphabet_both_ways(data: bytes) -> None:
    text = wire_codec.b64encode(data)
    assert text == base64.b64encode(data).decode("ascii")
    assert wire_codec.b64decode(text) == data


@pytest.mark.parametrize("text", ["abc", "ab=c", "YWJj\n", "YQ==YQ==", "Y", "a b=", "\u00e9AAA"])
def test_invalid_base64_is_refused(text: str) -> None:
    if text.isascii():
        with pytest.raises(binascii.Error):
            base64.b64decode(text, validate=True)
    with pytest.raises(binascii.Error):
        wire_codec.b64decode(text)
