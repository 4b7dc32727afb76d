"""Input/output converters: format + rate conversion, length checks, time accounting."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from duplex_gateway.audio.codec import decode, decode_pcm16, encode, encode_pcm16, float_to_pcm16
from duplex_gateway.audio.convert import VAD_RATE, InputConverter, OutputConverter
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from tests.fixtures import load_speech


def _fmt(encoding: Encoding, rate: int) -> AudioFormat:
    return AudioFormat(encoding=encoding, rate=rate)


def _pcm16(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    return float_to_pcm16(samples)


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# --- input ----------------------------------------------------------------------------


def test_pcm16_at_engine_rate_passes_through_unchanged() -> None:
    conv = InputConverter(_fmt(Encoding.PCM16, 24000), 24000)
    data = encode(load_speech(24000)[:4800], Encoding.PCM16)
    assert conv.convert(data) == data
    assert conv.flush() == b""
    assert conv.input_samples == 4800
    assert conv.input_ms == 200.0


@pytest.mark.parametrize(
    ("encoding", "rate", "engine_rate"),
    [
        (Encoding.G711_ULAW, 8000, 24000),
        (Encoding.G711_ALAW, 8000, 16000),
        (Encoding.PCM16, 48000, 24000),
        (Encoding.PCM_F32LE, 44100, 16000),
        (Encoding.PCM_F32LE, 24000, 24000),
    ],
)
def test_input_chunked_matches_one_shot(encoding: Encoding, rate: int, engine_rate: int) -> None:
    wire = encode(load_speech(rate), encoding)
    width = encoding.bytes_per_sample
    conv = InputConverter(_fmt(encoding, rate), engine_rate)
    # Chunks of 20 ms, as telephony clients send, plus a ragged last one.
    chunk = rate // 50 * width
    out = b"".join(conv.convert(part) for part in _split(wire, chunk)) + conv.flush()
    expected = decode(wire, encoding)
    if rate != engine_rate:
        expected = soxr.resample(expected, rate, engine_rate, quality="HQ")
    got = np.frombuffer(out, dtype="<i2")
    assert got.size == expected.size
    assert np.max(np.abs(got.astype(np.int32) - _pcm16(expected).astype(np.int32))) <= 1


@pytest.mark.parametrize(
    ("encoding", "payload"),
    [(Encoding.PCM16, b"\x00\x01\x02"), (Encoding.PCM_F32LE, b"\x00" * 6)],
)
def test_input_partial_sample_is_a_protocol_error(encoding: Encoding, payload: bytes) -> None:
    conv = InputConverter(_fmt(encoding, 24000), 24000)
    for method in (conv.convert, conv.convert_with_vad_feed):
        with pytest.raises(ProtocolError) as info:
            method(payload)
        assert info.value.code is ErrorCode.INVALID_AUDIO_LENGTH
    assert conv.input_samples == 0  # a refused payload does not move the clock


@pytest.mark.parametrize(
    ("encoding", "rate", "chunk_bytes", "ms_per_chunk"),
    [
        (Encoding.G711_ULAW, 8000, 160, 20.0),
        (Encoding.PCM16, 24000, 960, 20.0),
        (Encoding.PCM_F32LE, 16000, 640, 10.0),
        (Encoding.PCM16, 44100, 882, 10.0),
    ],
)
def test_input_ms_counts_wire_audio(
    encoding: Encoding, rate: int, chunk_bytes: int, ms_per_chunk: float
) -> None:
    conv = InputConverter(_fmt(encoding, rate), 24000)
    for _ in range(150):
        conv.convert(b"\x00" * chunk_bytes)
    assert conv.input_ms == pytest.approx(150 * ms_per_chunk, abs=1e-9)
    conv.reset()
    assert conv.input_ms == 0.0


def test_vad_feed_is_16k_and_aligned() -> None:
    speech = load_speech(8000)
    wire = encode(speech, Encoding.G711_ULAW)
    conv = InputConverter(_fmt(Encoding.G711_ULAW, 8000), 24000)
    engine, feed = [], []
    for part in _split(wire, 160):
        pcm, vad = conv.convert_with_vad_feed(part)
        engine.append(pcm)
        feed.append(vad)
    vad_all = np.concatenate(feed)
    assert vad_all.dtype == np.float32
    # The VAD feed uses soxr's quick quality: it releases audio at once, so turn ends come sooner.
    expected = soxr.resample(decode(wire, Encoding.G711_ULAW), 8000, VAD_RATE, quality="QQ")
    assert expected.size - 64 < vad_all.size <= expected.size
    assert np.max(np.abs(vad_all - expected[: vad_all.size])) < 1e-6
    assert conv.vad_origin_ms == 0.0
    # The engine stream is unaffected by the VAD tap.
    plain = InputConverter(_fmt(Encoding.G711_ULAW, 8000), 24000)
    assert b"".join(engine) == b"".join(plain.convert(p) for p in _split(wire, 160))


def test_vad_feed_at_16k_wire_is_the_decoded_input() -> None:
    conv = InputConverter(_fmt(Encoding.PCM16, 16000), 24000)
    data = encode(load_speech(16000)[:3200], Encoding.PCM16)
    _, vad = conv.convert_with_vad_feed(data)
    assert np.array_equal(vad, decode(data, Encoding.PCM16))


def test_plain_convert_ends_the_vad_feed_and_a_new_one_gets_an_origin() -> None:
    conv = InputConverter(_fmt(Encoding.PCM16, 24000), 24000)
    chunk = b"\x00\x00" * 480  # 20 ms
    conv.convert_with_vad_feed(chunk)
    conv.convert(chunk)
    conv.convert(chunk)
    assert conv.vad_origin_ms == 0.0
    conv.convert_with_vad_feed(chunk)
    assert conv.vad_origin_ms == 60.0
    assert conv.input_ms == 80.0


def test_input_flush_drains_engine_tail_then_restarts() -> None:
    conv = InputConverter(_fmt(Encoding.PCM16, 8000), 24000)
    data = encode(load_speech(8000)[:1600], Encoding.PCM16)  # 200 ms
    first = conv.convert(data) + conv.flush()
    assert len(first) == 4800 * 2
    second = conv.convert(data) + conv.flush()
    assert first == second


# --- output ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine_rate", "encoding", "rate"),
    [
        (24000, Encoding.G711_ULAW, 8000),
        (24000, Encoding.G711_ALAW, 8000),
        (24000, Encoding.PCM16, 16000),
        (16000, Encoding.PCM_F32LE, 48000),
        (24000, Encoding.PCM16, 24000),
        (24000, Encoding.G711_ULAW, 24000),
    ],
)
def test_output_chunked_matches_one_shot(engine_rate: int, encoding: Encoding, rate: int) -> None:
    pcm = encode(load_speech(engine_rate), Encoding.PCM16)
    conv = OutputConverter(engine_rate, _fmt(encoding, rate))
    # Odd chunk sizes split samples across calls, as a byte stream from an engine may.
    out = b"".join(conv.convert(part) for part in _split(pcm, 999)) + conv.flush()
    expected = decode(pcm, Encoding.PCM16)
    if engine_rate != rate:
        expected = soxr.resample(expected, engine_rate, rate, quality="HQ")
    assert len(out) == expected.size * encoding.bytes_per_sample
    got = decode(out, encoding)
    reference = decode(encode(expected, encoding), encoding)
    if encoding is Encoding.PCM_F32LE:
        assert np.max(np.abs(got - reference)) < 1e-6
    else:
        # One code step at most: G.711 bins are wide and float noise can tip a boundary.
        assert np.mean(got != reference) < 0.01


def test_output_identity_is_exact() -> None:
    pcm = encode(load_speech(8000), Encoding.PCM16)
    conv = OutputConverter(8000, _fmt(Encoding.G711_ULAW, 8000))
    assert conv.convert(pcm) == encode_pcm16(decode_pcm16(pcm), Encoding.G711_ULAW)
    assert OutputConverter(8000, _fmt(Encoding.PCM16, 8000)).convert(pcm) == pcm


def test_output_flush_isolates_responses() -> None:
    pcm = encode(load_speech(24000)[:7200], Encoding.PCM16)
    conv = OutputConverter(24000, _fmt(Encoding.G711_ULAW, 8000))
    first = conv.convert(pcm) + conv.flush()
    second = conv.convert(pcm) + conv.flush()
    assert first == second
    assert len(first) == 2400


def test_output_reset_drops_state_and_half_samples() -> None:
    pcm = encode(load_speech(24000)[:7200], Encoding.PCM16)
    conv = OutputConverter(24000, _fmt(Encoding.PCM16, 16000))
    conv.convert(pcm[:4001])  # leaves half a sample and filter state behind
    conv.reset()
    fresh = OutputConverter(24000, _fmt(Encoding.PCM16, 16000))
    assert conv.convert(pcm) + conv.flush() == fresh.convert(pcm) + fresh.flush()


def test_output_odd_bytes_are_carried_over() -> None:
    conv = OutputConverter(16000, _fmt(Encoding.PCM16, 16000))
    assert conv.convert(b"\x01") == b""
    assert conv.convert(b"\x02\x03") == b"\x01\x02"
    assert conv.flush() == b""  # the dangling \x03 is half a sample: dropped
    assert conv.convert(b"\x04\x05") == b"\x04\x05"
