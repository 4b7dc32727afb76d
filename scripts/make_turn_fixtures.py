"""Make the turn-taking test set in ``tests/fixtures/turns/`` (run once; the FLAC files are committed).

Two kinds of caller turn, spoken by the embedded engine's Piper voice (joe, medium) at three
speaking rates and by espeak-ng as a second, robotic speaker:

* ``paused_NN.flac``: a whole sentence synthesized with a comma after a word no sentence ends on
  ("Can you send the invoice to, my office in Leeds?"), so the voice keeps its continuation
  prosody there; the pause the comma leaves (the longest quiet run inside the utterance) is then
  stretched to 0.8-1.0 s of digital silence. A turn detector that ends the turn in that pause
  has cut the caller off mid-sentence.
* ``complete_NN.flac``: a whole sentence with no inner pause; the caller is done when it ends.

Every file is mono 16 kHz PCM16, trimmed at |x| > 0.01 and normalised to 0.7 peak, with no
silence around it. Piper's synthesis is not deterministic, so the audio is committed and this
script only documents how it was made. Each pause is checked before it is kept: Whisper must
hear the words before it end on the word before the comma (or hear as many words, the one
before that right: a lone function word at the end of a clip is often misheard). The script prints the loader's
table (``tests/fixtures/turn_set.py``) with where each pause lies.

Usage: ``python scripts/make_turn_fixtures.py [--out tests/fixtures/turns]`` (needs the embedded
extra and the ``espeak-ng`` program).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

RATE = 16_000
PEAK = 0.7
#: Frames (10 ms) quieter than this fraction of the utterance's loud frames count as a gap.
QUIET_FRACTION = 0.06
#: The stretched pauses, in turn (0.8-1.0 s: far past server_vad's 500 ms of silence).
PAUSES_MS = (800, 900, 1000)
#: Piper's length scale per sentence, in turn: faster, normal, slower.
LENGTH_SCALES = (0.85, 1.0, 1.2)
#: Fades at the stretched pause's edges, so the cut clicks at no level the VAD could hear.
FADE_MS = 5

#: (speaker, sentence with the comma at the pause); the word before the comma ends no sentence.
PAUSED = (
    ("piper", "Can you send the invoice to, my office in Leeds?"),
    ("piper", "I need a taxi from the station to, the airport."),
    ("piper", "Please move my appointment to, the following Friday."),
    ("piper", "I would like to speak with, the manager of the store."),
    ("piper", "Could you check the status of, my last payment?"),
    ("piper", "I am calling because, my card was declined today."),
    ("piper", "The parcel was left outside and, somebody took it."),
    ("piper", "Can I pay the bill with, a different credit card?"),
    ("piper", "I want to add my wife to, the insurance policy."),
    ("piper", "Please transfer the money into, my savings account."),
    ("piper", "Is there a train from Leeds to, York this evening?"),
    ("piper", "Please send the documents to my, lawyer by Monday."),
    ("espeak", "I need a taxi from the hotel to, the conference centre."),
    ("espeak", "Can you tell me the opening hours of, the library?"),
    ("espeak", "I would like to book a room with, a view of the sea."),
    ("espeak", "I would like to pay for, the parking ticket."),
)
#: (speaker, sentence): statements and questions, each spoken straight through.
COMPLETE = (
    ("piper", "What time does the pharmacy close tonight?"),
    ("piper", "I need to change my delivery address."),
    ("piper", "Please cancel my order from last week."),
    ("piper", "Where is the nearest bus stop?"),
    ("piper", "My phone screen is cracked and needs repair."),
    ("piper", "Can you tell me my account balance?"),
    ("piper", "I would like a window seat please."),
    ("piper", "How much does the premium plan cost?"),
    ("piper", "The heating in my flat stopped working."),
    ("piper", "Is the museum open on Sunday morning?"),
    ("piper", "I want to return these shoes."),
    ("piper", "Thank you very much for your help."),
    ("espeak", "Could you repeat the last number?"),
    ("espeak", "My flight leaves at six tomorrow morning."),
    ("espeak", "Do you deliver to the city centre?"),
    ("espeak", "I have lost the key to my locker."),
)


@dataclass(frozen=True)
class Made:
    """One file written, with what the loader records of it."""

    name: str
    text: str
    speaker: str
    rate: float | None
    duration_ms: int
    pause_start_ms: int | None = None
    pause_end_ms: int | None = None


class Speakers:
    """Piper (loaded once) and espeak-ng, each giving mono float32 at 16 kHz."""

    def __init__(self) -> None:
        import piper

        from duplex_gateway.engine.embedded.tts import default_voice_paths

        self._piper = piper
        self._voice = piper.PiperVoice.load(*default_voice_paths())

    def piper(self, text: str, length_scale: float) -> npt.NDArray[np.float32]:
        config = self._piper.SynthesisConfig(length_scale=length_scale, volume=0.9)
        audio = np.concatenate([chunk.audio_float_array for chunk in self._voice.synthesize(text, config)])
        return _to_16k(audio, self._voice.config.sample_rate)

    @staticmethod
    def espeak(text: str) -> npt.NDArray[np.float32]:
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "say.wav"
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(wav), text], check=True)
            audio, native = sf.read(wav, dtype="float32", always_2d=False)
        return _to_16k(audio, native)


def _to_16k(audio: npt.NDArray[np.floating], native: int) -> npt.NDArray[np.float32]:
    audio = np.asarray(audio, dtype=np.float32)
    if native != RATE:
        audio = np.asarray(soxr.resample(audio, native, RATE, quality="VHQ"), dtype=np.float32)
    return audio


def trim_and_normalise(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``audio`` from its first to its last sample above 0.01, at :data:`PEAK`."""
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    spoken = audio[loud[0] : loud[-1] + 1]
    return (spoken * (PEAK / float(np.max(np.abs(spoken))))).astype(np.float32)


def longest_gap(audio: npt.NDArray[np.float32]) -> tuple[int, int]:
    """The longest quiet run inside the utterance, as (first, end) sample indices."""
    frame = RATE // 100
    frames = audio[: audio.size // frame * frame].reshape(-1, frame)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    quiet = rms < QUIET_FRACTION * float(np.percentile(rms, 90))
    best, run_start = (0, 0), None
    for i, is_quiet in enumerate([*quiet, False]):
        if is_quiet and run_start is None:
            run_start = i
        elif not is_quiet and run_start is not None:
            # Runs touching either end are the utterance's edges, not a pause inside it.
            if run_start > 0 and i < len(quiet) and i - run_start > best[1] - best[0]:
                best = (run_start, i)
            run_start = None
    if best == (0, 0):
        raise ValueError("no pause inside the utterance")
    return best[0] * frame, best[1] * frame


def stretch_pause(
    audio: npt.NDArray[np.float32], gap: tuple[int, int], pause_ms: int
) -> tuple[npt.NDArray[np.float32], int, int]:
    """``audio`` with ``gap`` replaced by ``pause_ms`` of silence; where the silence starts and ends (ms)."""
    first, end = gap
    fade = RATE * FADE_MS // 1000
    head, tail = audio[:first].copy(), audio[end:].copy()
    head[-fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
    tail[:fade] *= np.linspace(0.0, 1.0, fade, dtype=np.float32)
    silence = np.zeros(RATE * pause_ms // 1000, dtype=np.float32)
    out = np.concatenate([head, silence, tail])
    start_ms = round(head.size * 1000 / RATE)
    return out, start_ms, start_ms + pause_ms


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def make(out: Path) -> list[Made]:
    """Write every file into ``out``; what was written."""
    from duplex_gateway.engine.embedded.asr import FinalRecognizer

    speakers, whisper = Speakers(), FinalRecognizer.shared()
    out.mkdir(parents=True, exist_ok=True)
    made: list[Made] = []
    for kind, sentences in (("paused", PAUSED), ("complete", COMPLETE)):
        piper_no = 0
        for index, (speaker, text) in enumerate(sentences):
            scale = LENGTH_SCALES[piper_no % len(LENGTH_SCALES)] if speaker == "piper" else None
            piper_no += speaker == "piper"
            name = f"{kind}_{index:02d}.flac"
            for _attempt in range(5):  # Piper's noise may place the comma's pause badly: speak again
                raw = speakers.piper(text, scale) if scale is not None else speakers.espeak(text)
                audio = trim_and_normalise(raw)
                if kind == "complete":
                    record = Made(name, text, speaker, scale, round(audio.size * 1000 / RATE))
                    break
                before = text.split(",", 1)[0]
                gap = longest_gap(audio)
                heard, expected = _words(whisper.transcribe(audio[: gap[0]])), _words(before)
                # A lone function word at the very end of a clip is often misheard ('and' as 'then'):
                # the same number of words with the one before it right places the pause as well.
                at_comma = bool(heard) and (
                    heard[-1] == expected[-1]
                    or (len(heard) == len(expected) > 1 and heard[-2] == expected[-2])
                )
                if not at_comma:
                    print(f"  {name}: the longest gap follows {heard[-3:]!r}, not the comma; again")
                    continue
                pause_ms = PAUSES_MS[index % len(PAUSES_MS)]
                audio, start_ms, end_ms = stretch_pause(audio, gap, pause_ms)
                record = Made(name, text, speaker, scale, round(audio.size * 1000 / RATE), start_ms, end_ms)
                break
            else:
                raise SystemExit(f"{name}: no take put its longest pause at the comma")
            pcm = np.round(audio * 32767).astype(np.int16)
            sf.write(out / name, pcm, RATE, format="FLAC", subtype="PCM_16")
            made.append(record)
            print(f"  {name}: {record}", file=sys.stderr)
    return made


def main() -> None:
    """Write the files and print the loader's table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/turns"))
    args = parser.parse_args()
    for record in make(args.out):
        rate = "None" if record.rate is None else f"{record.rate}"
        pause = (
            f", pause_ms=({record.pause_start_ms}, {record.pause_end_ms})"
            if record.pause_start_ms is not None
            else ""
        )
        print(
            f"    Turn({record.text!r}, {record.name!r}, speaker={record.speaker!r}, length_scale={rate}, "
            f"duration_ms={record.duration_ms}{pause}),"
        )


if __name__ == "__main__":
    main()
