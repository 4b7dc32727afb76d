"""Codec tests: reference G.711 values, exact round trips, clipping, bad lengths."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from duplex_gateway.audio.codec import (
    ALAW_TO_PCM16,
    PCM16_TO_ALAW,
    PCM16_TO_ULAW,
    ULAW_TO_PCM16,
    decode,
    decode_pcm16,
    encode,
    encode_pcm16,
    float_to_pcm16,
    pcm16_to_float,
)
from duplex_gateway.vocabulary.formats import Encoding

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


# --- G.711 reference values (ITU-T G.711 / Sun reference implementation) -----------


@pytest.mark.parametrize(
    ("code", "linear"),
    [
        (0xFF, 0),
        (0x7F, 0),
        (0x00, -32124),
        (0x80, 32124),
        (0xFE, 8),  # the smallest non-zero levels
        (0x7E, -8),
        (0xEF, 132),  # first level of segment 1
    ],
)
def test_ulaw_decode_reference(code: int, linear: int) -> None:
    assert int(ULAW_TO_PCM16[code]) == linear
    assert decode(bytes([code]), Encoding.G711_ULAW)[0] == np.float32(linear / 32768)


@pytest.mark.parametrize(
    ("code", "linear"),
    [(0xD5, 8), (0x55, -8), (0xAA, 32256), (0x2A, -32256), (0xD4, 24), (0x54, -24)],
)
def test_alaw_decode_reference(code: int, linear: int) -> None:
    assert int(ALAW_TO_PCM16[code]) == linear
    assert decode(bytes([code]), Encoding.G711_ALAW)[0] == np.float32(linear / 32768)


@pytest.mark.parametrize(
    ("linear", "ulaw", "alaw"),
    [
        (0, 0xFF, 0xD5),
        (-1, 0x7E, 0x55),
        (32767, 0x80, 0xAA),
        (-32768, 0x00, 0x2A),
        (1000, 0xCE, 0xFA),
        (-1000, 0x4E, 0x7A),
    ],
)
def test_g711_encode_reference(linear: int, ulaw: int, alaw: int) -> None:
    pcm = np.array([linear], dtype=np.int16)
    assert encode_pcm16(pcm, Encoding.G711_ULAW) == bytes([ulaw])
    assert encode_pcm16(pcm, Encoding.G711_ALAW) == bytes([alaw])


def test_g711_tables_are_read_only() -> None:
    for table in (ULAW_TO_PCM16, ALAW_TO_PCM16, PCM16_TO_ULAW, PCM16_TO_ALAW):
        with pytest.raises(ValueError):
            table[0] = 1
    assert PCM16_TO_ULAW.shape == PCM16_TO_ALAW.shape == (65536,)


@pytest.mark.parametrize("encoding", [Encoding.G711_ULAW, Encoding.G711_ALAW])
def test_g711_every_code_survives_decode_encode(encoding: Encoding) -> None:
    # Decoding yields the code's reconstruction level; encoding it must give the
    # same code back (except μ-law's two zeros, 0x7F and 0xFF, which both mean 0).
    codes = bytes(range(256))
    back = encode(decode(codes, encoding), encoding)
    expected = bytes(0xFF if c == 0x7F else c for c in codes) if encoding is Encoding.G711_ULAW else codes
    assert back == expected


@pytest.mark.parametrize("encoding", [Encoding.G711_ULAW, Encoding.G711_ALAW])
def test_g711_encode_is_monotonic_in_level(encoding: Encoding) -> None:
    levels = decode(encode_pcm16(ALL_INT16, encoding), encoding)
    assert np.all(np.diff(levels) >= 0)
    # Both laws' largest step is 1024 (segment 7), so no input is further from its level.
    assert np.max(np.abs(levels * 32768 - ALL_INT16.astype(np.float32))) <= 1024


@pytest.mark.parametrize(
    ("module_encode", "module_decode", "encoding"),
    [("lin2ulaw", "ulaw2lin", Encoding.G711_ULAW), ("lin2alaw", "alaw2lin", Encoding.G711_ALAW)],
)
def test_g711_matches_audioop_exhaustively(
    module_encode: str, module_decode: str, encoding: Encoding
) -> None:
    # audioop is gone from Python 3.13; where it still exists it is the classic
    # reference implementation, so compare all 65536 inputs and all 256 codes.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            audioop = importlib.import_module("audioop")
        except ImportError:
            pytest.skip("audioop not available")
    linear = ALL_INT16.astype("<i2").tobytes()
    assert encode_pcm16(ALL_INT16, encoding) == getattr(audioop, module_encode)(linear, 2)
    codes = bytes(range(256))
    expected = np.frombuffer(getattr(audioop, module_decode)(codes, 2), dtype="<i2")
    assert np.array_equal(decode(codes, encoding) * 32768, expected.astype(np.float32))


# --- PCM -----------------------------------------------------------------------------


def test_pcm16_round_trip_is_exact() -> None:
    data = ALL_INT16.astype("<i2").tobytes()
    samples = decode(data, Encoding.PCM16)
    assert samples.dtype == np.float32
    assert samples.min() == -1.0 and samples.max() == np.float32(32767 / 32768)
    assert encode(samples, Encoding.PCM16) == data


def test_pcm16_is_little_endian() -> None:
    assert encode(np.array([1 / 32768, -1 / 32768], dtype=np.float32), Encoding.PCM16) == b"\x01\x00\xff\xff"
    assert decode(b"\x00\x80\xff\x7f", Encoding.PCM16).tolist() == [-1.0, 32767 / 32768]


def test_float_to_pcm16_rounds_and_clips() -> None:
    x = np.array([0.0, 1.0, -1.0, 2.0, -2.0, 0.4 / 32768, 0.6 / 32768, -0.6 / 32768, np.nan])
    assert float_to_pcm16(x).tolist() == [0, 32767, -32768, 32767, -32768, 0, 1, -1, 0]
    assert pcm16_to_float(np.array([-32768, 16384], dtype=np.int16)).tolist() == [-1.0, 0.5]


def test_f32_round_trip_and_sanitising() -> None:
    x = np.array([0.0, 0.25, -0.5, 1.0], dtype=np.float32)
    data = encode(x, Encoding.PCM_F32LE)
    assert data == x.astype("<f4").tobytes()
    assert np.array_equal(decode(data, Encoding.PCM_F32LE), x)
    raw = np.array([np.nan, np.inf, -np.inf, 3.0, -3.0], dtype="<f4").tobytes()
    assert decode(raw, Encoding.PCM_F32LE).tolist() == [0.0, 0.0, 0.0, 1.0, -1.0]
    assert np.frombuffer(encode(np.array([5.0, -5.0]), Encoding.PCM_F32LE), "<f4").tolist() == [1.0, -1.0]


def test_decode_pcm16_and_encode_pcm16_round_trip() -> None:
    data = ALL_INT16.astype("<i2").tobytes()
    pcm = decode_pcm16(data)
    assert pcm.dtype == np.int16
    assert encode_pcm16(pcm, Encoding.PCM16) == data
    assert encode_pcm16(pcm, Encoding.PCM_F32LE) == encode(decode(data, Encoding.PCM16), Encoding.PCM_F32LE)
    # Non-contiguous input is fine.
    assert encode_pcm16(pcm[::2], Encoding.G711_ULAW) == encode_pcm16(pcm[::2].copy(), Encoding.G711_ULAW)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_empty_input(encoding: Encoding) -> None:
    assert decode(b"", encoding).size == 0
    assert encode(np.zeros(0, dtype=np.float32), encoding) == b""


@pytest.mark.parametrize(
    ("encoding", "length"), [(Encoding.PCM16, 3), (Encoding.PCM_F32LE, 6), (Encoding.PCM_F32LE, 1)]
)
def test_partial_sample_is_refused(encoding: Encoding, length: int) -> None:
    with pytest.raises(ValueError, match="whole number"):
        decode(b"\x00" * length, encoding)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_encoded_length_matches_sample_count(encoding: Encoding) -> None:
    x = np.linspace(-1, 1, 101, dtype=np.float32)
    data = encode(x, encoding)
    assert len(data) == 101 * encoding.bytes_per_sample
    assert decode(data, encoding).size == 101
