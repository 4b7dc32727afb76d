"""The fake echo model's duplex plugin: a turn-commit model, one stage request per turn.

Shaped like vLLM-Omni's own turn-commit plugins: caller audio is buffered on
append (16 kHz float PCM, as the session runner normalizes it), a commit hands the
whole turn to Stage 0 as one non-resumable request, and the data plane projects
each Stage 0 output (an audio chunk plus its transcript text) into one
``response.output_audio.delta``. Everything around it -- the session manager and
runner, the orchestrator, the output processor -- is vLLM-Omni's real code.

Function calling, shaped like vLLM-Omni's tool-calling plugin (Nemotron VoiceChat):
the session's tools reach the plugin as ``extra_body.realtime_tools`` (and
``realtime_tool_choice``); when a turn should call one (:func:`tool_to_call`), Stage 0
writes the call as text between ``<tool_call>`` markers instead of speaking, and the
data plane parses it into the ``function_call`` result vLLM-Omni's session runner
turns into ``function_call.done``. A ``function_call_output`` item comes back through
``runtime_config_for_function_output``; the next reply's text starts with what the
function returned.
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pybase64 as base64
import torch
from vllm.sampling_params import RequestOutputKind
from vllm_omni.engine.duplex.config import DuplexCapabilities
from vllm_omni.engine.duplex.contracts import (
    DuplexAppendPlan,
    duplex_resource_request_belongs_to_session,
    duplex_session_id_from_request_id,
)
from vllm_omni.engine.duplex.plugin import (
    DefaultDuplexModelSessionState,
    DuplexDataPlane,
    DuplexModelPlugin,
    DuplexRuntimeConfigError,
    PcmAppendBuffer,
    PcmAppendReservation,
)

#: Where the committed turn's audio rides to the stage (see ``stage.py``).
AUDIO_KEY = "fake_echo_audio"
RATE_KEY = "fake_echo_sample_rate"
#: The call a turn makes (JSON ``{"name", "arguments"}``), riding to Stage 0 like the audio.
TOOL_CALL_KEY = "fake_echo_tool_call"
#: What the client's functions returned since the last reply (JSON list of strings).
FUNCTION_OUTPUTS_KEY = "fake_echo_function_outputs"
#: How Stage 0 writes a function call instead of speaking (a model's tool-call tokens).
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
#: The runner's session state, handed from ``prepare_prompt_config`` to ``plan_append``.
STATE_KEY = "fake_echo_session_state"
INPUT_RATE = 16_000


def _tool_names(tools: object) -> list[str]:
    """The function names of Realtime tools (``{"type": "function", "name": ...}``)."""
    names: list[str] = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def tool_to_call(runtime_config: Mapping[str, object]) -> str | None:
    """The function a turn calls, like a model deciding from what it was told.

    ``tool_choice`` ``none``: none; a named function: that one; otherwise the first tool
    the session's instructions mention, and with ``required`` the first tool if they
    mention none.
    """
    names = _tool_names(runtime_config.get("tools"))
    choice = runtime_config.get("tool_choice")
    if not names or choice == "none":
        return None
    if isinstance(choice, Mapping):
        function = choice.get("function", choice)
        forced = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(forced, str) and forced in names:
            return forced
    instructions = str(runtime_config.get("instructions") or "")
    mentioned = [name for name in names if name in instructions]
    if mentioned:
        return mentioned[0]
    return names[0] if choice == "required" or isinstance(choice, Mapping) else None


def _arguments(tools: object, name: str, turn_seconds: float) -> dict[str, object]:
    """Arguments for ``name`` that fit its JSON schema's properties (strings say what was heard)."""
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else {}
        if function.get("name") != name:
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        args: dict[str, object] = {}
        for key, schema in (properties or {}).items():
            kind = schema.get("type") if isinstance(schema, Mapping) else None
            if kind in ("number", "integer"):
                args[key] = turn_seconds if kind == "number" else round(turn_seconds)
            elif kind == "boolean":
                args[key] = True
            else:
                args[key] = f"{turn_seconds} s of caller audio"
        return args
    return {}


@dataclass
class _Reservation(PcmAppendReservation):
    owner: EchoPcmBuffer
    operation_id: str
    payload: dict[str, object] | None
    raw: bytes
    _active: bool = True

    @property
    def active(self) -> bool:
        return self._active

    @property
    def byte_count(self) -> int:
        return len(self.raw)

    def commit(self) -> None:
        if self._active:
            self._active = False
            self.owner.reservations.remove(self)

    def rollback(self) -> None:
        if self._active:
            self.owner.buffer[:0] = self.raw
            self.commit()


@dataclass
class EchoPcmBuffer(PcmAppendBuffer):
    """Collects a turn's 16 kHz float PCM; inference starts on commit only."""

    buffer: bytearray = field(default_factory=bytearray)
    reservations: list[_Reservation] = field(default_factory=list)

    @property
    def pending_byte_count(self) -> int:
        return len(self.buffer)

    def clear(self) -> None:
        for reservation in self.reservations:
            reservation._active = False
        self.reservations.clear()
        self.buffer.clear()

    def clear_force_listen(self) -> None:
        return None

    def has_pending(self) -> bool:
        return bool(self.buffer)

    def has_reserved(self) -> bool:
        return bool(self.reservations)

    def prepare_append(
        self, payload: dict[str, object], *, operation_id: str, chunk_period_ms: int, allow_emit: bool
    ) -> PcmAppendReservation | None:
        if payload.get("format") != "pcm_f32le" or payload.get("sample_rate_hz") != INPUT_RATE:
            raise ValueError("the fake echo model takes normalized 16 kHz pcm_f32le")
        raw = base64.b64decode(str(payload.get("audio", "")), validate=True)
        if len(raw) % 4:
            raise ValueError("float32 PCM length is not a multiple of 4")
        self.buffer.extend(raw)
        frames = payload.get("video_frames")
        if frames:
            # Like MiniCPM-o, the model takes the camera frames that ride an append; tests see how many.
            from tests.omni.fake_stage.stage import CallLog

            CallLog(os.environ.get("FAKE_OMNI_CALL_LOG") or None).write(
                "video_frames", frames=len(frames) if isinstance(frames, list) else 0, audio_bytes=len(raw)
            )
        return None

    def prepare_commit(self, *, operation_id: str, chunk_period_ms: int) -> PcmAppendReservation:
        raw = bytes(self.buffer)
        payload: dict[str, object] | None = (
            {
                "audio": base64.b64encode(raw).decode(),
                "format": "pcm_f32le",
                "sample_rate_hz": INPUT_RATE,
                "is_speech": True,
            }
            if raw
            else None
        )
        self.buffer.clear()
        reservation = _Reservation(self, operation_id, payload, raw)
        self.reservations.append(reservation)
        return reservation

    def flush(self, *, chunk_period_ms: int) -> dict[str, object] | None:
        reservation = self.prepare_commit(operation_id="flush", chunk_period_ms=chunk_period_ms)
        reservation.commit()
        return reservation.payload


@dataclass(slots=True)
class EchoSessionState(DefaultDuplexModelSessionState):
    """The session state vLLM-Omni's runner keeps for the fake model.

    A turn whose reply called a function is not answered yet: its audio stays the
    committed input (vLLM-Omni answers ``response.create`` from committed input only),
    so the ``response.create`` after the function's output answers that turn with it.
    """

    #: The turn being submitted calls a function: keep it committed once the stage has it.
    keep_turn: bool = False

    def clear_committed_audio(self) -> int:
        if self.keep_turn and self.committed_audio_payload is not None:
            self.keep_turn = False
            # The bytes are the stage's now; only the turn's payload stays for the next reply.
            reserved, self.committed_audio_reserved_bytes = self.committed_audio_reserved_bytes, 0
            return reserved
        self.keep_turn = False
        return DefaultDuplexModelSessionState.clear_committed_audio(self)


class EchoDataPlane(DuplexDataPlane):
    """Stage 0 output -> one audio-delta projection per chunk."""

    def __init__(self, encode_audio: Any) -> None:
        self.encode_audio = encode_audio
        self.terminal: set[str] = set()
        #: Tool-call text Stage 0 has written so far, by request (a call is parsed once whole).
        self.tool_text: dict[str, str] = {}
        #: Function outputs a reply has used, by session (call ids).
        self.answered: dict[str, set[str]] = {}

    def begin_request(self, request_id: str) -> None:
        self.terminal.discard(request_id)

    def is_terminal(self, request_id: str | None) -> bool:
        return request_id in self.terminal

    def mark_terminal(self, request_id: str) -> None:
        self.terminal.add(request_id)

    def close_stream(self, request_id: str) -> None:
        self.tool_text.pop(request_id, None)

    def close_session(self, session_id: str, *, active_request_id: str | None = None) -> None:
        self.terminal = {
            rid for rid in self.terminal if not duplex_resource_request_belongs_to_session(rid, session_id)
        }
        for rid in [
            rid for rid in self.tool_text if duplex_resource_request_belongs_to_session(rid, session_id)
        ]:
            del self.tool_text[rid]
        self.answered.pop(session_id, None)

    def _tool_call(self, rid: str, text: str) -> tuple[dict[str, object] | None, str]:
        """Tool-call text of ``rid`` so far plus ``text``: the call once it is whole, and
        the text that is not part of it (to project as speech)."""
        buffered = self.tool_text.get(rid)
        if buffered is None and not (text.startswith(TOOL_OPEN) or (text and TOOL_OPEN.startswith(text))):
            return None, text
        buffered = (buffered or "") + text
        if TOOL_CLOSE not in buffered:
            self.tool_text[rid] = buffered
            return None, ""
        self.tool_text.pop(rid, None)
        body, _, rest = buffered[len(TOOL_OPEN) :].partition(TOOL_CLOSE)
        call = json.loads(body)
        # Shaped like vLLM-Omni's tool-calling data plane: the session runner emits it as
        # ``function_call.done``, and the Realtime translator as a function_call item.
        return {
            "stage_role": "function",
            "data_plane_request_id": rid,
            "function_call": True,
            "call_id": f"call_{uuid.uuid4().hex}",
            "name": str(call["name"]),
            "arguments": json.dumps(call.get("arguments", {}), separators=(",", ":")),
        }, rest

    def project(self, result: object, *, context: object | None = None) -> Iterable[dict[str, object]]:
        if not isinstance(result, dict):
            return
        ctx: Mapping[str, Any] = context if isinstance(context, Mapping) else {}
        response_format = str(ctx.get("response_format") or "pcm")
        for output in result.get("data_plane_outputs", []):
            rid = output.request_id
            if self.is_terminal(rid):
                continue
            completion = next(iter(getattr(output, "outputs", ()) or ()), None)
            text = getattr(completion, "text", "") or ""
            call, text = self._tool_call(rid, text)
            if call is not None:
                yield call
            mm = getattr(output, "multimodal_output", None)
            if not isinstance(mm, Mapping) or "audio" not in mm:
                mm = getattr(completion, "multimodal_output", None) or {}
            rate = _last_int(mm.get("sr"), 24_000)
            audio = mm.get("audio")
            encoded = ""
            duration_ms = 0.0
            if audio is not None and "audio" in ctx.get("modalities", ("audio",)):
                samples = _mono(audio)
                duration_ms = samples.size * 1000.0 / rate
                if samples.size:
                    encoded = self.encode_audio(samples, rate, response_format, ctx.get("speed")) or ""
            finished = bool(getattr(output, "finished", False))
            turn_id = ctx.get("active_response_turn_id")
            yield {
                "supported": True,
                "data_plane_request_id": rid,
                "text": text,
                "audio_data": encoded,
                "audio_format": response_format,
                "audio_duration_ms": duration_ms,
                "sample_rate_hz": rate,
                "audio_complete": finished,
                "end_of_turn": finished,
                "model_turn_id": turn_id if turn_id is not None else ctx.get("turn_id", 0),
                "runtime_impl": "fake_echo_commit",
            }


def _mono(audio: object) -> np.ndarray:
    chunks = audio if isinstance(audio, list | tuple) else [audio]
    arrays = [
        np.asarray(
            c.detach().float().cpu().numpy() if isinstance(c, torch.Tensor) else c, dtype=np.float32
        ).reshape(-1)
        for c in chunks
    ]
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.float32)


def _last_int(value: object, default: int) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.reshape(-1)[-1].item()) if value.numel() else default
    if isinstance(value, list | tuple):
        return _last_int(value[-1], default) if value else default
    if isinstance(value, int | float) and value > 0:
        return int(value)
    return default


class FakeEchoDuplexPlugin(DuplexModelPlugin):
    """Turn-commit duplex plugin of the fake echo model."""

    plugin_id = "fake-echo"

    def __init__(self, encode_audio: Any) -> None:
        from tests.omni.fake_stage.stage import CallLog

        self.data_plane = EchoDataPlane(encode_audio)
        self.calls = CallLog(os.environ.get("FAKE_OMNI_CALL_LOG") or None)

    def capabilities(self, *, max_sessions: int) -> DuplexCapabilities:
        return DuplexCapabilities(
            supports_model_native_turn_policy=False,
            supports_input_append=True,
            supports_barge_in=True,
            supports_replace_latest_chunk=False,
            supports_turn_commit_only=True,
            supports_core_resumable_request=False,
            supports_independent_io_streams=True,
            supports_realtime_endpoint=True,
            supports_multi_session=max_sessions > 1,
            supports_multi_session_same_replica=max_sessions > 1,
            supports_session_lease=True,
            supports_session_resume=True,
            session_admission_mode="engine_managed",
            supports_audio_truncate=True,
            supports_text_only_turn=False,
            adapter_patterns=["turn_commit"],
            signal_sources=["client_event", "server_policy"],
            stage_handoff_transport="scheduler_data_plane",
            target_barge_in_latency_ms=None,
        )

    def create_session_state(self) -> DefaultDuplexModelSessionState:
        return EchoSessionState(audio_buffer=EchoPcmBuffer())

    def prepare_prompt_config(
        self, config: dict[str, object], *, state: Any, payload: dict[str, object]
    ) -> dict[str, object]:
        # The plan decides whether the turn calls a function; the session state must know.
        return {**config, STATE_KEY: state}

    def validate_client_extra_body(self, extra_body: object) -> None:
        # Like MiniCPM-o, every client knob is welcome, extra_body.auto_response included:
        # the session runner, not the model, decides when a committed turn is answered.
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise DuplexRuntimeConfigError("extra_body must be an object")

    async def prepare_runtime_config(self, config: Any, *, model_config: Any) -> dict[str, object]:
        return self.runtime_config_for_update(config, {})

    def runtime_config_for_update(self, config: Any, current: Mapping[str, object]) -> dict[str, object]:
        self.validate_client_extra_body(config.extra_body)
        # The session config the engine holds (at the open and at every update it takes), for tests.
        self.calls.write("session_config", config=config.as_dict())
        extra = config.extra_body if isinstance(config.extra_body, Mapping) else {}
        return {
            "instructions": config.instructions,
            # Where vLLM-Omni keeps the session's Realtime tools (its tool-calling plugin reads them there).
            "tools": copy.deepcopy(extra.get("realtime_tools") or []),
            "tool_choice": copy.deepcopy(extra.get("realtime_tool_choice")),
            # Function outputs not yet answered survive an update.
            "function_outputs": list(current.get("function_outputs") or []),
        }

    def runtime_config_for_function_output(
        self, config: Any, current: Mapping[str, object], item: Mapping[str, object]
    ) -> dict[str, object]:
        """A ``function_call_output`` item: what the function returned waits for the next reply."""
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id or not isinstance(output, str):
            raise DuplexRuntimeConfigError(
                "function_call_output needs a call_id and a string output",
                code="invalid_function_call_output",
            )
        self.calls.write("function_output", call_id=call_id, output=output)
        runtime = copy.deepcopy(dict(current))
        runtime["function_outputs"] = [
            *(runtime.get("function_outputs") or []),
            {"call_id": call_id, "output": output},
        ]
        return runtime

    def configure_sampling_params(
        self, *, runtime_config: dict[str, object], defaults: tuple[object, ...]
    ) -> tuple[object, ...]:
        params = copy.deepcopy(defaults)
        for value in params:
            if value is not None:
                value.output_kind = RequestOutputKind.DELTA  # type: ignore[attr-defined]
        return params

    def plan_append(
        self,
        *,
        request_id: str,
        fence: object,
        session_config: dict[str, object],
        runtime_config: dict[str, object],
        seq: int,
        turn_seq: int,
        payload: object,
        final: bool,
        sampling_params: object,
    ) -> DuplexAppendPlan:
        if not final or not isinstance(payload, dict) or not payload.get("audio"):
            raise DuplexRuntimeConfigError("the fake echo model needs a committed audio turn")
        raw = base64.b64decode(str(payload["audio"]), validate=True)
        audio = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
        # The turn's audio rides in the runner-owned buffer, as a model runner's inputs would.
        rate = int(payload.get("sample_rate_hz") or INPUT_RATE)
        # Like vLLM-Omni's own plugins, the turn's Realtime item id rides with the request, so
        # what Stage 0 recognizes of the caller's words names the caller's item.
        seconds = round(audio.numel() / rate, 1)
        info: dict[str, object] = {"turn_seconds": seconds}
        item_id = payload.get("realtime_item_id")
        if isinstance(item_id, str) and item_id:
            info["realtime_item_id"] = item_id
        buffer: dict[str, object] = {AUDIO_KEY: audio, RATE_KEY: rate}
        # A reply after function outputs uses them; otherwise the turn may call a function.
        outputs = self._unanswered_outputs(request_id, runtime_config)
        name = None if outputs else tool_to_call(runtime_config)
        if outputs:
            buffer[FUNCTION_OUTPUTS_KEY] = json.dumps(outputs)
        elif name is not None:
            call = {"name": name, "arguments": _arguments(runtime_config.get("tools"), name, seconds)}
            buffer[TOOL_CALL_KEY] = json.dumps(call)
            state = session_config.get(STATE_KEY)
            if isinstance(state, EchoSessionState):
                state.keep_turn = True
        self.calls.write("plan_append", request_id=request_id, tool_call=name, function_outputs=outputs)
        prompt = {
            "prompt_token_ids": [0],
            "model_intermediate_buffer": buffer,
            "additional_information": info,
        }
        return DuplexAppendPlan(prompt=prompt)

    def _unanswered_outputs(self, request_id: str, runtime_config: Mapping[str, object]) -> list[str]:
        """Function outputs of this session no reply has used yet (marked used now)."""
        session_id = duplex_session_id_from_request_id(request_id) or ""
        answered = self.data_plane.answered.setdefault(session_id, set())
        outputs = []
        for entry in runtime_config.get("function_outputs") or []:
            if isinstance(entry, Mapping) and entry.get("call_id") not in answered:
                answered.add(str(entry.get("call_id")))
                outputs.append(str(entry.get("output")))
        return outputs

    def user_transcript(self, *, stage_id: int, output: object, prompt: object, finished: bool) -> str | None:
        """What the fake model "heard": the length of the caller's turn, once its reply is made."""
        info = prompt.get("additional_information") if isinstance(prompt, dict) else None
        if stage_id != 0 or not finished or not isinstance(info, dict):
            return None
        return f"{info['turn_seconds']} s of caller audio"

    def decide_output(self, **kwargs: Any) -> None:
        return None

    def data_plane_context(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs
