"""The caller's turn tracker: input held until a commit, the ring before speech, the idle timer."""

from __future__ import annotations

import itertools

from duplex_gateway.engine import port
from duplex_gateway.session.conversation import Conversation
from duplex_gateway.session.engine_calls import AppendAudio
from duplex_gateway.session.turns import TurnTracker
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.session_config import TurnDetection

JPEG = "/9j/4AAQ"


def tracker(turn_detection: TurnDetection | None = None) -> tuple[TurnTracker, Conversation]:
    counter = itertools.count(1)

    def new_id(prefix: str) -> str:
        return f"{prefix}_{next(counter)}"

    conversation = Conversation(new_id)
    caps = port.EngineCapabilities(name="test", input_rate=24_000, output_rate=24_000)
    return TurnTracker(conversation, new_id, turn_detection, engine=caps), conversation


def chunk(ms: int) -> bytes:
    return bytes(24 * ms * 2)


def take(turns: TurnTracker, ms: int, frames: tuple[str, ...] = ()) -> list[AppendAudio]:
    return turns.take_audio(chunk(ms), ms, is_speech=None, hints=None, video_frames=frames)


def test_without_a_detector_the_audio_goes_straight_to_the_engine_and_into_the_turn() -> None:
    turns, conversation = tracker()
    assert not turns.has_input
    assert take(turns, 20) == [AppendAudio(pcm=chunk(20))]
    assert turns.has_input and turns.input_ms == 20 and not turns.speaking
    committed = turns.commit("item_turn")
    assert [type(event) for event in committed] == [
        ev.InputAudioCommitted,
        ev.ConversationItemAdded,
        ev.ConversationItemDone,
    ]
    assert conversation.items["item_turn"].produced_ms == 20 and not turns.has_input


def test_before_speech_the_ring_holds_the_audio_and_the_turn_starts_at_its_padding() -> None:
    turns, _ = tracker(TurnDetection(prefix_padding_ms=100))
    for _ in range(10):
        assert take(turns, 100) == []  # nobody is speaking: nothing goes to the engine
    assert not turns.has_input
    turns.start_speech("item_1")
    released = turns.release_ring(audio_start_ms=800)
    assert len(released) == 2 and turns.speaking and turns.speech_item_id == "item_1"
    assert take(turns, 20) == [AppendAudio(pcm=chunk(20))]  # live from now on
    assert turns.take_speech_item() == "item_1" and not turns.speaking


def test_camera_frames_wait_for_audio_and_a_clear_drops_them_with_the_input() -> None:
    turns, _ = tracker()
    assert turns.take_audio(b"", 0.0, is_speech=None, hints=None, video_frames=(JPEG,)) == []
    assert take(turns, 20) == [AppendAudio(pcm=chunk(20), video_frames=(JPEG,))]
    take(turns, 0, (JPEG,))
    turns.text_appended()
    turns.drop_input()
    assert not turns.has_input and take(turns, 20) == [AppendAudio(pcm=chunk(20))]


def test_the_idle_timer_counts_from_when_the_reply_has_played() -> None:
    turns, _ = tracker(TurnDetection(idle_timeout_ms=2_000))
    turns.arm_idle(first_audio_at=10.0, audio_ms=3_000, now=11.0)
    assert turns.idle_deadline == 15.0 and turns.idle_from_ms == 2_000
    turns.start_speech("item_1")  # the caller spoke up first
    assert turns.idle_deadline is None
    untimed, _ = tracker(TurnDetection())
    untimed.arm_idle(first_audio_at=None, audio_ms=0, now=1.0)
    assert untimed.idle_deadline is None


def test_a_turn_the_engine_found_is_committed_under_the_callers_item() -> None:
    turns, conversation = tracker()
    turns.start_speech("item_1")
    stopped = turns.stopped_by_engine(port.EngineSpeechStopped(item_id="eng_7", audio_end_ms=900))
    assert stopped == [ev.SpeechStopped(audio_end_ms=900, item_id="item_1")] and not turns.speaking
    assert turns.stopped_item_id == "item_1"
    committed = turns.committed_by_engine(port.EngineTurnCommitted(item_id="eng_7"))
    assert isinstance(committed[0], ev.InputAudioCommitted) and committed[0].item_id == "item_1"
    assert turns.stopped_item_id is None and conversation.caller_item("eng_7") == "item_1"
    assert turns.committed_by_engine(port.EngineTurnCommitted(item_id="eng_7")) == []  # once only


def test_the_callers_words_come_as_stable_deltas_then_the_final_transcript() -> None:
    turns, conversation = tracker()
    turns.commit("item_1")
    hear = [
        turns.caller_words(
            port.EngineInputTranscript(item_id="item_1", text=text, final=False), tell_client=True
        )
        for text in ("hello", "hello there", "hello there friend")
    ]
    assert [[d.delta for d in deltas if isinstance(d, ev.InputTranscriptionDelta)] for deltas in hear] == [
        [],
        ["hello"],
        [" there"],
    ]
    final = port.EngineInputTranscript(item_id="item_1", text="hello there friend", final=True)
    assert turns.caller_words(final, tell_client=False) == []
    assert conversation.items["item_1"].item.transcript == "hello there friend"
