"""A fake model stage under the REAL vLLM-Omni stack, for the in-process engines' tests.

Two factories for ``duplex-gateway serve --omni-factory``:

- ``tests.omni.fake_stage:duplex_omni`` -> a ``DuplexOmni`` (native duplex sessions,
  engine ``vllm-omni``), its pipeline declaring the fake duplex plugin;
- ``tests.omni.fake_stage:async_omni`` -> an ``AsyncOmni`` (turn-based streaming
  input, engine ``vllm-omni-stream``).

Both are vLLM-Omni's own classes; only ``_create_engine`` is overridden, to build
the real ``DuplexOmniEngine`` / ``AsyncOmniEngine`` with the fake stage mixed in
(see :mod:`tests.omni.fake_stage.stage`). The model is the folder ``model/``
(a ``config.json`` only) with ``deploy_duplex.yaml`` / ``deploy_turn.yaml``.

In a duplex session with tools the fake model calls the tool its instructions name
(or the one ``tool_choice`` forces) instead of answering, through vLLM-Omni's real
function-call path, and the reply after the function's output starts with what it
returned (see :mod:`tests.omni.fake_stage.plugin`).

Environment:

- ``FAKE_OMNI_CALL_LOG``: JSONL file receiving every engine-side call;
- ``FAKE_OMNI_CHUNKS`` (default 8): chunks each answer is split into;
- ``FAKE_OMNI_CHUNK_DELAY_MS`` (default 50): pause between two chunks;
- ``FAKE_OMNI_OUTPUT_KIND`` (``cumulative``, the default, or ``delta``): what the
  stage's default sampling params ask vLLM's output processor for;
- ``FAKE_OMNI_MAX_SESSIONS``: the DuplexOmni's ``duplex_session.max_sessions``
  instead of the deploy file's 4 (the bench runs more callers than the tests).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni

__all__ = ["DUPLEX_DEPLOY", "MODEL_DIR", "MODEL_TYPE", "TURN_DEPLOY", "async_omni", "duplex_omni", "register"]

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "model"
DUPLEX_DEPLOY = HERE / "deploy_duplex.yaml"
TURN_DEPLOY = HERE / "deploy_turn.yaml"
MODEL_TYPE = "fake_echo_omni"


def register() -> None:
    """Register the fake echo pipeline with vLLM-Omni's pipeline registry (idempotent)."""
    from vllm_omni.config.pipeline_registry import OMNI_PIPELINES, register_pipeline
    from vllm_omni.config.stage_config import PipelineConfig, StageExecutionType, StagePipelineConfig

    if MODEL_TYPE in OMNI_PIPELINES:
        return
    register_pipeline(
        PipelineConfig(
            model_type=MODEL_TYPE,
            model_arch="FakeEchoOmniForGeneration",
            duplex_plugin="tests.omni.fake_stage.plugin.FakeEchoDuplexPlugin",
            default_session_mode="turn",
            stages=(
                StagePipelineConfig(
                    stage_id=0,
                    model_stage="echo",
                    execution_type=StageExecutionType.LLM_GENERATION,
                    final_output=True,
                    final_output_type="audio",
                    engine_output_type="audio",
                    owns_tokenizer=True,
                ),
            ),
        )
    )


def _settings() -> dict[str, Any]:
    # The orchestrator and the output drain block on their queues instead of a 1 ms poll.
    os.environ.setdefault("VLLM_OMNI_EVENT_DRIVEN_ORCH", "1")
    from vllm.sampling_params import RequestOutputKind

    kind = os.environ.get("FAKE_OMNI_OUTPUT_KIND", "cumulative").strip().upper()
    return {
        "calls_path": os.environ.get("FAKE_OMNI_CALL_LOG") or None,
        "chunks": int(os.environ.get("FAKE_OMNI_CHUNKS", "8")),
        "chunk_delay_s": float(os.environ.get("FAKE_OMNI_CHUNK_DELAY_MS", "50")) / 1000.0,
        "output_kind": RequestOutputKind[kind],
    }


def duplex_omni() -> DuplexOmni:
    """A started ``DuplexOmni`` over the fake echo stage (its orchestrator thread runs)."""
    from vllm_omni.engine.duplex_omni_engine import DuplexOmniEngine
    from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni

    from tests.omni.fake_stage.stage import CallLog, FakeStageEngineMixin

    register()
    settings = _settings()
    calls = CallLog(settings["calls_path"])

    class FakeDuplexOmniEngine(FakeStageEngineMixin, DuplexOmniEngine):
        fake_chunks = settings["chunks"]
        fake_chunk_delay_s = settings["chunk_delay_s"]
        fake_output_kind = settings["output_kind"]

        async def open_session_async(self, session_id: str, session_config: Any, **kwargs: Any) -> Any:
            calls.write("open_session", session_id=session_id)
            try:
                result = await super().open_session_async(session_id, session_config, **kwargs)
            except Exception as exc:
                calls.write(
                    "open_session.result", session_id=session_id, error=getattr(exc, "code", repr(exc))
                )
                raise
            calls.write("open_session.result", session_id=session_id, ok=True)
            return result

        async def close_session_async(self, session_id: str, **kwargs: Any) -> Any:
            calls.write("close_session", session_id=session_id, reason=kwargs.get("reason"))
            return await super().close_session_async(session_id, **kwargs)

    FakeDuplexOmniEngine.calls = calls

    class FakeStageDuplexOmni(DuplexOmni):
        def _create_engine(self, **engine_kwargs: Any) -> DuplexOmniEngine:
            return FakeDuplexOmniEngine(duplex_audio_encoder=encode_audio, **engine_kwargs)

    deploy = _duplex_deploy()
    try:
        return FakeStageDuplexOmni(model=str(MODEL_DIR), deploy_config=str(deploy), trust_remote_code=False)
    finally:
        if deploy != DUPLEX_DEPLOY:
            deploy.unlink(missing_ok=True)


def _duplex_deploy() -> Path:
    limit = os.environ.get("FAKE_OMNI_MAX_SESSIONS")
    if not limit:
        return DUPLEX_DEPLOY
    import yaml

    deploy = yaml.safe_load(DUPLEX_DEPLOY.read_text(encoding="utf-8"))
    deploy["duplex_session"]["max_sessions"] = int(limit)
    fd, name = tempfile.mkstemp(prefix="fake-omni-deploy-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        yaml.safe_dump(deploy, f)
    return Path(name)


def _prompt_summary(prompt: Any) -> dict[str, Any]:
    if isinstance(prompt, dict):
        audio = (prompt.get("multi_modal_data") or {}).get("audio")
        if audio is not None:
            items = audio if isinstance(audio, list) else [audio]
            return {
                "prompt": "audio",
                "samples": sum(len(pcm) for pcm, _ in items),
                "text": prompt.get("prompt"),
            }
        if "prompt_token_ids" in prompt:
            return {"prompt": "tokens", "token_ids": list(prompt["prompt_token_ids"])}
    return {"prompt": type(prompt).__name__}


def async_omni() -> AsyncOmni:
    """A started ``AsyncOmni`` (turn-based streaming input) over the fake echo stage."""
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    from tests.omni.fake_stage.stage import CallLog, FakeStageEngineMixin

    register()
    settings = _settings()
    calls = CallLog(settings["calls_path"])

    class FakeAsyncOmniEngine(FakeStageEngineMixin, AsyncOmniEngine):
        fake_chunks = settings["chunks"]
        fake_chunk_delay_s = settings["chunk_delay_s"]
        fake_output_kind = settings["output_kind"]

        def add_request(
            self, request_id: str, prompt: Any, *args: Any, resumable: bool = False, **kwargs: Any
        ) -> None:
            calls.write("add_request", request_id=request_id, resumable=resumable, **_prompt_summary(prompt))
            super().add_request(request_id, prompt, *args, resumable=resumable, **kwargs)

        def add_streaming_update(
            self, request_id: str, prompt: Any, *args: Any, resumable: bool = True, **kwargs: Any
        ) -> None:
            calls.write(
                "add_streaming_update", request_id=request_id, resumable=resumable, **_prompt_summary(prompt)
            )
            super().add_streaming_update(request_id, prompt, *args, resumable=resumable, **kwargs)

        async def abort_async(self, request_ids: list[str], timeout: float | None = None) -> list[Any]:
            started = time.monotonic()
            calls.write("abort_async", request_ids=list(request_ids), timeout=timeout)
            try:
                outputs = await super().abort_async(request_ids, timeout=timeout)
            except Exception as exc:
                calls.write("abort_async.result", request_ids=list(request_ids), ok=False, error=repr(exc))
                raise
            calls.write(
                "abort_async.result",
                request_ids=list(request_ids),
                ok=True,
                outputs=len(outputs),
                wait_ms=round((time.monotonic() - started) * 1000, 1),
            )
            return outputs

    FakeAsyncOmniEngine.calls = calls

    class FakeStageAsyncOmni(AsyncOmni):
        def _create_engine(self, **engine_kwargs: Any) -> AsyncOmniEngine:
            return FakeAsyncOmniEngine(**engine_kwargs)

    return FakeStageAsyncOmni(model=str(MODEL_DIR), deploy_config=str(TURN_DEPLOY), trust_remote_code=False)
