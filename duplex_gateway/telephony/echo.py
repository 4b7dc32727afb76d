"""Phone-line echo: the assistant's own voice coming back from a speakerphone must not barge in.

The PSTN leg has no echo canceller of the browser's kind, so on a speakerphone the
reply the caller's phone plays leaks into its microphone, a few tens to hundreds of
milliseconds later, attenuated and filtered. Heard by the gateway's VAD, that echo
looks like the caller talking over the reply and cuts it off.

:class:`EchoSuppressor` keeps what was played (the reference) for the last
``window_ms`` and, for each piece of caller audio that arrives while the reply
plays, finds the delay at which the reference best explains it (FFT
cross-correlation) and subtracts the reference scaled by the least-squares gain
there. Echo leaves little behind; the caller's own voice, uncorrelated with the
reply, passes through.

A 20 ms piece of one voice resembles some 20 ms of another somewhere in a second of
it by chance, so a strong match alone does not make a piece echo: an echo path has
one delay, and a weaker match counts once three pieces in a row matched at one delay,
and then at that delay only (kept on the sample counts of both streams, which network
jitter does not move); elsewhere only a match as close as an echo's own counts. A
caller with no echo on the line is left as they spoke. It is a one-tap canceller per piece: it removes a delayed,
attenuated echo well, a strongly reverberant one only in part.

Pure: time arrives as arguments.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["EchoStats", "EchoSuppressor"]

Samples = npt.NDArray[np.float32]

#: A piece whose correlation with the reference peaks below this is not treated as echo.
_MIN_CORRELATION = 0.4
#: A residual below this share of the piece's energy means the piece was echo alone.
_ECHO_ONLY = 0.25
#: How much of such a residual is let through (-30 dB).
_RESIDUAL_GAIN = 0.03
#: Energy floor below which a piece is silence either way.
_SILENCE_ENERGY = 1e-7
#: How far (in ms) the delay of a match may stray from an earlier match's and still be the same path.
_DELAY_TOLERANCE_MS = 2.0
#: A match this strong is echo wherever it is: one in 150 pieces of another voice reaches it, nearly
#: every piece of a telephone echo does.
_STRONG_CORRELATION = 0.9
#: Matches in a row, after the first, that must agree on a delay before it is taken for the echo path's:
#: two chance likenesses agree about once in 250 pieces, three about once in 60,000.
_CONFIRMATIONS = 2


@dataclass(slots=True)
class EchoStats:
    """What the suppressor did, for measurement."""

    pieces: int = 0  # caller pieces heard while reference audio was recent
    suppressed: int = 0  # pieces found to be echo and cancelled
    energy_in: float = 0.0
    energy_out: float = 0.0

    @property
    def erle_db(self) -> float:
        """Echo return loss enhancement over the suppressed pieces (how much quieter they came out)."""
        if self.energy_out <= 0.0 or self.energy_in <= 0.0:
            return 0.0
        return float(10.0 * np.log10(self.energy_in / self.energy_out))


class EchoSuppressor:
    """Cancels the played reply from one call's caller audio (both at ``rate``)."""

    def __init__(self, rate: int, *, window_ms: float = 1_000.0) -> None:
        self.rate = rate
        self.window_s = window_ms / 1000.0
        #: Played reference: (time it finishes playing, samples), oldest first.
        self._reference: deque[tuple[float, Samples]] = deque()
        # Sample counts: reference samples dropped from the front of the window, caller samples seen.
        self._dropped = 0
        self._heard = 0
        # Where the reference best matched the caller, as (reference index - caller index): the last
        # match, how many matches in a row agreed with the one before, and the echo path's delay
        # once they did.
        self._previous: int | None = None
        self._agreeing = 0
        self._path: int | None = None
        self._tolerance = max(1, round(rate * _DELAY_TOLERANCE_MS / 1000))
        self.stats = EchoStats()

    def played(self, ends_at: float, samples: Samples) -> None:
        """Reply audio the carrier plays until ``ends_at``."""
        self._reference.append((ends_at, np.asarray(samples, np.float32)))

    def process(self, now: float, samples: Samples) -> Samples:
        """Caller audio that arrived at ``now``, with the echo of the reply taken out."""
        while self._reference and self._reference[0][0] < now - self.window_s:
            self._dropped += self._reference.popleft()[1].size
        position, self._heard = self._heard, self._heard + samples.size
        if not self._reference:
            # Nothing played for a while: the next reply starts a new count, and its delay is learnt anew.
            self._previous, self._agreeing, self._path = None, 0, None
            return samples
        if samples.size == 0:
            return samples
        x = np.asarray(samples, np.float64)
        energy = float(np.dot(x, x))
        self.stats.pieces += 1
        if energy / x.size < _SILENCE_ENERGY:
            return samples
        ref = np.concatenate([piece for _, piece in self._reference]).astype(np.float64)
        if ref.size < x.size:
            return samples
        # Cross-correlation of the piece against every position of the reference.
        size = 1 << (ref.size + x.size - 1).bit_length()
        corr = np.fft.irfft(np.fft.rfft(ref, size) * np.conj(np.fft.rfft(x, size)), size)[
            : ref.size - x.size + 1
        ]
        power = np.concatenate([[0.0], np.cumsum(ref * ref)])
        windows = power[x.size :] - power[: ref.size - x.size + 1]  # energy of each reference window
        norm = corr / np.sqrt(np.maximum(windows, 1e-12) * energy)
        found = self._echo_lag(norm, position)
        if found is None:
            return samples
        lag = found
        aligned = ref[lag : lag + x.size]
        gain = float(np.dot(x, aligned) / max(float(np.dot(aligned, aligned)), 1e-12))
        residual = x - gain * aligned
        out_energy = float(np.dot(residual, residual))
        if out_energy >= energy:
            return samples
        if out_energy < _ECHO_ONLY * energy:
            # Nearly all of it was echo: what is left is the echo's own distortion (the filter,
            # the codec), still speech-like to a VAD. Suppress it, as an echo canceller's
            # non-linear stage does; the caller talking over the echo leaves far more behind.
            residual *= _RESIDUAL_GAIN
            out_energy *= _RESIDUAL_GAIN**2
        self.stats.suppressed += 1
        self.stats.energy_in += energy
        self.stats.energy_out += out_energy
        return residual.astype(np.float32)

    def _echo_lag(self, norm: npt.NDArray[np.float64], position: int) -> int | None:
        """Where in the reference this piece's echo is, or None when it holds none of the path's.

        ``norm[k]``: the piece's correlation with the reference from index ``k`` on; ``position``:
        the piece's first sample on the caller's count.
        """
        base = position - self._dropped  # lag = path offset + base
        if self._path is not None:
            low = max(0, self._path + base - self._tolerance)
            high = min(norm.size, self._path + base + self._tolerance + 1)
            if low < high:
                near = low + int(np.argmax(norm[low:high]))
                if norm[near] >= _MIN_CORRELATION:
                    self._path = self._previous = near - base
                    return near
        best = int(np.argmax(norm))
        if norm[best] < _MIN_CORRELATION:
            return None
        offset = best - base
        agrees = self._previous is not None and abs(offset - self._previous) <= self._tolerance
        self._agreeing = self._agreeing + 1 if agrees else 0
        self._previous = offset
        if self._agreeing >= _CONFIRMATIONS:
            self._path = offset
            return best
        # Off any known path: echo only if it is all but the reference itself (a path whose delay
        # wanders, as a playout that stalls makes it); a weaker likeness is a chance one.
        return best if norm[best] >= _STRONG_CORRELATION else None
