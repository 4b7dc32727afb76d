"""The fake model stage: everything vLLM-Omni runs except the model's stage process.

A real deployment starts one engine-core process per stage (a GPU worker) and the
orchestrator talks to it through a stage engine-core client. Here that client is
:class:`EchoStageClient`, in the orchestrator's own event loop: it takes the
``OmniEngineCoreRequest`` s the orchestrator submits, and when a turn's input is
complete it "generates" -- the turn's audio echoed back at 24 kHz in ``chunks``
pieces, ``chunk_delay_s`` apart, with a transcript whose tokens are spread over the
chunks -- as real ``OmniEngineCoreOutputs``. vLLM-Omni's real
``MultimodalOutputProcessor`` turns those into ``OmniRequestOutput`` s; the real
orchestrator thread, janus queues, stage pool, duplex session manager and runner
do the rest.

:class:`FakeStageEngineMixin` is the seam: mixed into ``DuplexOmniEngine`` or
``AsyncOmniEngine`` it replaces ``_resolve_stage_configs`` (the real pipeline +
deploy merge, without an HF model config) and ``_initialize_stages`` (this client
instead of a launched stage process). It also records the engine-side calls a test
asserts on (``add_request``, ``add_streaming_update``, ``abort_async`` and what the
stage saw) to the JSONL file named by ``FAKE_OMNI_CALL_LOG``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import soxr
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import FinishReason
from vllm_omni.config.stage_config import merge_pipeline_deploy
from vllm_omni.engine import OmniEngineCoreOutput, OmniEngineCoreOutputs, OmniEngineCoreRequest
from vllm_omni.engine.stage_pool import StagePool
from vllm_omni.engine.stage_runtime import StageRuntimeInfo
from vllm_omni.outputs.output_processor import MultimodalOutputProcessor

from tests.omni.fake_stage.plugin import (
    AUDIO_KEY,
    FUNCTION_OUTPUTS_KEY,
    RATE_KEY,
    TOOL_CALL_KEY,
    TOOL_CLOSE,
    TOOL_OPEN,
)

__all__ = ["CallLog", "EchoStageClient", "FakeInputProcessor", "FakeStageEngineMixin", "byte_tokenizer"]

OUTPUT_RATE = 24_000
MAX_MODEL_LEN = 1 << 20


# ---------------------------------------------------------------------------------------
# What the engine was asked to do, for tests


class CallLog:
    """Appends one JSON object per engine-side call to ``FAKE_OMNI_CALL_LOG`` (if set)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, call: str, **fields: Any) -> None:
        if not self.path:
            return
        record = {"t": time.monotonic(), "call": call, **fields}
        line = json.dumps(record, default=str)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


# ---------------------------------------------------------------------------------------
# A byte-level tokenizer, so transcripts travel as token ids and vLLM detokenizes them


def _bytes_to_unicode() -> dict[int, str]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), 256),
    ]
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes), strict=True))


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens plus an end-of-sequence token; decodes any UTF-8 text exactly."""
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab["<|eos|>"] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>")


# ---------------------------------------------------------------------------------------
# The stage engine-core client


def _float_audio(value: object) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy().reshape(-1)
    return np.asarray(value, dtype=np.float32).reshape(-1)


class EchoStageClient:
    """Stage 0 of the fake echo model (the part a GPU process would run)."""

    stage_type = "llm"
    model_stage = "echo"
    final_output = True
    final_output_type = "audio"
    prompt_transform_func = None
    prompt_expand_func = None
    custom_process_input_func = None
    requires_multimodal_data = False
    is_comprehension = True

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        calls: CallLog,
        *,
        chunks: int,
        chunk_delay_s: float,
        output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE,
    ) -> None:
        self.stage_id = 0
        self.replica_id = 0
        self.engine_input_source: list[int] = []
        self.default_sampling_params = SamplingParams(max_tokens=4096, output_kind=output_kind)
        self._tokenizer = tokenizer
        self._calls = calls
        self._chunks = max(1, chunks)
        self._chunk_delay_s = max(0.0, chunk_delay_s)
        self._pending: dict[str, list[np.ndarray]] = {}
        #: What a request's reply is besides the echo: a function call, or function outputs to use.
        self._asks: dict[str, dict[str, str]] = {}
        self._speaking: dict[str, asyncio.Task[None]] = {}
        self._outputs: asyncio.Queue[OmniEngineCoreOutputs] | None = None

    def _queue(self) -> asyncio.Queue[OmniEngineCoreOutputs]:
        if self._outputs is None:
            self._outputs = asyncio.Queue()
        return self._outputs

    # -- what StagePool calls --------------------------------------------------------------

    async def add_request_async(self, request: OmniEngineCoreRequest, **_: Any) -> None:
        rid = request.request_id
        buffer = getattr(request, "model_intermediate_buffer", None) or {}
        audio = buffer.get(AUDIO_KEY)
        parts = self._pending.setdefault(rid, [])
        asks = self._asks.setdefault(rid, {})
        for key in (TOOL_CALL_KEY, FUNCTION_OUTPUTS_KEY):
            if isinstance(buffer.get(key), str):
                asks[key] = buffer[key]
        samples = 0
        if audio is not None:
            rate = int(buffer.get(RATE_KEY) or 16_000)
            pcm = _float_audio(audio)
            samples = pcm.size
            if pcm.size and rate != OUTPUT_RATE:
                pcm = soxr.resample(pcm, rate, OUTPUT_RATE).astype(np.float32)
            parts.append(pcm)
        params = request.sampling_params
        self._calls.write(
            "stage.add_request",
            request_id=rid,
            resumable=bool(request.resumable),
            samples=samples,
            output_kind=getattr(getattr(params, "output_kind", None), "name", None),
            n=getattr(params, "n", None),
            stop=list(getattr(params, "stop", None) or []),
        )
        if not request.resumable:  # the turn's input is complete: answer it
            turn = self._pending.pop(rid)
            asks = self._asks.pop(rid, {})
            self._speaking[rid] = asyncio.create_task(self._speak(rid, turn, asks), name=f"fake-echo:{rid}")

    async def get_output_async(self) -> OmniEngineCoreOutputs:
        return await self._queue().get()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self._calls.write("stage.abort", request_ids=list(request_ids))
        for rid in request_ids:
            self._pending.pop(rid, None)
            self._asks.pop(rid, None)
            task = self._speaking.pop(rid, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def collective_rpc_async(
        self, method: str, timeout: float | None = None, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        return {"supported": False, "method": method}

    def set_engine_outputs(self, engine_outputs: Any) -> None:
        return None

    def process_engine_inputs(
        self, source_outputs: list[Any], prompt: Any = None, streaming_context: Any = None
    ) -> list[Any]:
        return []

    def get_kv_sender_info(self, **_: Any) -> None:
        return None

    def get_payload_sender_info(self) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        for task in self._speaking.values():
            task.get_loop().call_soon_threadsafe(task.cancel)
        self._speaking.clear()

    # -- generation ------------------------------------------------------------------------

    async def _speak(self, rid: str, parts: list[np.ndarray], asks: dict[str, str] | None = None) -> None:
        asks = asks or {}
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        seconds = audio.size / OUTPUT_RATE
        if TOOL_CALL_KEY in asks:
            # A function call instead of speech: its text in the model's tool-call markers, no audio.
            text = f"{TOOL_OPEN}{asks[TOOL_CALL_KEY]}{TOOL_CLOSE}"
            audio = np.zeros(0, dtype=np.float32)
        elif audio.size:
            text = f"(echo of {seconds:.1f} s of your audio)"
        else:
            text = "(nothing to echo)"
            audio = np.zeros(OUTPUT_RATE // 10, dtype=np.float32)
        if FUNCTION_OUTPUTS_KEY in asks:
            # The reply uses what the client's functions returned.
            said = "; ".join(json.loads(asks[FUNCTION_OUTPUTS_KEY]))
            text = f"(the function said: {said}) {text}"
        token_ids = self._tokenizer.encode(text, add_special_tokens=False)
        audio_chunks = np.array_split(audio, self._chunks)
        text_chunks = np.array_split(np.asarray(token_ids, dtype=np.int64), self._chunks)
        # Like a model, it stops on its end-of-sequence token (which is not detokenized).
        text_chunks[-1] = np.append(text_chunks[-1], self._tokenizer.eos_token_id)
        try:
            for index, (pcm, ids) in enumerate(zip(audio_chunks, text_chunks, strict=True)):
                if index and self._chunk_delay_s:
                    await asyncio.sleep(self._chunk_delay_s)
                last = index == len(audio_chunks) - 1
                output = OmniEngineCoreOutput(
                    request_id=rid,
                    new_token_ids=[int(i) for i in ids],
                    multimodal_output={
                        "audio": torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)),
                        "sr": torch.tensor(OUTPUT_RATE),
                    },
                    finish_reason=FinishReason.STOP if last else None,
                )
                await self._queue().put(OmniEngineCoreOutputs(outputs=[output]))
                self._calls.write(
                    "stage.chunk",
                    request_id=rid,
                    index=index,
                    samples=int(pcm.size),
                    tokens=len(ids),
                    final=last,
                )
        finally:
            if self._speaking.get(rid) is asyncio.current_task():
                del self._speaking[rid]


# ---------------------------------------------------------------------------------------
# Stage 0's input processor (what vLLM's InputProcessor + the model's processor do)


class FakeInputProcessor:
    """Turns an AsyncOmni prompt into the stage's ``OmniEngineCoreRequest``.

    Accepts ``{"prompt": str, "multi_modal_data": {"audio": (samples, rate) | [..]}}``
    (the shape vLLM-Omni's audio entrypoints submit) and ``TokensPrompt`` dicts.
    """

    renderer = None

    def __init__(self, tokenizer: PreTrainedTokenizerFast) -> None:
        self._tokenizer = tokenizer

    def process_inputs(
        self,
        request_id: str,
        prompt: Any,
        params: Any,
        supported_tasks: Any = None,
        arrival_time: float | None = None,
        lora_request: Any = None,
        tokenization_kwargs: Any = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        resumable: bool = False,
        **_: Any,
    ) -> OmniEngineCoreRequest:
        token_ids: list[int] | None = None
        text = ""
        buffer: dict[str, Any] | None = None
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, dict):
            token_ids = prompt.get("prompt_token_ids")
            text = str(prompt.get("prompt") or "")
            audio = (prompt.get("multi_modal_data") or {}).get("audio")
            if audio is not None:
                items = audio if isinstance(audio, list) else [audio]
                rates = {int(rate) for _, rate in items}
                if len(rates) != 1:
                    raise ValueError("audio items of one prompt must share a sample rate")
                samples = np.concatenate([_float_audio(pcm) for pcm, _ in items])
                buffer = {AUDIO_KEY: torch.from_numpy(samples), RATE_KEY: rates.pop()}
        else:
            raise TypeError(f"unsupported prompt type {type(prompt).__name__}")
        if token_ids is None:
            token_ids = self._tokenizer.encode(text, add_special_tokens=False) or [0]
        sampling_params = params.clone()
        if sampling_params.max_tokens is None:
            sampling_params.max_tokens = 4096
        return OmniEngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=list(token_ids),
            mm_features=None,
            sampling_params=sampling_params,
            pooling_params=None,
            arrival_time=arrival_time if arrival_time is not None else time.time(),
            lora_request=lora_request,
            cache_salt=None,
            data_parallel_rank=data_parallel_rank,
            priority=priority,
            trace_headers=trace_headers,
            resumable=resumable,
            external_req_id=request_id,
            model_intermediate_buffer=buffer,
        )


# ---------------------------------------------------------------------------------------
# The engine seam


class _FakeRuntime:
    """Stands in for ``StageRuntime``: owns the pools, launches nothing."""

    def __init__(self, stage_pools: list[StagePool]) -> None:
        self.stage_pools = stage_pools

    def create_membership_controller(self) -> None:
        return None

    def shutdown(self) -> None:
        for pool in self.stage_pools:
            for client in pool.clients:
                if client is not None:
                    client.shutdown()


class FakeStageEngineMixin:
    """Mixed into an Omni engine class: stage 0 is :class:`EchoStageClient`, in process."""

    calls: CallLog
    fake_chunks: int = 8
    fake_chunk_delay_s: float = 0.05
    #: What the stage's default sampling params ask the output processor for.
    fake_output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    # Any: the attributes below are the engine base's; this mixin fills the same seams.
    pipeline_config: Any
    deploy_config: Any
    _deploy_config_source: str | None
    model: str

    def _resolve_stage_configs(
        self, model: str, kwargs: dict[str, Any], *, trust_remote_code: bool | None
    ) -> tuple[str, list[Any]]:
        # The real pipeline + deploy merge; only the HF model config lookup is skipped.
        stage_configs = merge_pipeline_deploy(self.pipeline_config, self.deploy_config, {})
        return str(self._deploy_config_source), stage_configs

    def _initialize_stages(self, stage_init_timeout: int) -> None:
        tokenizer = byte_tokenizer()
        client = EchoStageClient(
            tokenizer,
            self.calls,
            chunks=self.fake_chunks,
            chunk_delay_s=self.fake_chunk_delay_s,
            output_kind=self.fake_output_kind,
        )
        processor = MultimodalOutputProcessor(
            tokenizer=tokenizer, log_stats=False, engine_core_output_type="audio"
        )
        # What the orchestrator reads of the stage's vllm config (request length limits).
        model_config = SimpleNamespace(
            model=self.model,
            max_model_len=MAX_MODEL_LEN,
            trust_remote_code=False,
            async_chunk=False,
            stage_id=0,
        )
        pool = StagePool(
            0,
            [client],
            output_processor=processor,
            stage_vllm_config=SimpleNamespace(model_config=model_config),
        )
        self._runtime = _FakeRuntime([pool])
        self.num_stages = 1
        self.stage_pools = [pool]
        self.stage_clients = [client]
        # No vllm config for the entrypoint layer: it would build a renderer and io processor.
        self.stage_vllm_configs = [None]
        self.output_processors = [processor]
        self.input_processor = FakeInputProcessor(tokenizer)
        self.prompt_transform_func = None
        self.prompt_expand_func = None
        self.default_sampling_params_list = [client.default_sampling_params]
        self.stage_metadata = [
            StageRuntimeInfo(
                final_output=True, final_output_type="audio", stage_type="llm", model_stage="echo"
            )
        ]
        self.supported_tasks = ("generate", "speech")
