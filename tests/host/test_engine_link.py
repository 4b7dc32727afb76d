"""How the engine link merges caller audio that waited for a busy engine."""

from __future__ import annotations

from collections import deque

from duplex_gateway.host.engine_link import _merge
from duplex_gateway.session.machine import AppendAudio, ClearInput, EngineCall

FRAME = "/9j/4AAQ"


def test_waiting_audio_goes_in_as_one_append_in_order() -> None:
    calls: deque[EngineCall] = deque([AppendAudio(pcm=b"b"), AppendAudio(pcm=b"c"), ClearInput()])
    assert _merge(AppendAudio(pcm=b"a"), calls) == AppendAudio(pcm=b"abc")
    assert list(calls) == [ClearInput()]


def test_camera_frames_ride_the_end_of_the_audio_they_came_with() -> None:
    # A frame closes a merge: it stays at the end of its own audio, never moves onto later audio.
    calls: deque[EngineCall] = deque(
        [AppendAudio(pcm=b"b", video_frames=(FRAME,)), AppendAudio(pcm=b"c"), AppendAudio(pcm=b"d")]
    )
    assert _merge(AppendAudio(pcm=b"a"), calls) == AppendAudio(pcm=b"ab", video_frames=(FRAME,))
    assert _merge(calls.popleft(), calls) == AppendAudio(pcm=b"cd")
    # An append that carries frames takes no later audio with it.
    later: deque[EngineCall] = deque([AppendAudio(pcm=b"f")])
    assert _merge(AppendAudio(pcm=b"e", video_frames=(FRAME,)), later) == AppendAudio(
        pcm=b"e", video_frames=(FRAME,)
    )
    assert list(later) == [AppendAudio(pcm=b"f")]
