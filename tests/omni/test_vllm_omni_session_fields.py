"""vLLM-Omni's session fields and truncation reach a real ``DuplexOmni`` through the ``vllm-omni`` engine.

The engine runs in this process over the fake stage; its plugin records the
session config the engine holds (``session_config`` in the call log) at the open
and at every update the engine takes.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from duplex_gateway.dialects.realtime_session import parse_session_patch
from duplex_gateway.engine import port
from duplex_gateway.engine.vllm_omni import VllmOmniEngine, VllmOmniSession
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.omni import fake_stage
from tests.omni.conftest import read_calls
from tests.omni.test_engines_in_process import ONE_SECOND, REPO, Events, done_of, fake_env, running, send_turn

__all__ = ["fake_env"]  # the fixture, registered by import

KNOBS: dict[str, Any] = {
    "ref_audio": "data:audio/wav;base64,UklGRg==",
    "temperature": 0.6,
    "max_output_tokens": 128,
    # The only policy vLLM-Omni allows a session without engine turn detection (it says so if not).
    "overlap_policy": "listen_only",
    "overlap_short_ack_ms": 500,
    "overlap_barge_in_ms": 900,
    "overlap_silence_rms": 0.01,
    "playback_commit_policy": "ack_only",
    "idle_timeout_s": 42.0,
    "audio": {"input": {"noise_reduction": {"type": "far_field"}}},
    "initial_user_text": "hello there",
    "use_tts_template": False,
    "voice": "alloy",
    "extra_body": {"force_listen_count": 2, "auto_response": True},
}


def engine_configs(calls: Path) -> list[dict[str, Any]]:
    return [c["config"] for c in read_calls(calls) if c["call"] == "session_config"]


def engine_history(engine_session_id: str) -> dict[str, dict[str, object]]:
    """The conversation vLLM-Omni keeps for the session (its runner lives in this process)."""
    for obj in gc.get_objects():
        if type(obj).__name__ == "DuplexOrchestrator":
            runner = obj.session_manager.runners.get(engine_session_id)
            if runner is not None:
                return dict(runner.session.history_item_ids)
    raise AssertionError(f"no runner for {engine_session_id}")


async def test_session_fields_reach_the_engine_and_updates_send_only_what_changed(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    engine = VllmOmniEngine(factory=fake_stage.duplex_omni)
    async with running(engine):
        config = SessionConfig().apply(parse_session_patch(KNOBS))
        session = await engine.open_session("s1", config)
        events = Events(session)
        opened = engine_configs(fake_env)[-1]
        for key in (
            "ref_audio",
            "temperature",
            "overlap_policy",
            "overlap_short_ack_ms",
            "overlap_barge_in_ms",
            "overlap_silence_rms",
            "playback_commit_policy",
            "idle_timeout_s",
            "initial_user_text",
            "use_tts_template",
            "voice",
        ):
            assert opened[key] == KNOBS[key], key
        assert opened["max_tokens"] == 128
        extra = opened["extra_body"]
        assert extra["force_listen_count"] == 2
        assert extra["auto_response"] is True  # the model's own turn-taking answers commits
        assert extra["realtime_input_audio_noise_reduction"] == {"type": "far_field"}

        # A reply makes audio: from now on vLLM-Omni refuses any update that names a voice.
        await send_turn(session)
        await session.commit(item_id="item_1", response_id="resp_1")
        await events.wait(done_of("resp_1"))

        # The voice is not sent again, so this update is taken (it returns once the engine did).
        await session.update(SessionConfig().apply(parse_session_patch({**KNOBS, "temperature": 0.9})))
        assert engine_configs(fake_env)[-1]["temperature"] == 0.9

        # A new voice now is refused: update() raises the engine's refusal; the config stays.
        with pytest.raises(port.EngineRefused) as refused:
            await session.update(SessionConfig().apply(parse_session_patch({**KNOBS, "voice": "nova"})))
        assert refused.value.code == "voice_update_after_audio_unsupported"
        assert engine_configs(fake_env)[-1]["voice"] == "alloy"
        assert not events.of(port.EngineError)  # the refusal is the update's answer, not a session error
        await session.close("done")


async def test_a_truncate_shortens_the_engines_history_and_unreported_replies_wait_for_the_commit(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    engine = VllmOmniEngine(factory=fake_stage.duplex_omni)
    async with running(engine):
        session = await engine.open_session("s1", SessionConfig())
        assert isinstance(session, VllmOmniSession)
        events = Events(session)
        await send_turn(session)
        await session.commit(item_id="item_1", response_id="resp_1")
        await events.wait(done_of("resp_1"))
        full = "(echo of 1.0 s of your audio)"
        assert "".join(e.delta for e in events.of(port.EngineTranscript, "resp_1")) == full
        engine_item = f"item_{session._engine_id('resp_1')}"

        # The caller talks on without reporting playback: no ack goes to the engine on append.
        await send_turn(session, ONE_SECOND[:6400])
        assert session._unacked is not None

        # The client says it heard 300 ms of the 1 s reply: the model's history keeps only that.
        await session.truncate_reply(response_id="resp_1", audio_end_ms=300)
        await session.clear_input()
        await send_turn(session)
        await session.commit(item_id="item_2", response_id="resp_2")
        # Answered: the truncated reply no longer holds the turn.
        await events.wait(done_of("resp_2"))
        history = engine_history(session.engine_session_id)
        assert engine_item in history, history
        kept = _text(history[engine_item])
        assert kept and len(kept) < len(full) and full.startswith(kept), kept
        assert not events.of(port.EngineError), events.of(port.EngineError)
        await session.close("done")


def _text(message: dict[str, object]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(str(p.get("text") or p.get("transcript") or "") for p in parts if isinstance(p, dict))
