"""The ``vllm-omni-stream`` engine: turn-based streaming input on an in-process ``AsyncOmni``.

For any vLLM-Omni model served turn by turn (Qwen2.5-Omni, Qwen3-Omni's turn mode,
...). The gateway's VAD (or the client's commits) decides the turns; each caller
turn is ONE resumable engine request:

* the turn's first audio chunk: ``add_request(request_id, prompt, resumable=True)``,
  its prompt ``{"prompt": <the conversation>, "multi_modal_data": {"audio":
  (float32 samples, rate)}}``;
* every later chunk: ``add_streaming_update(request_id, prompt, resumable=True)``,
  its prompt the chunk's audio only (``"prompt": ""``): the conversation is sent
  once per turn;
* end of input, when a reply is wanted: ``add_streaming_update(request_id,
  TokensPrompt(prompt_token_ids=[0]), resumable=False)``.

Every call carries the sampling parameters vLLM-Omni's own streaming-input path
uses (its realtime connection and ``AsyncOmni.generate`` with an input stream):
the stages' defaults coerced to ``RequestOutputKind.DELTA``, the pipeline's
sampling constraints applied, stage 0 checked (``n == 1``, not ``FINAL_ONLY``,
no stop strings) and cloned once with ``skip_clone``. Without them vLLM's
``CUMULATIVE`` default would make every output re-carry the whole reply.

The conversation is rendered as ChatML (the chat format of the Qwen omni models):
the session's instructions as the system message, then every earlier message in
order -- text items added with ``conversation.item.create``, each caller audio
turn (an empty user message: its audio is not re-sent), each reply by its
transcript -- and the open user message, ``<|im_start|>user\n`` followed by the
engine's ``prompt`` setting (e.g. the model's audio placeholder).

Function calling is not offered (``tools=False``): the prompt carries no tools and
the model's text goes straight to its speech stage. Session tools are accepted and
echoed; a ``tool_choice`` that forces a call is refused by the gateway.

Committed audio is part of the conversation: ``input_audio_buffer.clear`` drops
only what was appended since the last commit. Audio appended after a commit in a
turn not yet answered is held in the gateway until the next commit, so that a
clear can still drop it.

One output pump per engine reads the orchestrator's
output queue and hands each ``OutputMessage`` to the session that owns its request
id the moment it arrives: every async chunk becomes its own audio delta. Audio is
``multimodal_output["audio"]`` (or ``"model_outputs"``), a tensor or a list of
tensors, CUMULATIVE or a delta (told apart per stage, by content), at
``["sr"]``; text deltas come from ``outputs[0].text`` the same way.

A cancel or barge-in fences the reply (nothing more of it reaches the session)
and aborts its request with ``abort_async``, waiting for the orchestrator's
acknowledgement.

vLLM, vLLM-Omni and torch are imported only when this engine starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio import codec
from duplex_gateway.engine import port
from duplex_gateway.engine.omni.audio import ReplyAudio
from duplex_gateway.engine.omni.loading import (
    DEFAULT_INPUT_RATE,
    DEFAULT_OUTPUT_RATE,
    keep_root_logging,
    omni_builder,
)
from duplex_gateway.vocabulary.formats import Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = ["AudioCursor", "TextCursor", "VllmOmniStreamEngine", "VllmOmniStreamSession", "to_mono"]

logger = logging.getLogger(__name__)

_EMPTY: Final = np.zeros(0, dtype=np.float32)
#: Samples compared at each end of what was received so far to tell a cumulative waveform from a delta.
_FINGERPRINT = 64
_OUTPUT_WAIT_S = 1.0


def to_mono(value: object) -> npt.NDArray[np.float32]:
    """A tensor, an array or a list of them (chunks) as one flat float32 array."""
    if value is None:
        return _EMPTY
    if isinstance(value, list | tuple):
        parts = [to_mono(v) for v in value]
        return np.concatenate(parts).astype(np.float32, copy=False) if parts else _EMPTY
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _last_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return _last_int(value[-1]) if value else None
    if hasattr(value, "reshape") and hasattr(value, "tolist"):  # tensor / ndarray
        flat = value.reshape(-1).tolist()
        return int(flat[-1]) if flat else None
    if isinstance(value, int | float) and value > 0:
        return int(value)
    return None


class AudioCursor:
    """What is new in each audio output of one stream, whether outputs are cumulative or deltas.

    The first decisive output settles the mode: one shorter than what came before,
    or one that does not start with it, is a delta; one that repeats what came
    before (checked on a fingerprint of its first and last samples) is cumulative.
    Outputs that cannot tell (silence matching silence) follow ``cumulative_prior``.
    """

    def __init__(self, *, cumulative_prior: bool) -> None:
        self.cumulative_prior = cumulative_prior
        self.cumulative: bool | None = None
        self.total = 0
        self._head = _EMPTY
        self._tail = _EMPTY

    def new_samples(self, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self.total and self.cumulative is None:
            self.cumulative = self._looks_cumulative(samples)
        if self.cumulative and self.total:
            new = samples[self.total :] if samples.size >= self.total else samples
        else:
            new = samples
        self._remember(new)
        return new

    def _looks_cumulative(self, samples: npt.NDArray[np.float32]) -> bool:
        if samples.size < self.total:
            return False
        k = self._head.size
        head, tail = samples[:k], samples[self.total - self._tail.size : self.total]
        if not (np.array_equal(head, self._head) and np.array_equal(tail, self._tail)):
            return False
        if not (np.any(self._head) or np.any(self._tail)):
            return self.cumulative_prior  # all silence: the content cannot tell
        return True

    def _remember(self, new: npt.NDArray[np.float32]) -> None:
        if not new.size:
            return
        if self._head.size < _FINGERPRINT:
            self._head = np.concatenate([self._head, new[: _FINGERPRINT - self._head.size]])
        self._tail = np.concatenate([self._tail, new])[-_FINGERPRINT:]
        self.total += int(new.size)


@dataclass(slots=True)
class TextCursor:
    """What is new in each text output of one stream (cumulative text repeats what came before)."""

    text: str = ""

    def new_text(self, text: str, *, cumulative: bool | None) -> str:
        if not text:
            return ""
        if (cumulative or cumulative is None) and self.text and text.startswith(self.text):
            new = text[len(self.text) :]
        elif cumulative and self.text and len(text) <= len(self.text):
            new = ""  # a cumulative repeat with nothing new
        else:
            new = text
        self.text += new
        return new


# ---------------------------------------------------------------------------------------
# The session


@dataclass(slots=True)
class _Message:
    """One message of the conversation kept for the next turns' prompts."""

    role: str
    text: str
    item_id: str | None = None


def chatml(messages: list[_Message], *, instructions: str, open_user: str) -> str:
    """The conversation as ChatML text, ending with the open user message of the new turn."""
    parts = [f"<|im_start|>system\n{instructions}<|im_end|>\n"] if instructions else []
    parts.extend(f"<|im_start|>{m.role}\n{m.text}<|im_end|>\n" for m in messages)
    parts.append(f"<|im_start|>user\n{open_user}")
    return "".join(parts)


@dataclass(slots=True)
class _Turn:
    """One caller turn: one resumable engine request, and the reply it produces."""

    request_id: str
    started: bool = False  # add_request sent
    input_closed: bool = False  # the resumable=False end marker sent
    committed: bool = False  # some of its audio was committed: later audio waits for the next commit
    item_ids: list[str] = field(default_factory=list)  # the caller's items committed into it
    transcript: str = ""  # the reply's text so far
    response_id: str | None = None
    audio: ReplyAudio | None = None
    cursors: dict[int, tuple[AudioCursor, TextCursor]] = field(default_factory=dict)


class VllmOmniStreamSession(port.EngineSession):
    """One gateway session: its turns as resumable requests of the shared ``AsyncOmni``."""

    def __init__(self, engine: VllmOmniStreamEngine, session_id: str, config: SessionConfig) -> None:
        self._engine = engine
        self._session_id = session_id
        self._config = config
        caps = engine.capabilities
        self._input_rate = caps.input_rate
        self._output_rate = caps.output_rate
        self._chunk_bytes = max(2, caps.input_rate * engine.input_chunk_ms // 1000 * 2)
        self._events: asyncio.Queue[port.EngineEvent] = asyncio.Queue()
        self._ids = itertools.count(1)
        #: The turn still taking caller audio (its input is not closed yet).
        self._input: _Turn | None = None
        #: The turn whose reply is being produced.
        self._reply: _Turn | None = None
        self._pending = bytearray()
        #: The conversation so far (what the next turn's prompt carries).
        self._history: list[_Message] = []
        self._lock = asyncio.Lock()
        self._closed = False

    # -- port calls -----------------------------------------------------------------------

    async def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> None:
        # The client's chunk hints are not read: this engine hears the audio itself.
        if self._closed or not pcm:
            return
        self._pending += pcm
        held = self._input is not None and self._input.committed
        if not held and len(self._pending) >= self._chunk_bytes:
            await self._send_pending()

    async def commit(
        self,
        *,
        item_id: str,
        response_id: str | None,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
    ) -> None:
        await self._send_pending()
        turn = self._input
        if turn is not None and turn.started:
            turn.committed = True
            turn.item_ids.append(item_id)
        if response_id is not None:
            await self._answer(response_id)

    async def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        message = _Message(role=role, text=text, item_id=item_id)
        index = next((i for i, m in enumerate(self._history) if m.item_id == previous_item_id), None)
        if previous_item_id is not None and index is not None:
            self._history.insert(index + 1, message)
        else:
            self._history.append(message)

    async def clear_input(self) -> None:
        """Drop the audio appended since the last commit; committed audio and the conversation stay."""
        self._pending.clear()
        turn = self._input
        if turn is None or turn.committed:
            return
        self._input = None
        if turn.started:
            await self._abort(turn)

    async def create_response(
        self, *, response_id: str, instructions: str | None, options: port.ResponseOptions | None = None
    ) -> None:
        if self._input is None or not self._input.committed:
            await self._send_pending()  # an uncommitted live turn is answered as it stands
        await self._answer(response_id)

    async def cancel_response(self, response_id: str) -> None:
        turn = self._reply
        if turn is not None and turn.response_id == response_id:
            await self._stop_reply(turn)

    async def barge_in(self) -> None:
        turn = self._reply
        if turn is not None:
            await self._stop_reply(turn)

    async def ack_playback(self, *, response_id: str, played_ms: int) -> None:
        return None  # a turn-based request keeps no playback ledger

    async def update(self, config: SessionConfig) -> None:
        self._config = config

    async def close(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        live = [t for t in (self._reply, self._input) if t is not None and t.started]
        self._reply = self._input = None
        for turn in live:
            await self._abort(turn)
        self._engine._release(self._session_id)
        self._events.put_nowait(port.EngineClosed(reason=reason))

    async def events(self) -> AsyncIterator[port.EngineEvent]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, port.EngineClosed):
                return

    # -- input -----------------------------------------------------------------------------

    async def _send_pending(self) -> None:
        if not self._pending or self._closed:
            return
        pcm, self._pending = bytes(self._pending), bytearray()
        async with self._lock:
            turn = self._input
            if turn is None:
                turn = self._input = _Turn(
                    request_id=f"{self._session_id}-turn{next(self._ids)}-{secrets.token_hex(4)}"
                )
                self._engine._route(turn.request_id, self)
            samples = codec.decode(pcm, Encoding.PCM16)
            audio = {"audio": (samples, self._input_rate)}
            if not turn.started:
                turn.started = True
                prompt = {"prompt": self._turn_prompt(), "multi_modal_data": audio}
                await self._engine._submit("add_request", turn.request_id, prompt, resumable=True)
            else:
                prompt = {"prompt": "", "multi_modal_data": audio}
                await self._engine._submit("add_streaming_update", turn.request_id, prompt, resumable=True)

    def _turn_prompt(self) -> str:
        return chatml(self._history, instructions=self._config.instructions, open_user=self._engine.prompt)

    async def _answer(self, response_id: str | None) -> None:
        """Close the open turn's input so the model replies, as ``response_id``."""
        async with self._lock:
            turn = self._input
            if turn is None or not turn.started or response_id is None:
                if response_id is not None:
                    self._events.put_nowait(port.EngineResponseStarted(response_id=response_id))
                    self._events.put_nowait(
                        port.EngineResponseDone(
                            response_id=response_id, status="failed", reason="no caller audio"
                        )
                    )
                return
            self._input = None
            if self._reply is not None and self._reply is not turn:
                await self._stop_reply(self._reply)
            self._start_reply(turn, response_id)
            turn.input_closed = True
            end = self._engine.end_of_input()
            await self._engine._submit("add_streaming_update", turn.request_id, end, resumable=False)

    def _start_reply(self, turn: _Turn, response_id: str) -> None:
        if turn.response_id is not None:
            return
        turn.response_id = response_id
        turn.audio = ReplyAudio(self._output_rate)
        # The caller's turn joins the conversation (its audio is not re-sent with later turns).
        self._history.append(
            _Message(role="user", text="", item_id=turn.item_ids[0] if turn.item_ids else None)
        )
        self._reply = turn
        self._events.put_nowait(port.EngineResponseStarted(response_id=response_id))

    # -- stopping ---------------------------------------------------------------------------

    async def _stop_reply(self, turn: _Turn) -> None:
        """Fence the reply (nothing more of it is emitted), then abort its request."""
        if self._reply is turn:
            self._reply = None
        if turn.response_id is not None:
            self._remember_reply(turn)
            self._events.put_nowait(port.EngineResponseDone(response_id=turn.response_id, status="cancelled"))
        await self._abort(turn)

    def _remember_reply(self, turn: _Turn) -> None:
        """The reply joins the conversation by its transcript (what was produced of it)."""
        if turn.transcript:
            self._history.append(_Message(role="assistant", text=turn.transcript, item_id=turn.response_id))

    async def _abort(self, turn: _Turn) -> None:
        self._engine._unroute(turn.request_id)
        await self._engine._abort(turn.request_id)

    # -- output (called by the engine's output pump) ---------------------------------------

    def on_output(self, message: Any) -> None:
        rid = str(message.request_id)
        turn = self._reply if self._reply is not None and self._reply.request_id == rid else None
        if turn is None:
            turn = self._input if self._input is not None and self._input.request_id == rid else None
            if turn is None:
                return  # fenced: a stopped reply or a forgotten turn
            # The model answers before the input was closed: the reply starts now.
            self._start_reply(turn, f"resp_{rid}")
        assert turn.response_id is not None and turn.audio is not None
        outputs = message.engine_outputs
        stage_id = int(getattr(message, "stage_id", 0) or 0)
        audio_cursor, text_cursor = turn.cursors.setdefault(
            stage_id, (AudioCursor(cumulative_prior=self._engine.cumulative_prior), TextCursor())
        )
        completion = next(iter(getattr(outputs, "outputs", None) or ()), None)
        mm = getattr(outputs, "multimodal_output", None)
        if not isinstance(mm, Mapping) or not mm:
            mm = getattr(completion, "multimodal_output", None)
        mm = mm if isinstance(mm, Mapping) else {}
        text = getattr(completion, "text", "") or ""
        audio = mm.get("audio")
        if audio is None:
            audio = mm.get("model_outputs")
        new_audio = audio_cursor.new_samples(to_mono(audio)) if audio is not None else _EMPTY
        new_text = text_cursor.new_text(str(text), cumulative=audio_cursor.cumulative)
        if new_text:
            turn.transcript += new_text
            self._events.put_nowait(port.EngineTranscript(response_id=turn.response_id, delta=new_text))
        if new_audio.size:
            rate = _last_int(mm.get("sr")) or DEFAULT_OUTPUT_RATE
            pcm = turn.audio.convert(new_audio, rate)
            if pcm:
                self._events.put_nowait(port.EngineAudio(response_id=turn.response_id, pcm=pcm))
        if getattr(message, "finished", False):
            self._finish_reply(turn, "completed", None)

    def on_error(self, request_id: str, error: str) -> None:
        turn = self._reply if self._reply is not None and self._reply.request_id == request_id else None
        if turn is None and self._input is not None and self._input.request_id == request_id:
            turn, self._input = self._input, None
        self._events.put_nowait(port.EngineError(code="engine_error", message=error))
        if turn is not None:
            self._finish_reply(turn, "failed", "engine_error")

    def _finish_reply(self, turn: _Turn, status: str, reason: str | None) -> None:
        self._engine._unroute(turn.request_id)
        if self._reply is turn:
            self._reply = None
        if self._input is turn:
            self._input = None
        if turn.response_id is None:
            return
        self._remember_reply(turn)
        if status == "completed" and turn.audio is not None:
            tail = turn.audio.flush()
            if tail:
                self._events.put_nowait(port.EngineAudio(response_id=turn.response_id, pcm=tail))
        self._events.put_nowait(
            port.EngineResponseDone(response_id=turn.response_id, status=status, reason=reason)
        )

    def engine_died(self, message: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._events.put_nowait(port.EngineError(code="engine_dead", message=message, fatal=True))
        self._events.put_nowait(port.EngineClosed(reason="engine_dead"))


# ---------------------------------------------------------------------------------------
# The engine


class VllmOmniStreamEngine(port.Engine):
    """Turn-based streaming input on an in-process vLLM-Omni ``AsyncOmni`` (see the module docstring).

    ``factory``: builds the ``AsyncOmni`` (a ``module:callable`` spec or a
    callable); without one, ``AsyncOmni(model=..., deploy_config=...,
    trust_remote_code=...)``.
    """

    name = "vllm-omni-stream"

    def __init__(
        self,
        *,
        factory: str | Callable[[], Any] | None = None,
        model: str | None = None,
        deploy_config: str | None = None,
        trust_remote_code: bool = False,
        startup_timeout_s: float = 600.0,
        abort_timeout_s: float = 10.0,
        input_rate: int | None = None,
        output_rate: int | None = None,
        input_chunk_ms: int = 100,
        prompt: str = "",
        max_sessions: int | None = None,
    ) -> None:
        if factory is None and not model:
            raise ValueError("the vllm-omni-stream engine needs a model or an omni factory")
        self._factory = factory
        self._model = model
        self._deploy_config = deploy_config
        self._trust_remote_code = trust_remote_code
        self.startup_timeout_s = startup_timeout_s
        self.abort_timeout_s = abort_timeout_s
        self.input_chunk_ms = input_chunk_ms
        self.prompt = prompt
        self._caps = port.EngineCapabilities(
            name=self.name,
            input_rate=input_rate or DEFAULT_INPUT_RATE,
            output_rate=output_rate or DEFAULT_OUTPUT_RATE,
            detects_turns=False,
            max_sessions=max_sessions,
            # No function calling: the turn's prompt is hand-rendered ChatML with no tool
            # block, and the model's text streams into its speech stage as it is made, so a
            # call would be spoken, not returned (vLLM-Omni's own Qwen duplex plugin refuses
            # tools for the same models). The gateway refuses tool_choice "required" for it.
            tools=False,
        )
        self._omni: Any = None
        self._core: Any = None
        self._tokens_prompt: Callable[..., Any] | None = None
        self._final_stage_id = 0
        self._final_output_stage_ids: list[int] | None = None
        self.cumulative_prior = True
        #: Every stage's sampling parameters for a streaming-input request (see :meth:`_resolve_sampling_params`).
        self.sampling_params_list: list[Any] | None = None
        self._sessions: dict[str, VllmOmniStreamSession] = {}
        self._routes: dict[str, VllmOmniStreamSession] = {}
        self._pump: asyncio.Task[None] | None = None
        # Engine submissions run input processing and may block on a full queue: keep
        # them off the event loop, in order, one at a time.
        self._submitter: ThreadPoolExecutor | None = None
        self._message_types: tuple[type[Any], type[Any]] | None = None
        self._dead: str | None = None

    @property
    def capabilities(self) -> port.EngineCapabilities:
        return self._caps

    @property
    def ready(self) -> bool:
        return (
            self._core is not None and self._dead is None and self._pump is not None and not self._pump.done()
        )

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def omni(self) -> Any:
        """The ``AsyncOmni`` (``None`` before :meth:`start`)."""
        return self._omni

    async def start(self) -> None:
        with keep_root_logging():
            self._tokens_prompt = importlib.import_module("vllm.inputs").TokensPrompt
            messages = importlib.import_module("vllm_omni.engine.messages")
            self._message_types = (messages.OutputMessage, messages.ErrorMessage)
            build = self._builder()
            self._omni = await asyncio.wait_for(asyncio.to_thread(build), self.startup_timeout_s)
        self._core = self._omni.engine
        self._resolve_stages()
        self._resolve_sampling_params()
        self._submitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omni-submit")
        self._pump = asyncio.create_task(self._pump_outputs(), name="vllm-omni-stream-outputs")
        logger.info(
            "vLLM-Omni stream engine ready: final stage %d, outputs from stages %s, %s outputs expected",
            self._final_stage_id,
            self._final_output_stage_ids,
            "cumulative" if self.cumulative_prior else "delta",
        )

    def _builder(self) -> Callable[[], Any]:
        return omni_builder(
            self._factory,
            "vllm_omni.entrypoints.async_omni:AsyncOmni",
            model=self._model,
            deploy_config=self._deploy_config,
            trust_remote_code=self._trust_remote_code,
        )

    def _resolve_stages(self) -> None:
        omni = self._omni
        offered = list(getattr(omni, "output_modalities", None) or [])
        modalities = [m for m in ("text", "audio") if m in offered] or None
        try:
            self._final_stage_id = int(omni._compute_final_stage_id(modalities))
            self._final_output_stage_ids = list(omni._compute_final_output_stage_ids(modalities)) or None
        except Exception as exc:  # noqa: BLE001 - older/other AsyncOmni: the last stage answers
            logger.info("final stage lookup failed (%s); using the last stage", exc)
            self._final_stage_id = max(0, int(getattr(self._core, "num_stages", 1)) - 1)
            self._final_output_stage_ids = None

    def _resolve_sampling_params(self) -> None:
        """The sampling parameters of vLLM-Omni's own streaming-input path.

        As its realtime connection does: the stages' defaults coerced to DELTA
        (cloned, ``skip_clone`` set); as ``AsyncOmni.generate`` does: the
        pipeline's sampling constraints applied, stage 0 validated for streaming
        input and cloned once.
        """
        omni = self._omni
        defaults = list(
            getattr(omni, "default_sampling_params_list", None)
            or getattr(self._core, "default_sampling_params_list", None)
            or []
        )
        if not defaults:
            raise RuntimeError("vLLM-Omni reports no default sampling parameters for its stages")
        coerce = importlib.import_module("vllm_omni.entrypoints.utils").coerce_param_message_types
        params = list(coerce(defaults, is_streaming=True))
        resolve = getattr(omni, "resolve_sampling_params_list", None)
        if resolve is not None:
            params = list(resolve(params))
        validate = getattr(omni, "_validate_streaming_input_sampling_params", None)
        if validate is not None:
            validate(params[0])  # ValueError: this model's stage 0 cannot take streaming input
        stage0 = params[0]
        if not getattr(stage0, "skip_clone", True):
            stage0 = stage0.clone()
            stage0.skip_clone = True
            params[0] = stage0
        self.sampling_params_list = params
        kind = getattr(params[min(self._final_stage_id, len(params) - 1)], "output_kind", None)
        self.cumulative_prior = getattr(kind, "name", "CUMULATIVE") != "DELTA"

    def end_of_input(self) -> Any:
        assert self._tokens_prompt is not None
        return self._tokens_prompt(prompt_token_ids=[0])

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        if not self.ready:
            raise port.EngineUnavailable(
                f"the vLLM-Omni engine is not running{f' ({self._dead})' if self._dead else ''}"
            )
        limit = self._caps.max_sessions
        if limit is not None and len(self._sessions) >= limit:
            raise port.EngineSessionLimit(f"the vLLM-Omni stream engine holds {limit} sessions already")
        session = VllmOmniStreamSession(self, session_id, config)
        self._sessions[session_id] = session
        return session

    # -- requests ---------------------------------------------------------------------------

    def _route(self, request_id: str, session: VllmOmniStreamSession) -> None:
        self._routes[request_id] = session

    def _unroute(self, request_id: str) -> None:
        self._routes.pop(request_id, None)

    def _release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def _submit(self, method: str, request_id: str, prompt: Any, *, resumable: bool) -> None:
        call = functools.partial(
            getattr(self._core, method),
            request_id,
            prompt,
            sampling_params_list=self.sampling_params_list,
            final_stage_id=self._final_stage_id,
            final_output_stage_ids=self._final_output_stage_ids,
            resumable=resumable,
        )
        await asyncio.get_running_loop().run_in_executor(self._submitter, call)

    async def _abort(self, request_id: str) -> None:
        """Abort one request and wait for the orchestrator to acknowledge it."""
        if self._core is None or self._dead is not None:
            return
        try:
            await self._core.abort_async([request_id], timeout=self.abort_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the reply is fenced already; report, do not fail the call
            logger.warning("aborting %s was not acknowledged: %s", request_id, exc)

    # -- the output pump ----------------------------------------------------------------------

    async def _pump_outputs(self) -> None:
        assert self._message_types is not None
        output_type, error_type = self._message_types
        core = self._core
        try:
            while True:
                message = await core.get_output_blocking_async(timeout=_OUTPUT_WAIT_S)
                if message is None:
                    continue
                request_id = getattr(message, "request_id", None)
                session = self._routes.get(str(request_id)) if request_id is not None else None
                if isinstance(message, output_type):
                    if session is not None:
                        session.on_output(message)
                elif isinstance(message, error_type):
                    if session is not None:
                        session.on_error(str(request_id), str(message.error))
                    elif getattr(message, "fatal", False) and request_id is None:
                        raise RuntimeError(str(message.error))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("the vLLM-Omni engine died")
            self._dead = str(exc) or type(exc).__name__
            for session in list(self._sessions.values()):
                session.engine_died(self._dead)
            self._sessions.clear()
            self._routes.clear()

    async def shutdown(self) -> None:
        for session in list(self._sessions.values()):
            with contextlib.suppress(Exception):
                await session.close("shutdown")
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        omni, self._omni, self._core = self._omni, None, None
        if omni is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(omni.shutdown), self.abort_timeout_s)
            except TimeoutError:
                logger.warning("vLLM-Omni did not shut down within %.0f s", self.abort_timeout_s)
        if self._submitter is not None:
            self._submitter.shutdown(wait=False, cancel_futures=True)
            self._submitter = None
