"""``semantic_vad`` in the session: a short silence asks the end-of-turn model, whose verdict ends the turn or not."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from duplex_gateway.audio.turn_detector import SEMANTIC_EAGERNESS
from duplex_gateway.engine import port
from duplex_gateway.session.engine_calls import AssessTurn, CallerPaused, CommitInput, Output, ReportLatency
from duplex_gateway.session.machine import Session
from duplex_gateway.session.settings import Handshake
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetection, TurnDetectionMode

CAPS = port.EngineCapabilities(name="test", input_rate=24_000, output_rate=24_000)


def _session(eagerness: str = "auto", caps: port.EngineCapabilities = CAPS) -> Session:
    td = TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD, eagerness=eagerness, prefix_padding_ms=100)
    return Session(
        session_id="s",
        capabilities=caps,
        defaults=SessionConfig(turn_detection=td),
        handshake=Handshake.REALTIME,
    )


def _feed(session: Session, start_ms: int, ms: int, prob: float, now: float = 0.0) -> Sequence[Output]:
    windows = [(end, prob) for end in range(start_ms + 32, start_ms + ms + 1, 32)]
    return session.input_processed(bytes(24 * ms * 2), float(ms), windows, now=now)


def _spoken(session: Session) -> AssessTurn:
    """One second of speech, then the silence that makes a candidate: the judgement asked for."""
    _feed(session, 0, 320, 0.01)
    assert any(isinstance(o, ev.SpeechStarted) for o in _feed(session, 320, 1024, 0.95))
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    return assess


def test_a_candidate_asks_the_model_with_the_eagerness_threshold() -> None:
    session = _session("high")
    assess = _spoken(session)
    assert assess.threshold == SEMANTIC_EAGERNESS["high"].threshold
    assert assess.candidate.speech_end_ms == 1344


def test_a_verdict_of_done_ends_the_turn_and_asks_for_the_reply() -> None:
    session = _session()
    assess = _spoken(session)
    out = session.turn_assessed(assess, 0.93, model_ms=40.0)
    stopped = [o for o in out if isinstance(o, ev.SpeechStopped)]
    assert [s.audio_end_ms for s in stopped] == [assess.candidate.audio_end_ms]
    (commit,) = [o for o in out if isinstance(o, CommitInput)]
    assert commit.response_id is not None
    assert any(isinstance(o, ev.ResponseCreated) for o in out)


def test_a_verdict_of_not_done_waits_for_more_speech() -> None:
    session = _session()
    assess = _spoken(session)
    assert session.turn_assessed(assess, 0.2) == []
    later = _feed(session, 1664, 320, 0.01)
    assert not any(isinstance(o, ev.SpeechStopped) for o in later)
    more = _feed(session, 1984, 640, 0.95)  # the caller goes on: the same turn
    assert not any(isinstance(o, ev.SpeechStarted | ev.SpeechStopped) for o in more)


def test_a_verdict_that_comes_after_the_caller_spoke_again_is_void() -> None:
    session = _session()
    assess = _spoken(session)
    _feed(session, 1664, 320, 0.95)
    assert session.turn_assessed(assess, 0.99) == []


def test_a_model_that_failed_ends_the_turn_as_the_silence_would() -> None:
    session = _session()
    assess = _spoken(session)
    out = session.turn_assessed(assess, None)
    assert any(isinstance(o, ev.SpeechStopped) for o in out)


def test_the_longest_wait_ends_a_turn_the_model_never_calls_done() -> None:
    session = _session("high")
    assess = _spoken(session)
    assert session.turn_assessed(assess, 0.0) == []
    wait = SEMANTIC_EAGERNESS["high"].max_wait_ms
    out = _feed(session, 1664, wait, 0.01)
    assert len([o for o in out if isinstance(o, ev.SpeechStopped)]) == 1


def test_the_latency_report_names_the_wait_and_the_models_time() -> None:
    session = _session()
    assess = _spoken(session)
    out = session.turn_assessed(assess, 0.9, model_ms=40.0)
    (created,) = [o for o in out if isinstance(o, ev.ResponseCreated)]
    session.engine_event(port.EngineResponseStarted(response_id=created.response_id), now=1.0)
    first = session.engine_event(port.EngineAudio(response_id=created.response_id, pcm=bytes(480)), now=1.2)
    (report,) = [o for o in first if isinstance(o, ReportLatency)]
    stages = dict(report.latency.stages)
    assert stages["turn_model"] == 40.0
    assert stages["turn_detection"] >= 0.0


def test_words_that_cannot_end_a_sentence_keep_the_turn_going_whatever_the_audio_says() -> None:
    session = _session()
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    session.engine_event(
        port.EngineInputTranscript(item_id="", text="book a table for", final=False), now=0.5
    )
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    assert session.turn_assessed(assess, 0.95) == []  # "for": the caller is not done
    # Past the words' veto only the audio decides: the next judgement of "done" ends the turn.
    later = [o for o in _feed(session, 1664, 2_000, 0.01) if isinstance(o, AssessTurn)]
    assert later
    out = session.turn_assessed(later[-1], 0.95)
    assert any(isinstance(o, ev.SpeechStopped) for o in out)


def test_words_that_end_a_sentence_leave_the_verdict_to_the_audio() -> None:
    session = _session()
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    session.engine_event(
        port.EngineInputTranscript(item_id="", text="book a table for four", final=False), now=0.5
    )
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    assert any(isinstance(o, ev.SpeechStopped) for o in session.turn_assessed(assess, 0.95))


def _vetoed(session: Session, words: str) -> AssessTurn:
    """Speech whose words so far end on ``words``, and a judgement of done that they overrule."""
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    session.engine_event(port.EngineInputTranscript(item_id="", text=words, final=False), now=0.5)
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    assert session.turn_assessed(assess, 0.95, model_ms=30.0) == []
    return assess


def test_newer_words_that_sound_finished_end_a_turn_the_words_alone_kept_going() -> None:
    # A rough recognizer's "close to my", bettered moments later by Whisper's "close tonight".
    session = _session()
    assess = _vetoed(session, "what time does the pharmacy close to my")
    still = session.engine_event(
        port.EngineInputTranscript(item_id="", text="what time does the pharmacy close to the", final=False),
        now=0.6,
    )
    assert not any(isinstance(o, ev.SpeechStopped) for o in still)
    out = session.engine_event(
        port.EngineInputTranscript(
            item_id="", text="What time does the pharmacy close tonight?", final=False
        ),
        now=0.7,
    )
    stopped = [o for o in out if isinstance(o, ev.SpeechStopped)]
    assert [s.audio_end_ms for s in stopped] == [assess.candidate.audio_end_ms]
    assert any(isinstance(o, CommitInput) for o in out)
    (created,) = [o for o in out if isinstance(o, ev.ResponseCreated)]
    session.engine_event(port.EngineResponseStarted(response_id=created.response_id), now=0.8)
    first = session.engine_event(port.EngineAudio(response_id=created.response_id, pcm=bytes(480)), now=0.9)
    (report,) = [o for o in first if isinstance(o, ReportLatency)]
    assert dict(report.latency.stages)["turn_model"] == 30.0


def test_words_the_recognizer_is_unsure_of_keep_the_turn_going_until_surer_words_come() -> None:
    session = _session()
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    session.engine_event(
        port.EngineInputTranscript(
            item_id="", text="I need a taxi from the station too.", final=False, last_word_confidence=0.4
        ),
        now=0.5,
    )
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    assert session.turn_assessed(assess, 0.95) == []  # "too", at 0.4: perhaps "to", and more to come
    out = session.engine_event(
        port.EngineInputTranscript(
            item_id="", text="I need a taxi from the station too.", final=False, last_word_confidence=0.9
        ),
        now=0.6,
    )
    assert [s.audio_end_ms for s in out if isinstance(s, ev.SpeechStopped)] == [assess.candidate.audio_end_ms]


def test_a_done_verdict_waits_for_the_words_the_engine_makes_at_the_pause() -> None:
    # The embedded engine transcribes the turn when the caller pauses; a judgement before its words
    # come would read pocketsphinx's rougher ones ("what what" for "I would like to speak with").
    session = _session(caps=dataclasses.replace(CAPS, words_at_pause=True))
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    session.engine_event(port.EngineInputTranscript(item_id="", text="what what", final=False), now=0.5)
    paused = _feed(session, 1344, 320, 0.01)
    assert any(isinstance(o, CallerPaused) for o in paused)
    (assess,) = [o for o in paused if isinstance(o, AssessTurn)]
    assert session.turn_assessed(assess, 0.95) == []  # the words of the pause are still coming
    # More rough words are not those: the turn still waits.
    rough = session.engine_event(
        port.EngineInputTranscript(item_id="", text="what what", final=False), now=0.6
    )
    assert not any(isinstance(o, ev.SpeechStopped) for o in rough)
    held = session.engine_event(
        port.EngineInputTranscript(item_id="", text="I would like to speak with", final=False, at_pause=True),
        now=0.7,
    )
    assert not any(isinstance(o, ev.SpeechStopped) for o in held)  # "with": not done
    # A finished sentence's words for the pause end the turn at once.
    session2 = _session(caps=dataclasses.replace(CAPS, words_at_pause=True))
    _feed(session2, 0, 320, 0.01)
    _feed(session2, 320, 1024, 0.95)
    paused2 = _feed(session2, 1344, 320, 0.01)
    (assess2,) = [o for o in paused2 if isinstance(o, AssessTurn)]
    assert session2.turn_assessed(assess2, 0.95) == []
    out = session2.engine_event(
        port.EngineInputTranscript(item_id="", text="Where is the bus stop?", final=False, at_pause=True),
        now=0.7,
    )
    assert [s.audio_end_ms for s in out if isinstance(s, ev.SpeechStopped)] == [
        assess2.candidate.audio_end_ms
    ]


def test_an_engine_that_makes_no_words_at_a_pause_is_not_waited_for() -> None:
    session = _session()  # words_at_pause is False
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    assert any(isinstance(o, ev.SpeechStopped) for o in session.turn_assessed(assess, 0.95))


def test_newer_words_lift_no_veto_once_the_caller_spoke_again_or_the_model_said_not_done() -> None:
    session = _session()
    _vetoed(session, "book a table for")
    _feed(session, 1664, 320, 0.95)  # the caller went on: the turn is theirs again
    out = session.engine_event(
        port.EngineInputTranscript(item_id="", text="book a table for four", final=False), now=0.9
    )
    assert not any(isinstance(o, ev.SpeechStopped) for o in out)

    session = _session()
    _feed(session, 0, 320, 0.01)
    _feed(session, 320, 1024, 0.95)
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01) if isinstance(o, AssessTurn)]
    assert session.turn_assessed(assess, 0.1) == []  # the audio says not done: words cannot end it
    out = session.engine_event(port.EngineInputTranscript(item_id="", text="thank you", final=False), now=0.9)
    assert not any(isinstance(o, ev.SpeechStopped) for o in out)


def test_a_judged_silence_ends_the_turn_by_the_clock_when_the_client_stops_sending_audio() -> None:
    session = _session()
    _feed(session, 0, 320, 0.01, now=0.0)
    _feed(session, 320, 1024, 0.95, now=1.0)
    session.engine_event(port.EngineInputTranscript(item_id="", text="tell me the", final=False), now=1.1)
    (assess,) = [o for o in _feed(session, 1344, 320, 0.01, now=1.7) if isinstance(o, AssessTurn)]
    assert session.turn_assessed(assess, 0.95) == []  # vetoed by "the"; then no more audio comes
    due = session.next_timer
    assert due is not None and 1.7 < due <= 1.7 + 1.0
    assert session.tick(due - 0.01) == []
    assert any(isinstance(o, ev.SpeechStopped) for o in session.tick(due))


def test_a_turn_judged_unfinished_ends_at_the_longest_wait_by_the_clock() -> None:
    session = _session("high")
    assess = _spoken(session)
    assert session.turn_assessed(assess, 0.05) == []
    due = session.next_timer
    assert due is not None
    assert any(isinstance(o, ev.SpeechStopped) for o in session.tick(due))
