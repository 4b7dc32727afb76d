"""A simulated caller on WebRTC: the same turns as :class:`~duplex_gateway.bench.callers.SimulatedCaller`,
its microphone on an Opus track and its events on the ``oai-events`` data channel.

It posts its SDP offer to ``POST /v1/realtime/calls`` (aiortc, the ``webrtc`` extra), sends the
caller's recording on its track in real time (the sending task hands each 20 ms frame to the
track when it is due, so the track keeps the same clock a WebSocket caller's sends do) and
reads the Realtime events from the data channel. The recording is encoded to Opus once for all
callers, and the reply's packets are counted, never decoded: fifty callers encoding and decoding
on the cores the server runs on would measure the load generator, not the gateway.

Reply audio comes on the remote track, not as deltas. *First audio* is taken at the server's
``output_audio_buffer.started``, which the gateway sends with the reply's first audio for the
track (the audio itself follows within the track's 20 ms tick). A cut-off is timed, as on the WebSocket, from the cancel to the reply's ``response.done``;
stale audio after it cannot be told apart on a track and is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from typing import Any

from duplex_gateway.bench.audio import FRAME_MS, CallerAudio
from duplex_gateway.bench.callers import CallerPlan, SimulatedCaller

__all__ = ["WebRtcCaller", "call_url"]

#: The microphone frames waiting for the track (the sender keeps it at one or two).
_MIC_QUEUE = 8


def call_url(ws_url: str) -> str:
    """``POST /v1/realtime/calls`` of the gateway whose Realtime WebSocket is ``ws_url``."""
    base = ws_url.split("/v1/", 1)[0]
    return base.replace("ws://", "http://", 1).replace("wss://", "https://", 1) + "/v1/realtime/calls"


#: Opus at 48 kHz, as browsers send it.
_RATE = 48_000
_FRAME_SAMPLES = _RATE * FRAME_MS // 1000
#: Each recording's frames as Opus packets, encoded once for every caller of a run.
_ENCODED: dict[int, tuple[tuple[bytes, ...], bytes]] = {}


def opus_frames(audio: CallerAudio) -> tuple[tuple[bytes, ...], bytes]:
    """``audio``'s 20 ms frames as Opus packets (one encoder over the whole recording), and a silent one.

    The callers send these as they are: encoding fifty microphones on the cores the server runs
    on would measure the load generator, not the gateway.
    """
    cached = _ENCODED.get(id(audio))
    if cached is not None:
        return cached
    import av
    import numpy as np

    if audio.rate != _RATE:
        raise ValueError(f"a WebRTC caller's recording is at {_RATE} Hz, not {audio.rate}")

    def encode(frames: tuple[bytes, ...]) -> list[bytes]:
        codec = av.CodecContext.create("libopus", "w")
        codec.bit_rate = 32_000
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = _RATE
        codec.time_base = fractions.Fraction(1, _RATE)
        packets: list[bytes] = []
        for index, pcm in enumerate(frames):
            frame = av.AudioFrame.from_ndarray(
                np.frombuffer(pcm, "<i2").reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate = _RATE
            frame.pts = index * _FRAME_SAMPLES
            frame.time_base = codec.time_base
            packets.extend(bytes(p) for p in codec.encode(frame))
        packets.extend(bytes(p) for p in codec.encode(None))
        return packets

    speech = encode(audio.pcm)
    silence = encode((bytes(_FRAME_SAMPLES * 2),) * 3)
    cached = (tuple(speech[: len(audio.pcm)]), silence[1])
    _ENCODED[id(audio)] = cached
    return cached


def _microphone() -> Any:
    """A track that sends the Opus packets put in its queue, each when the caller sends it."""
    import av
    from aiortc.mediastreams import MediaStreamTrack

    time_base = fractions.Fraction(1, _RATE)

    class Microphone(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.frames: asyncio.Queue[bytes] = asyncio.Queue(_MIC_QUEUE)
            self._pts = 0

        async def recv(self) -> Any:
            packet = av.Packet(await self.frames.get())
            packet.pts = self._pts
            packet.time_base = time_base
            self._pts += _FRAME_SAMPLES
            return packet

    return Microphone()


class _Discard:
    """A receiver's jitter buffer that counts the reply's packets and decodes none of them."""

    capacity = 16

    def __init__(self) -> None:
        self.packets = 0

    def add(self, packet: Any) -> tuple[bool, None]:
        self.packets += 1
        return False, None


class WebRtcCaller(SimulatedCaller):
    """One caller over WebRTC; the turns, barge-ins and statistics are the WebSocket caller's."""

    def __init__(self, plan: CallerPlan, **kwargs: Any) -> None:
        super().__init__(plan, **kwargs)
        self._pc: Any = None
        self._channel: Any = None
        self._mic: Any = None
        self._opus: tuple[tuple[bytes, ...], bytes] = ((), b"")

    async def connect(self) -> None:
        """Make the call: offer, answer, the data channel open, the session configured."""
        import httpx2
        from aiortc import RTCPeerConnection, RTCSessionDescription

        plan = self.plan
        loop = asyncio.get_running_loop()
        self._pc = pc = RTCPeerConnection()
        self._opus = opus_frames(plan.audio)
        self._mic = _microphone()
        pc.addTrack(self._mic)
        channel = pc.createDataChannel("oai-events")
        self._channel = channel
        opened = asyncio.Event()
        channel.on("open", opened.set)
        self._handshake = loop.create_future()

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            event = json.loads(message)
            if isinstance(event, dict):
                self._on_event(event, time.perf_counter())

        @channel.on("close")
        def on_close() -> None:
            if not self._handshake_done():
                self._fail_handshake("the data channel closed")

        await pc.setLocalDescription(await pc.createOffer())
        for transceiver in pc.getTransceivers():
            # The reply audio is thrown away undecoded (first audio is the server's event).
            receiver: Any = transceiver.receiver
            receiver._RTCRtpReceiver__jitter_buffer = _Discard()
        async with httpx2.AsyncClient(timeout=plan.connect_timeout_s) as http:
            resp = await http.post(
                call_url(plan.url),
                content=pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
        if resp.status_code != 201:
            raise ConnectionError(f"the call was refused: {resp.status_code} {resp.text[:200]}")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=resp.text, type="answer"))
        await asyncio.wait_for(opened.wait(), plan.connect_timeout_s)
        await self._send({"type": "session.update", "session": self._session()})
        await asyncio.wait_for(asyncio.shield(self._handshake), plan.connect_timeout_s)

    def _handshake_done(self) -> bool:
        return self._handshake is None or self._handshake.done()

    def _fail_handshake(self, why: str) -> None:
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(ConnectionError(why))

    def _on_event(self, event: dict[str, Any], now: float) -> None:
        if event.get("type") == "output_audio_buffer.started":
            # The reply's first audio goes on the track with this event: first audio, for the stats.
            self._on_audio(str(event.get("response_id")), 0, now)
            return
        super()._on_event(event, now)

    async def close(self) -> None:
        if self._pc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pc.close(), 5)

    async def _send_frame(self, index: int | None) -> None:
        frames, silence = self._opus
        packet = frames[index] if index is not None else silence
        try:
            self._mic.frames.put_nowait(packet)
        except asyncio.QueueFull:
            # The track fell behind the caller's clock (the machine is overloaded): that is a late frame.
            self.stats.late_frames += 1
            await asyncio.wait_for(self._mic.frames.put(packet), FRAME_MS / 1000 * _MIC_QUEUE)

    async def _send(self, event: dict[str, Any]) -> None:
        channel = self._channel
        if channel is None or channel.readyState != "open":
            raise ConnectionError("the data channel is closed")
        channel.send(json.dumps(event))
