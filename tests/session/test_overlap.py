"""The backchannel rule alone: which policy a session runs, and a hold's verdict from VAD windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from duplex_gateway.session.overlap import (
    BackchannelRule,
    OverlapHold,
    OverlapPolicy,
    OverlapVerdict,
    backchannel_rule,
)
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetection, TurnDetectionMode

SEMANTIC = TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD)
SERVER = TurnDetection()
RULE = BackchannelRule()
#: The rule a session holds replies by under RULE: the policy decided, never ``auto``.
HELD = replace(RULE, policy=OverlapPolicy.BACKCHANNEL)
#: Lengths the window arithmetic below is written for.
SHORT = BackchannelRule(barge_in_ms=400, settle_ms=250)


def _hold(rule: BackchannelRule = SHORT, onset_ms: int = 1000) -> OverlapHold:
    return OverlapHold(
        rule=rule,
        response_id="resp_1",
        onset_ms=onset_ms,
        audio_start_ms=onset_ms - 300,
        threshold=0.5,
        neg_threshold=0.35,
        deadline=None,
    )


def _feed(hold: OverlapHold, start_ms: int, ms: int, prob: float) -> list[OverlapVerdict]:
    verdicts = [hold.feed(end, prob) for end in range(start_ms + 32, start_ms + ms + 1, 32)]
    return [v for v in verdicts if v is not None]


def test_auto_holds_replies_under_semantic_vad_only() -> None:
    assert backchannel_rule(SessionConfig(turn_detection=SEMANTIC), RULE) == HELD
    assert backchannel_rule(SessionConfig(turn_detection=SERVER), RULE) is None


def test_the_rule_names_the_policy_decided_never_auto() -> None:
    rule = backchannel_rule(SessionConfig(turn_detection=SEMANTIC), RULE)
    assert RULE.policy is OverlapPolicy.AUTO
    assert rule is not None and rule.policy is OverlapPolicy.BACKCHANNEL  # what overlap.decision says


def test_the_sessions_own_policy_and_length_win() -> None:
    asked = SessionConfig(turn_detection=SERVER, overlap_policy="backchannel", overlap_barge_in_ms=600)
    rule = backchannel_rule(asked, RULE)
    assert rule is not None and rule.barge_in_ms == 600 and rule.settle_ms == RULE.settle_ms
    plain = SessionConfig(turn_detection=SEMANTIC, overlap_policy="barge_in_on_speech")
    assert backchannel_rule(plain, RULE) is None


def test_a_policy_the_gateway_does_not_run_falls_back_to_its_default() -> None:
    config = SessionConfig(turn_detection=SEMANTIC, overlap_policy="listen_only")
    assert backchannel_rule(config, RULE) == HELD


def test_nothing_is_held_where_speech_never_interrupts() -> None:
    quiet = TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD, interrupt_response=False)
    assert backchannel_rule(SessionConfig(turn_detection=quiet), RULE) is None
    assert backchannel_rule(SessionConfig(turn_detection=None), RULE) is None


def test_short_speech_then_quiet_is_a_backchannel() -> None:
    hold = _hold()
    assert hold.start(1064) is None
    assert _feed(hold, 1064, 224, 0.9) == []  # 288 ms voiced in all
    verdicts = _feed(hold, 1288, 320, 0.05)
    assert verdicts[0] is OverlapVerdict.BACKCHANNEL
    assert hold.speech_end_ms == 1288


def test_speech_that_goes_on_is_an_interruption_at_the_rule_s_length() -> None:
    hold = _hold()
    hold.start(1064)
    verdicts = [(end, hold.feed(end, 0.9)) for end in range(1096, 1600, 32)]
    first = next(end for end, v in verdicts if v is OverlapVerdict.INTERRUPTION)
    assert first - 1000 == pytest.approx(SHORT.barge_in_ms, abs=32)


def test_a_short_gap_inside_speech_neither_resumes_nor_resets_it() -> None:
    hold = _hold()
    hold.start(1064)
    assert _feed(hold, 1064, 160, 0.9) == []  # "uh"
    assert _feed(hold, 1224, 96, 0.05) == []  # a gap shorter than settle_ms
    assert _feed(hold, 1320, 192, 0.9)[0] is OverlapVerdict.INTERRUPTION  # voiced adds up


def test_uncertain_windows_count_neither_way() -> None:
    hold = _hold()
    hold.start(1064)
    assert _feed(hold, 1064, 1_000, 0.4) == []


def test_an_expired_hold_is_decided_by_the_last_windows() -> None:
    hold = _hold()
    hold.start(1064)
    assert hold.expire() is OverlapVerdict.INTERRUPTION
    _feed(hold, 1064, 64, 0.05)
    assert hold.expire() is OverlapVerdict.BACKCHANNEL


def test_speech_confirmed_late_may_already_be_an_interruption() -> None:
    assert _hold().start(1000 + SHORT.barge_in_ms) is OverlapVerdict.INTERRUPTION


def test_a_rule_needs_positive_lengths() -> None:
    with pytest.raises(ValueError):
        BackchannelRule(barge_in_ms=0)
    assert OverlapPolicy("backchannel") is OverlapPolicy.BACKCHANNEL


def test_a_dialect_may_ask_for_backchannels_under_server_vad() -> None:
    live = SessionConfig(turn_detection=SERVER, hold_for_backchannels=True)
    assert backchannel_rule(live, RULE) == HELD
    told = SessionConfig(
        turn_detection=SERVER, hold_for_backchannels=True, overlap_policy="barge_in_on_speech"
    )
    assert backchannel_rule(told, RULE) is None
