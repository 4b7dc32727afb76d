"""The carrier's playout buffer, as the gateway sees it: what was sent, what was played.

Reply audio is handed to the carrier at real time plus a small lead, in pieces of the
carrier's framing, each followed by a mark. The marks the carrier echoes are the
playback cursor. A clear starts a new epoch: marks of an older epoch are ignored,
because some carriers echo every pending mark when they drop their buffer,
and those marks say "discarded", not "played". Carriers without marks are paced at
real time and the clock is the cursor.

Pure: time arrives as arguments.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from duplex_gateway.telephony.carrier import Framing
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding

__all__ = ["Heard", "Outgoing", "Playout", "Truncation"]

#: A byte of silence in each encoding (PCM is all zeros).
_SILENCE = {Encoding.G711_ULAW: b"\xff", Encoding.G711_ALAW: b"\xd5"}


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A piece of reply audio to send now, the mark to send after it (None: no marks), and
    when the carrier will have played it (the clock of :meth:`Playout.due`)."""

    audio: bytes
    mark: str | None
    ends_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Heard:
    """The caller has heard ``played_ms`` of reply ``response_id`` (its item ``item_id``)."""

    response_id: str
    item_id: str
    played_ms: int


@dataclass(frozen=True, slots=True)
class Truncation:
    """A clear cut reply ``response_id`` short: the caller heard ``audio_end_ms`` of it."""

    response_id: str
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class _Sent:
    """A piece handed to the carrier and not known to be played yet."""

    response_id: str
    item_id: str
    audio: bytes
    mark: str | None
    ends_at: float


@dataclass(slots=True)
class _Piece:
    response_id: str
    item_id: str
    audio: bytearray = field(default_factory=bytearray)
    finished: bool = False


class Playout:
    """Paces one call's reply audio and tracks what the caller has heard of it."""

    def __init__(self, fmt: AudioFormat, framing: Framing, *, lead_ms: float, marks: bool) -> None:
        self.format = fmt
        self.marks = marks
        self._lead_s = lead_ms / 1000.0
        width = fmt.encoding.bytes_per_sample
        multiple = max(framing.multiple, width)
        chunk = max(fmt.byte_count(framing.chunk_ms), framing.min_bytes, multiple)
        self._chunk = chunk - chunk % multiple
        self._min = framing.min_bytes
        self._multiple = multiple
        self._silence = _SILENCE.get(fmt.encoding, b"\x00")
        self.epoch = 0
        #: The carrier asked for no more audio for now (flow control).
        self.paused = False
        #: The session holds the reply while caller speech over it is judged: nothing is sent.
        self.holding = False
        #: What the carrier has and may not have played yet, in order (re-queued by a hold).
        self._unplayed: deque[_Sent] = deque()
        #: Replies whose audio is all queued (a re-queued tail may then be short).
        self._finished: set[str] = set()
        self._queue: deque[_Piece] = deque()
        #: When the carrier will have played everything sent so far (None: nothing is playing).
        self._ends_at: float | None = None
        self._names = itertools.count(1)
        #: Marks sent and not echoed yet: name -> (response, item, that item's audio sent up to it).
        self._pending: OrderedDict[str, tuple[str, str, int]] = OrderedDict()
        #: The reply whose audio went out last, how much of it was sent, how much was heard.
        self._current: tuple[str, str] | None = None
        self._sent_ms = 0.0
        self._heard_ms = 0

    # -- reply audio in -------------------------------------------------------------------

    def queue(self, response_id: str, item_id: str, audio: bytes) -> None:
        """Reply audio (in the call's output format) to play after what is queued."""
        if self._queue and self._queue[-1].response_id == response_id and not self._queue[-1].finished:
            self._queue[-1].audio += audio
        else:
            self._queue.append(_Piece(response_id, item_id, bytearray(audio)))

    def finish(self, response_id: str) -> None:
        """All of reply ``response_id``'s audio is queued: its last piece may be short."""
        if len(self._finished) >= 16:
            self._finished.clear()  # only the reply playing matters: a hold re-queues no other
        self._finished.add(response_id)
        for piece in self._queue:
            if piece.response_id == response_id:
                piece.finished = True
        while self._queue and not self._queue[0].audio and self._queue[0].finished:
            self._queue.popleft()

    # -- pacing ------------------------------------------------------------------------------

    def due(self, now: float) -> tuple[list[Outgoing], float | None]:
        """What to send at ``now``, and when to ask again (None: when more audio is queued)."""
        out: list[Outgoing] = []
        while self._queue and not self.paused and not self.holding:
            # (a microsecond of slack: at exactly the wake-up time, float rounding must not defer it again)
            if self._ends_at is not None and self._ends_at - now > self._lead_s + 1e-6:
                return out, self._ends_at - self._lead_s
            piece = self._queue[0]
            if len(piece.audio) < self._chunk and not piece.finished:
                return out, None  # wait for the rest of the piece
            take = bytes(piece.audio[: self._chunk])
            del piece.audio[: len(take)]
            if not piece.audio and piece.finished:
                self._queue.popleft()
            if not take:
                continue
            out.append(self._send(piece, self._padded(take), now))
        return out, None

    def _padded(self, audio: bytes) -> bytes:
        size = max(len(audio), self._min)
        size += -size % self._multiple
        return audio + self._silence * (size - len(audio))

    def _send(self, piece: _Piece, audio: bytes, now: float) -> Outgoing:
        key = (piece.response_id, piece.item_id)
        if self._current != key:
            self._current, self._sent_ms, self._heard_ms = key, 0.0, 0
        duration_ms = self.format.duration_ms(len(audio))
        self._sent_ms += duration_ms
        start = now if self._ends_at is None or self._ends_at < now else self._ends_at
        self._ends_at = start + duration_ms / 1000.0
        name = None
        if self.marks:
            name = f"{self.epoch}.{next(self._names)}"
            self._pending[name] = (piece.response_id, piece.item_id, round(self._sent_ms))
        else:
            while self._unplayed and self._unplayed[0].ends_at <= now:
                self._unplayed.popleft()  # the clock says the carrier played it
        self._unplayed.append(_Sent(piece.response_id, piece.item_id, audio, name, self._ends_at))
        return Outgoing(audio, name, self._ends_at)

    # -- a hold: the reply stops where the caller is, and goes on from there ------------------------

    def hold(self, now: float, *, reclaim: bool = True) -> bool:
        """Stop the reply where the caller is: what the carrier has not played comes back to the queue.

        Starts a new epoch (the carrier's buffer is to be cleared); True when the carrier had
        audio to clear. :meth:`release` sends on from where the caller was.

        ``reclaim=False``: the carrier plays whatever it was sent and has no buffer to clear
        (Asterisk's AudioSocket), so what went out stays out (taken back, it would be heard
        twice) and only sending stops; the caller hears the lead already sent.
        """
        self.holding = True
        if not reclaim:
            return False
        if self.marks:
            unplayed = list(self._unplayed)
        else:
            unplayed = [sent for sent in self._unplayed if sent.ends_at > now]
            if unplayed:  # the first is partly played: what is left of it comes back
                first = unplayed[0]
                left_ms = (first.ends_at - now) * 1000.0
                keep = min(len(first.audio), self.format.byte_count(left_ms))
                keep -= keep % self.format.encoding.bytes_per_sample
                unplayed[0] = _Sent(
                    first.response_id,
                    first.item_id,
                    first.audio[-keep:] if keep else b"",
                    first.mark,
                    first.ends_at,
                )
        self._unplayed.clear()
        had = bool(unplayed) or bool(self._pending)
        self.epoch += 1
        self._pending.clear()
        self._ends_at = None
        for sent in reversed(unplayed):
            if not sent.audio:
                continue
            self._sent_ms -= self.format.duration_ms(len(sent.audio))
            head = self._queue[0] if self._queue else None
            if head is not None and (head.response_id, head.item_id) == (sent.response_id, sent.item_id):
                head.audio[:0] = sent.audio
            else:
                finished = sent.response_id in self._finished
                self._queue.appendleft(
                    _Piece(sent.response_id, sent.item_id, bytearray(sent.audio), finished)
                )
        self._sent_ms = max(self._sent_ms, 0.0)
        return had

    def release(self) -> None:
        """The hold is over: the reply goes on from where it was held (:meth:`due` sends it)."""
        self.holding = False

    # -- what the caller heard -----------------------------------------------------------------

    def played(self, name: str) -> Heard | None:
        """The carrier echoed mark ``name``: what the caller has heard now (None: a stale or unknown mark)."""
        if name not in self._pending:
            return None  # an older epoch's (echoed because of a clear), or not ours
        while self._pending:
            key, (response_id, item_id, end_ms) = self._pending.popitem(last=False)
            while self._unplayed and self._unplayed[0].mark is not None:
                if self._unplayed.popleft().mark == key:
                    break  # played up to this mark
            if key == name:
                if self._current == (response_id, item_id):
                    self._heard_ms = max(self._heard_ms, end_ms)
                return Heard(response_id, item_id, end_ms)
        return None

    def heard_ms(self, now: float) -> int:
        """How much of the current reply the caller has heard (marks, or the clock without them)."""
        if self.marks:
            return self._heard_ms
        unplayed = max(0.0, (self._ends_at or now) - now) * 1000.0
        return max(0, round(self._sent_ms - unplayed))

    def pending(self, now: float) -> bool:
        """Reply audio is queued here, or sent and not played yet."""
        if self._queue and any(piece.audio for piece in self._queue):
            return True
        if self.marks:
            return bool(self._pending)
        return self._ends_at is not None and self._ends_at > now

    def clear(self, now: float) -> Truncation | None:
        """Drop what is queued and start a new epoch; the truncation of the reply cut short, if any."""
        cut: Truncation | None = None
        if self._current is not None and self.pending(now):
            response_id, item_id = self._current
            cut = Truncation(response_id, item_id, self.heard_ms(now))
        self.epoch += 1
        self._queue.clear()
        self._pending.clear()
        self._unplayed.clear()
        self.holding = False
        self._ends_at = None
        self._current, self._sent_ms, self._heard_ms = None, 0.0, 0
        return cut
