"""Sample codecs: wire bytes in any :class:`Encoding` to float32 samples and back.

Everything inside the gateway works on mono float32 in -1.0..1.0; this module is
the only place that knows how each encoding lays samples out in bytes.

G.711 follows ITU-T G.711 as implemented by the classic Sun Microsystems
reference code (the same tables ``audioop`` used): decoding is a 256-entry
lookup, encoding a 65536-entry lookup indexed by the 16-bit linear sample, both
built once at import so per-chunk work is one vectorised ``take``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from duplex_gateway.vocabulary.formats import Encoding

__all__ = [
    "ALAW_TO_PCM16",
    "PCM16_TO_ALAW",
    "PCM16_TO_ULAW",
    "ULAW_TO_PCM16",
    "Samples",
    "decode",
    "decode_pcm16",
    "encode",
    "encode_pcm16",
    "float_to_pcm16",
    "pcm16_to_float",
]

#: Mono float32 audio, nominally -1.0..1.0.
Samples = npt.NDArray[np.float32]

_PCM16_SCALE: Final = 32768.0
_LE_INT16: Final = np.dtype("<i2")
_LE_FLOAT32: Final = np.dtype("<f4")


# --- G.711 tables -------------------------------------------------------------------


def _ulaw_decode_table() -> npt.NDArray[np.int16]:
    codes = np.arange(256, dtype=np.int32)
    u = ~codes & 0xFF
    bias = 0x84
    t = (((u & 0x0F) << 3) + bias) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, bias - t, t - bias).astype(np.int16)


def _alaw_decode_table() -> npt.NDArray[np.int16]:
    codes = np.arange(256, dtype=np.int32)
    a = codes ^ 0x55
    seg = (a & 0x70) >> 4
    mantissa = (a & 0x0F) << 4
    t = np.where(seg == 0, mantissa + 8, mantissa + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _segment(value: npt.NDArray[np.int32], segment_ends: tuple[int, ...]) -> npt.NDArray[np.int32]:
    # Index of the first segment whose upper bound holds the value; 8 means "above all".
    return np.searchsorted(np.asarray(segment_ends), value, side="left").astype(np.int32)


def _ulaw_encode_table() -> npt.NDArray[np.uint8]:
    # Indexed by the int16 sample reinterpreted as uint16, so entry i is for int16(i).
    linear = np.arange(65536, dtype=np.int32)
    linear = np.where(linear >= 32768, linear - 65536, linear)
    pcm = linear >> 2  # the reference works on 14-bit magnitudes (arithmetic shift)
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    pcm = np.minimum(np.abs(pcm), 8159) + (0x84 >> 2)
    seg = _segment(pcm, (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF))
    uval = (seg << 4) | ((pcm >> (np.minimum(seg, 7) + 1)) & 0x0F)
    code = np.where(seg >= 8, 0x7F ^ mask, uval ^ mask)
    return code.astype(np.uint8)


def _alaw_encode_table() -> npt.NDArray[np.uint8]:
    linear = np.arange(65536, dtype=np.int32)
    linear = np.where(linear >= 32768, linear - 65536, linear)
    pcm = linear >> 3  # 13-bit magnitudes (arithmetic shift, as in the reference)
    negative = pcm < 0
    mask = np.where(negative, 0x55, 0xD5)
    pcm = np.where(negative, -pcm - 1, pcm)
    seg = _segment(pcm, (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF))
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    aval = (seg << 4) | ((pcm >> shift) & 0x0F)
    code = np.where(seg >= 8, 0x7F ^ mask, aval ^ mask)
    return code.astype(np.uint8)


#: G.711 μ-law byte → linear int16.
ULAW_TO_PCM16: Final = _ulaw_decode_table()
#: G.711 A-law byte → linear int16.
ALAW_TO_PCM16: Final = _alaw_decode_table()
#: Linear int16 (viewed as uint16) → G.711 μ-law byte.
PCM16_TO_ULAW: Final = _ulaw_encode_table()
#: Linear int16 (viewed as uint16) → G.711 A-law byte.
PCM16_TO_ALAW: Final = _alaw_encode_table()

for _table in (ULAW_TO_PCM16, ALAW_TO_PCM16, PCM16_TO_ULAW, PCM16_TO_ALAW):
    _table.flags.writeable = False  # shared by every session: make accidental writes fail loudly
del _table


# --- PCM16 <-> float ----------------------------------------------------------------


def pcm16_to_float(pcm: npt.NDArray[np.int16]) -> Samples:
    """Linear int16 samples as float32 in -1.0..1.0 (``x / 32768``)."""
    return pcm.astype(np.float32) / np.float32(_PCM16_SCALE)


def float_to_pcm16(samples: npt.NDArray[np.floating]) -> npt.NDArray[np.int16]:
    """float samples as int16: scaled by 32768, rounded to nearest, clipped to int16.

    NaN becomes 0 so one bad sample cannot turn into full-scale noise.
    """
    scaled: npt.NDArray[np.float32] = np.nan_to_num(
        np.asarray(samples, dtype=np.float32) * np.float32(_PCM16_SCALE)
    )
    np.rint(scaled, out=scaled)
    np.clip(scaled, -32768.0, 32767.0, out=scaled)
    return scaled.astype(np.int16)


# --- public codec -------------------------------------------------------------------


def decode(data: bytes, encoding: Encoding) -> Samples:
    """Wire bytes as mono float32 samples in -1.0..1.0.

    ``data`` must be a whole number of samples (check with
    :meth:`AudioFormat.check_length` first); a partial sample raises ``ValueError``.
    Float input is sanitised: NaN/inf become 0 and values are clipped to ±1, because
    they would otherwise poison resampler and VAD state for the rest of the stream.
    """
    width = encoding.bytes_per_sample
    if len(data) % width:
        raise ValueError(f"{len(data)} bytes is not a whole number of {width}-byte {encoding} samples")
    if encoding is Encoding.PCM16:
        return pcm16_to_float(np.frombuffer(data, dtype=_LE_INT16))
    if encoding is Encoding.PCM_F32LE:
        out = np.frombuffer(data, dtype=_LE_FLOAT32).astype(np.float32)  # writable native copy
        np.nan_to_num(out, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        return np.clip(out, -1.0, 1.0, out=out)
    if encoding is Encoding.G711_ULAW:
        return pcm16_to_float(ULAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)])
    if encoding is Encoding.G711_ALAW:
        return pcm16_to_float(ALAW_TO_PCM16[np.frombuffer(data, dtype=np.uint8)])
    raise ValueError(f"unsupported encoding {encoding!r}")


def decode_pcm16(data: bytes) -> npt.NDArray[np.int16]:
    """Little-endian PCM16 bytes as native int16 samples (no float conversion)."""
    return np.frombuffer(data, dtype=_LE_INT16).astype(np.int16)


def encode_pcm16(pcm: npt.NDArray[np.int16], encoding: Encoding) -> bytes:
    """Linear int16 samples as wire bytes; exact for PCM16 and G.711 (no float round trip)."""
    pcm = np.ascontiguousarray(pcm, dtype=np.int16)
    if encoding is Encoding.PCM16:
        return pcm.astype(_LE_INT16, copy=False).tobytes()
    if encoding is Encoding.G711_ULAW:
        return PCM16_TO_ULAW[pcm.view(np.uint16)].tobytes()
    if encoding is Encoding.G711_ALAW:
        return PCM16_TO_ALAW[pcm.view(np.uint16)].tobytes()
    if encoding is Encoding.PCM_F32LE:
        return pcm16_to_float(pcm).astype(_LE_FLOAT32, copy=False).tobytes()
    raise ValueError(f"unsupported encoding {encoding!r}")


def encode(samples: npt.NDArray[np.floating], encoding: Encoding) -> bytes:
    """Mono float samples (-1.0..1.0) as wire bytes; out-of-range values are clipped."""
    if encoding is Encoding.PCM_F32LE:
        out = np.nan_to_num(np.asarray(samples, dtype=np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
        np.clip(out, -1.0, 1.0, out=out)
        return out.astype(_LE_FLOAT32, copy=False).tobytes()
    return encode_pcm16(float_to_pcm16(samples), encoding)
