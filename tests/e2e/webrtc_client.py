"""A WebRTC caller that does what OpenAI's WebRTC guide describes, on aiortc.

It opens a peer connection with one audio track (a microphone playing PCM in real time, 20 ms a
frame, silence between what it is given to say), creates the ``oai-events`` data channel, posts
its SDP offer to ``/v1/realtime/calls`` and sets the answer (:meth:`Caller.connect`; or
:meth:`Caller.offer` and :meth:`Caller.answered` around a POST of the test's own, as the Live
API's is). It records every data channel event and every 20 ms of the remote track, each with
the loop time it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
import av
import httpx2
import numpy as np
import numpy.typing as npt
import soxr
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from duplex_gateway.server.webrtc_jitter import tolerate_loss
from tests.e2e.lossy_relay import LossyRelay
from tests.fixtures import load_speech

RATE = 48_000
FRAME = RATE // 50


def pcm16(samples: npt.NDArray[np.float32], rate: int = 16_000, to: int = RATE) -> bytes:
    """Float samples at ``rate`` as PCM16 mono at ``to`` (the microphone's 48 kHz unless told)."""
    resampled = soxr.resample(samples, rate, to) if rate != to else samples
    return (np.clip(resampled, -1, 1) * 32767).astype("<i2").tobytes()


def speech(rate: int = RATE) -> bytes:
    """The speech fixture (0.5 s of silence, a sentence, 1 s of silence) as PCM16 mono at ``rate``."""
    return pcm16(load_speech(16_000), 16_000, rate)


def offer_loopback() -> None:
    """ICE in this process offers 127.0.0.1 (aioice leaves loopback out by itself)."""
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []


class Microphone(MediaStreamTrack):  # type: ignore[misc]
    """PCM16 mono 48 kHz said in real time, 20 ms a frame; silence when nothing is queued."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = bytearray()
        self._start: float | None = None
        self._pts = 0
        #: Loop time each :meth:`say` started playing (its first frame went out).
        self.said_at: list[float] = []
        self._pending_marks: list[int] = []
        self._sent_bytes = 0

    def say(self, pcm48: bytes) -> None:
        self._pending_marks.append(self._sent_bytes + len(self._queue))
        self._queue.extend(pcm48)

    async def recv(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += FRAME
            delay = self._start + self._pts / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        chunk = bytes(self._queue[: FRAME * 2])
        del self._queue[: FRAME * 2]
        if self._pending_marks and self._sent_bytes >= self._pending_marks[0] and chunk:
            self._pending_marks.pop(0)
            self.said_at.append(loop.time())
        self._sent_bytes += len(chunk)
        chunk += bytes(FRAME * 2 - len(chunk))
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(chunk, "<i2").reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


@dataclass
class Caller:
    """One WebRTC call to a gateway, as a browser makes it."""

    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    pc: RTCPeerConnection = field(default_factory=RTCPeerConnection)
    mic: Microphone = field(default_factory=Microphone)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: (arrival time, PCM16 mono 48 kHz) of every frame of the remote track.
    heard: list[tuple[float, bytes]] = field(default_factory=list)
    location: str | None = None
    #: A relay every packet crosses (its SDP rewrites put it between the two peers).
    relay: LossyRelay | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def connect(self, *, session: dict[str, Any] | None = None) -> None:
        """Call ``/v1/realtime/calls`` (``session``: sent with the offer, as multipart)."""
        offer = await self.offer()
        async with httpx2.AsyncClient(timeout=10) as http:
            if session is None:
                resp = await http.post(
                    f"{self.base_url}/v1/realtime/calls",
                    content=offer,
                    headers={**self.headers, "Content-Type": "application/sdp"},
                )
            else:
                resp = await http.post(
                    f"{self.base_url}/v1/realtime/calls",
                    files={
                        "sdp": (None, offer),
                        "session": (None, json.dumps(session)),
                    },
                    headers=self.headers,
                )
        assert resp.status_code == 201, (resp.status_code, resp.text)
        self.location = resp.headers.get("location")
        await self.answered(resp.text)

    async def offer(self, *, label: str = "oai-events") -> str:
        """The SDP offer to post: the microphone's track and a data channel labelled ``label``."""
        self.pc.addTrack(self.mic)
        channel = self.pc.createDataChannel(label)
        self.channel = channel
        channel.on("open", self._opened.set)

        @channel.on("message")  # type: ignore[untyped-decorator]
        def on_message(message: str) -> None:
            self.events.append((asyncio.get_running_loop().time(), json.loads(message)))

        @self.pc.on("track")  # type: ignore[untyped-decorator]
        def on_track(track: Any) -> None:
            self._tasks.append(asyncio.ensure_future(self._listen(track)))

        await self.pc.setLocalDescription(await self.pc.createOffer())
        # A browser's jitter buffer hides a lost packet; aiortc's own throws good ones away for it.
        for transceiver in self.pc.getTransceivers():
            tolerate_loss(transceiver.receiver)
        offer: str = self.pc.localDescription.sdp
        return offer if self.relay is None else self.relay.offer(offer)

    async def answered(self, sdp: str) -> None:
        """Set the gateway's SDP answer and wait for the data channel to open."""
        answer = sdp if self.relay is None else self.relay.answer(sdp)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        async with asyncio.timeout(10):
            await self._opened.wait()

    async def _listen(self, track: Any) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
        loop = asyncio.get_running_loop()
        heard_to: int | None = None  # the track's clock (48 kHz samples) where what was heard ends
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if frame.pts is not None and heard_to is not None and frame.pts > heard_to:
                # A lost packet: a browser plays something in its place; silence is as long.
                self.heard.append((loop.time(), bytes((frame.pts - heard_to) * 2)))
            if frame.pts is not None:
                heard_to = frame.pts + frame.samples
            for out in resampler.resample(frame):
                self.heard.append((loop.time(), out.to_ndarray().astype("<i2").tobytes()))

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(
        self, kind: str, *, after: int = 0, timeout: float = 15.0
    ) -> tuple[float, dict[str, Any]]:
        """The first event of ``kind`` at index ``after`` or later."""
        async with asyncio.timeout(timeout):
            while True:
                for at, event in self.events[after:]:
                    if event.get("type") == kind:
                        return at, event
                await asyncio.sleep(0.01)

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.events]

    def heard_between(self, start: float, end: float) -> bytes:
        return b"".join(pcm for at, pcm in self.heard if start <= at < end)

    def loud_frames(self, start: float, end: float, threshold: int = 300) -> list[float]:
        """Arrival times of remote frames between ``start`` and ``end`` that carry sound."""
        return [
            at
            for at, pcm in self.heard
            if start <= at < end and np.abs(np.frombuffer(pcm, "<i2")).max(initial=0) > threshold
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await self.pc.close()
