"""Make the overlap test set in ``tests/fixtures/overlaps/`` (run once; the FLAC files are committed).

Caller speech that starts while a reply is playing, of two kinds, spoken by the embedded
engine's Piper voice (joe, medium) at three speaking rates and by espeak-ng as a second,
robotic speaker:

* ``backchannel_NN.flac``: an acknowledgement a listener says over a speaker ("yeah",
  "uh huh", "mm hmm", "got it"), 0.3-0.6 s. The reply must survive it.
* ``interruption_NN.flac``: a caller taking the turn ("Wait, that's not what I asked."),
  1.2-2.0 s. Most open with a word and a comma, as people do, so the voice pauses after that
  first word (Piper's comma pause is 0.2-0.5 s): the reply must still end soon after the first
  word, not after the pause.

Every file is mono 16 kHz PCM16, trimmed at |x| > 0.01 and normalised to 0.7 peak, with no
silence around it (the turn set's helpers, ``scripts/make_turn_fixtures.py``). Piper's synthesis
is not deterministic, so the audio is committed and this script only documents how it was made:
each take is spoken again (up to five times) until its length is inside its kind's range. The
script prints each clip's duration, the longest quiet run inside it and what Whisper hears, then
the loader's table (``tests/fixtures/overlap_set.py``).

Usage: ``python scripts/make_overlap_fixtures.py [--out tests/fixtures/overlaps]`` (needs the
embedded extra and the ``espeak-ng`` program).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile as sf

# Run as a script, this file's folder is on the path: the turn set's synthesis and trimming are reused.
from make_turn_fixtures import RATE, Speakers, longest_gap, trim_and_normalise

#: Piper's length scale per clip, in turn: faster, normal, slower.
LENGTH_SCALES = (0.85, 1.0, 1.2)
#: Each kind's range of lengths (ms), the issue's: a backchannel is short, an interruption a sentence.
BACKCHANNEL_MS = (300, 600)
INTERRUPTION_MS = (1200, 2000)
TAKES = 5

#: (speaker, words). Each Piper word was picked for a rate at which it falls in 0.3-0.6 s ("right"
#: and "got it" are shorter than 0.3 s at every Piper rate, so espeak-ng says them).
BACKCHANNELS = (
    ("piper", "Okay."),
    ("piper", "Uh huh."),
    ("piper", "Yeah."),
    ("piper", "Mm hmm."),
    ("piper", "I see."),
    ("piper", "Sure."),
    ("piper", "Gotcha."),
    ("piper", "Yes."),
    ("piper", "Cool."),
    ("piper", "Sure thing."),
    ("piper", "Totally."),
    ("piper", "Fine."),
    ("espeak", "Right."),
    ("espeak", "Got it."),
    ("espeak", "Uh huh."),
    ("espeak", "I see."),
)
#: (speaker, sentence): the comma after an opening word is where a caller catches breath.
INTERRUPTIONS = (
    ("piper", "No, stop, I need the other one."),
    ("piper", "Wait, that's not what I asked."),
    ("piper", "Stop, that's not it."),
    ("piper", "Hold on, that's the wrong account."),
    ("piper", "Actually I want to cancel it."),
    ("piper", "Sorry, can I stop you there?"),
    ("piper", "Excuse me, that's not right."),
    ("piper", "Hang on, which address was that?"),
    ("espeak", "No, I meant the other one."),
    ("espeak", "Sorry, that's the wrong one."),
)


@dataclass(frozen=True)
class Made:
    """One file written, with what the loader records of it."""

    kind: str
    name: str
    text: str
    speaker: str
    rate: float | None
    duration_ms: int
    #: The longest quiet run inside the clip (ms from its start), None with none.
    quiet_ms: tuple[int, int] | None
    heard: str


def inner_quiet(audio: npt.NDArray[np.float32]) -> tuple[int, int] | None:
    """The longest quiet run inside ``audio`` in ms, or None (one unbroken sound)."""
    try:
        first, end = longest_gap(audio)
    except ValueError:
        return None
    return round(first * 1000 / RATE), round(end * 1000 / RATE)


def make(out: Path) -> list[Made]:
    """Write every file into ``out``; what was written."""
    from duplex_gateway.engine.embedded.asr import FinalRecognizer

    speakers, whisper = Speakers(), FinalRecognizer.shared()
    out.mkdir(parents=True, exist_ok=True)
    made: list[Made] = []
    for kind, clips, (low, high) in (
        ("backchannel", BACKCHANNELS, BACKCHANNEL_MS),
        ("interruption", INTERRUPTIONS, INTERRUPTION_MS),
    ):
        piper_no = 0
        for index, (speaker, text) in enumerate(clips):
            scale = LENGTH_SCALES[piper_no % len(LENGTH_SCALES)] if speaker == "piper" else None
            piper_no += speaker == "piper"
            name = f"{kind}_{index:02d}.flac"
            for _take in range(TAKES):
                raw = speakers.piper(text, scale) if scale is not None else speakers.espeak(text)
                audio = trim_and_normalise(raw)
                duration_ms = round(audio.size * 1000 / RATE)
                if low <= duration_ms <= high:
                    break
                print(f"  {name}: {duration_ms} ms, outside {low}-{high}; again", file=sys.stderr)
            else:
                raise SystemExit(f"{name}: no take of {text!r} lasted {low}-{high} ms")
            pcm = np.round(audio * 32767).astype(np.int16)
            sf.write(out / name, pcm, RATE, format="FLAC", subtype="PCM_16")
            record = Made(
                kind, name, text, speaker, scale, duration_ms, inner_quiet(audio), whisper.transcribe(audio)
            )
            made.append(record)
            quiet = "-" if record.quiet_ms is None else f"{record.quiet_ms[1] - record.quiet_ms[0]} ms quiet"
            print(f"  {name}: {duration_ms} ms, {quiet}, Whisper hears {record.heard!r}", file=sys.stderr)
    return made


def main() -> None:
    """Write the files and print the loader's table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/overlaps"))
    args = parser.parse_args()
    for record in make(args.out):
        rate = "None" if record.rate is None else f"{record.rate}"
        quiet = "" if record.quiet_ms is None else f", quiet_ms={record.quiet_ms}"
        print(
            f"    Overlap({record.text!r}, {record.name!r}, speaker={record.speaker!r}, "
            f"length_scale={rate}, duration_ms={record.duration_ms}{quiet}),"
        )


if __name__ == "__main__":
    main()
