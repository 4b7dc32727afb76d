"""The Realtime ``session`` object, both ways: wire JSON -> :class:`SessionPatch` and back.

A client may spell one session in three shapes, and this module reads all of
them (mixing is allowed; the GA nest wins over the flat keys when both name
the same setting):

* GA: ``{"type": "realtime", "output_modalities": [...], "audio": {"input":
  {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection", "transcription"},
  "output": {"format", "voice", "speed"}}}``;
* beta (flat): ``modalities``, ``input_audio_format: "pcm16"``, ``output_audio_format``,
  ``turn_detection``, ``voice``, ``speed``, ``input_audio_transcription``;
* vLLM-Omni ``DuplexClient``: the beta keys plus ``sample_rate_hz`` (the input rate),
  ``audio.input.sample_rate_hz`` / ``audio.output.sample_rate_hz``, ``model`` and
  ``extra_body``, of which the gateway itself reads ``auto_response`` (vLLM-Omni
  replaces the whole ``extra_body`` on an update, so one without it turns it off).

vLLM-Omni's own session fields (``ref_audio``, ``temperature``, ``max_output_tokens`` /
``max_tokens``, ``overlap_*``, ``playback_commit_policy``, ``idle_timeout_s``,
``initial_user_text``, ``use_tts_template``, noise reduction and the whole ``extra_body``)
are read into the configuration for the engines that take them. Keys this gateway does
not use (``tracing`` ...) are ignored. Everything here is pure: no I/O, no clock. The small typed field readers
at the top are shared with :mod:`duplex_gateway.dialects.realtime`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from duplex_gateway.dialects.fields import (
    JsonObject,
    as_bool,
    as_int,
    as_ms,
    as_number,
    as_object,
    as_str,
    invalid,
    join,
    max_tokens,
    opt_object,
)
from duplex_gateway.dialects.realtime_tools import (
    parse_include,
    parse_tool_choice,
    parse_tools,
    tool_choice_object,
    tool_object,
)
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import MAX_RATE, MIN_RATE, AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import (
    VLLM_OMNI_FIELDS,
    InputTranscription,
    Modality,
    SessionConfig,
    SessionKind,
    SessionPatch,
    TurnDetection,
    TurnDetectionMode,
)

__all__ = [
    "JsonObject",
    "encoding_for_name",
    "format_object",
    "parse_session_patch",
    "parse_turn_detection",
    "sample_rate",
    "session_payload",
    "transcription_object",
    "turn_detection_object",
    "wire_value",
]


MIN_SPEED = 0.25
MAX_SPEED = 1.5


# ---- audio formats ----

_ENCODING_NAMES: dict[str, Encoding] = {
    **dict.fromkeys(
        ("audio/pcm", "pcm", "pcm16", "audio/pcm16", "pcm_s16le", "audio/pcm_s16le", "s16le"), Encoding.PCM16
    ),
    **dict.fromkeys(("pcm_f32le", "audio/pcm_f32le", "f32le"), Encoding.PCM_F32LE),
    **dict.fromkeys(
        ("audio/pcmu", "pcmu", "g711_ulaw", "audio/g711_ulaw", "g711-ulaw", "mulaw", "ulaw", "audio/x-mulaw"),
        Encoding.G711_ULAW,
    ),
    **dict.fromkeys(
        ("audio/pcma", "pcma", "g711_alaw", "audio/g711_alaw", "g711-alaw", "alaw", "audio/x-alaw"),
        Encoding.G711_ALAW,
    ),
}
_G711 = (Encoding.G711_ULAW, Encoding.G711_ALAW)
_GA_TYPE = {
    Encoding.PCM16: "audio/pcm",
    Encoding.PCM_F32LE: "audio/pcm_f32le",
    Encoding.G711_ULAW: "audio/pcmu",
    Encoding.G711_ALAW: "audio/pcma",
}
_RATE_KEYS = ("rate", "sample_rate_hz", "sample_rate")


def encoding_for_name(name: str, param: str) -> Encoding:
    """The encoding a wire format name means (GA, beta and vLLM-Omni spellings)."""
    encoding = _ENCODING_NAMES.get(name.strip().lower())
    if encoding is None:
        raise invalid(param, f"unsupported audio format {name[:64]!r}", ErrorCode.UNSUPPORTED_AUDIO_FORMAT)
    return encoding


def sample_rate(value: object, param: str) -> int:
    """A sample rate the gateway takes (8-192 kHz)."""
    rate = as_int(value, param)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise invalid(
            param,
            f"sample rate {rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz",
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
        )
    return rate


def _first(candidates: list[tuple[Mapping[str, object] | None, str, str]]) -> tuple[object, str]:
    """The first candidate ``(obj, key, path)`` present with a non-null value."""
    for obj, key, path in candidates:
        if obj is not None and obj.get(key) is not None:
            return obj[key], join(path, key)
    return None, ""


def _audio_format(
    formats: list[tuple[Mapping[str, object] | None, str, str]],
    rates: list[tuple[Mapping[str, object] | None, str, str]],
) -> AudioFormat | None:
    """Resolve one direction's format; ``None`` when the client named neither format nor rate.

    A rate given without a format means PCM16 at that rate (a patch cannot say
    "keep the encoding, change the rate").
    """
    raw_format, format_param = _first(formats)
    rate_value, rate_param = None, ""
    encoding = Encoding.PCM16
    if isinstance(raw_format, str):
        encoding = encoding_for_name(raw_format, format_param)
    elif isinstance(raw_format, dict):
        name = raw_format.get("type")
        if name is None:
            name = raw_format.get("format", "audio/pcm")
        encoding = encoding_for_name(as_str(name, join(format_param, "type")), join(format_param, "type"))
        rate_value, rate_param = _first([(raw_format, key, format_param) for key in _RATE_KEYS])
    elif raw_format is not None:
        raise invalid(format_param, f"'{format_param}' must be a string or an object")
    if rate_value is None:
        rate_value, rate_param = _first(rates)
    if raw_format is None and rate_value is None:
        return None
    if rate_value is None:
        return AudioFormat(encoding=encoding, rate=8_000 if encoding in _G711 else 24_000)
    return AudioFormat(encoding=encoding, rate=sample_rate(rate_value, rate_param))


def format_object(fmt: AudioFormat) -> JsonObject:
    """The GA ``format`` object for ``fmt``."""
    obj: JsonObject = {"type": _GA_TYPE[fmt.encoding]}
    if fmt.encoding not in _G711 or fmt.rate != 8_000:
        obj["rate"] = fmt.rate
    return obj


# ---- turn detection ----

_TD_MODES = {mode.value: mode for mode in TurnDetectionMode}


def parse_turn_detection(value: object, path: str) -> TurnDetection | None:
    """``turn_detection``: ``null`` (the client commits turns), ``server_vad`` or ``semantic_vad``."""
    if value is None:
        return None
    obj = as_object(value, path)
    kind = obj.get("type", "server_vad")
    mode = _TD_MODES.get(as_str(kind, join(path, "type")))
    if mode is None:
        raise invalid(
            join(path, "type"),
            f"unsupported turn_detection type {str(kind)[:64]!r}",
            ErrorCode.UNSUPPORTED_TURN_DETECTION,
        )
    kwargs: dict[str, Any] = {"mode": mode}
    if obj.get("threshold") is not None:
        threshold = as_number(obj["threshold"], join(path, "threshold"))
        if not 0.0 < threshold < 1.0:
            raise invalid(join(path, "threshold"), "turn_detection.threshold must be between 0 and 1")
        kwargs["threshold"] = float(threshold)
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if obj.get(key) is not None:
            kwargs[key] = as_ms(obj[key], join(path, key))
    for key in ("create_response", "interrupt_response"):
        if obj.get(key) is not None:
            kwargs[key] = as_bool(obj[key], join(path, key))
    if obj.get("idle_timeout_ms") is not None:
        kwargs["idle_timeout_ms"] = as_ms(obj["idle_timeout_ms"], join(path, "idle_timeout_ms"))
    if obj.get("eagerness") is not None:
        kwargs["eagerness"] = as_str(obj["eagerness"], join(path, "eagerness"))
    try:
        return TurnDetection(**kwargs)
    except ProtocolError as exc:
        param = exc.param or "turn_detection"
        suffix = param.removeprefix("turn_detection")
        raise ProtocolError(exc.code, exc.message, param=path + suffix) from None


def turn_detection_object(td: TurnDetection | None) -> JsonObject | None:
    if td is None:
        return None
    if td.mode is TurnDetectionMode.SEMANTIC_VAD:
        return {
            "type": td.mode.value,
            "eagerness": td.eagerness,
            "create_response": td.create_response,
            "interrupt_response": td.interrupt_response,
        }
    return {
        "type": td.mode.value,
        "threshold": td.threshold,
        "prefix_padding_ms": td.prefix_padding_ms,
        "silence_duration_ms": td.silence_duration_ms,
        "create_response": td.create_response,
        "interrupt_response": td.interrupt_response,
        "idle_timeout_ms": td.idle_timeout_ms,
    }


# ---- session.update -> SessionPatch ----


def parse_modalities(value: object, param: str) -> tuple[Modality, ...]:
    if not isinstance(value, list) or not value:
        raise invalid(param, f"'{param}' must be a non-empty list of 'audio' / 'text'")
    out: list[Modality] = []
    for index, item in enumerate(value):
        if item not in ("audio", "text"):
            raise invalid(f"{param}[{index}]", f"'{param}' entries must be 'audio' or 'text'")
        modality = Modality(item)
        if modality not in out:
            out.append(modality)
    return tuple(out)


def _voice(value: object, param: str) -> str:
    if isinstance(value, dict) and "id" in value:  # GA custom voice reference {"id": ...}
        return as_str(value["id"], join(param, "id"), nonempty=True)
    return as_str(value, param, nonempty=True)


def _speed(value: object, param: str) -> float:
    speed = as_number(value, param)
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise invalid(param, f"'{param}' must be between {MIN_SPEED} and {MAX_SPEED}")
    return float(speed)


def parse_session_patch(session: Mapping[str, object], path: str = "session") -> SessionPatch:
    """Read a ``session.update``'s ``session`` object (any of the three shapes)."""
    kind = session.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in _KINDS):
        raise invalid(join(path, "type"), "session.type must be 'realtime' or 'transcription'")
    audio = opt_object(session, "audio", path)
    audio_path = join(path, "audio")
    ain = opt_object(audio, "input", audio_path) if audio is not None else None
    aout = opt_object(audio, "output", audio_path) if audio is not None else None
    in_path, out_path = join(audio_path, "input"), join(audio_path, "output")
    flat: list[tuple[Mapping[str, object] | None, str, str]] = [
        (session, key, path) for key in ("sample_rate_hz", "sample_rate")
    ]

    patch: dict[str, Any] = {}
    if kind is not None:
        patch["kind"] = _KINDS[str(kind)]
    if session.get("model") is not None:
        patch["model"] = as_str(session["model"], join(path, "model"), nonempty=True)
    if "instructions" in session:
        value = session["instructions"]
        patch["instructions"] = "" if value is None else as_str(value, join(path, "instructions"))
    modalities, param = _first([(session, "output_modalities", path), (session, "modalities", path)])
    if modalities is not None:
        patch["output_modalities"] = parse_modalities(modalities, param)
    voice, param = _first([(aout, "voice", out_path), (session, "voice", path)])
    if voice is not None:
        patch["voice"] = _voice(voice, param)
    speed, param = _first([(aout, "speed", out_path), (session, "speed", path)])
    if speed is not None:
        patch["speed"] = _speed(speed, param)

    input_format = _audio_format(
        [(ain, "format", in_path), (session, "input_audio_format", path)],
        [(ain, key, in_path) for key in ("sample_rate_hz", "sample_rate")] + flat,
    )
    if input_format is not None:
        patch["input_format"] = input_format
    output_format = _audio_format(
        [(aout, "format", out_path), (session, "output_audio_format", path)],
        [
            (aout, "sample_rate_hz", out_path),
            (aout, "sample_rate", out_path),
            (session, "output_sample_rate_hz", path),
        ],
    )
    if output_format is not None:
        patch["output_format"] = output_format

    if ain is not None and "turn_detection" in ain:
        patch["turn_detection"] = parse_turn_detection(ain["turn_detection"], join(in_path, "turn_detection"))
    elif "turn_detection" in session:
        patch["turn_detection"] = parse_turn_detection(
            session["turn_detection"], join(path, "turn_detection")
        )

    if ain is not None and "transcription" in ain:
        patch["input_transcription"] = _transcription(ain["transcription"], join(in_path, "transcription"))
    elif "input_audio_transcription" in session:
        patch["input_transcription"] = _transcription(
            session["input_audio_transcription"], join(path, "input_audio_transcription")
        )
    if session.get("extra_body") is not None:  # vLLM-Omni ignores a null one
        extra_body = dict(as_object(session["extra_body"], join(path, "extra_body")))
        patch["extra_body"] = extra_body
        # vLLM-Omni's own test (``extra.get("auto_response") is True``): anything else is off.
        patch["auto_response"] = extra_body.get("auto_response") is True
    patch.update(_omni_fields(session, ain, path, in_path))
    if "tools" in session:
        patch["tools"] = parse_tools(session["tools"], join(path, "tools"))
    if "tool_choice" in session:
        patch["tool_choice"] = parse_tool_choice(session["tool_choice"], join(path, "tool_choice"))
    if "include" in session:
        patch["include"] = parse_include(session["include"], join(path, "include"))
    return SessionPatch(**patch)


def _nonnegative(value: object, param: str) -> float:
    number = as_number(value, param)
    if number < 0:
        raise invalid(param, f"'{param}' must be >= 0")
    return number


def _positive(value: object, param: str) -> float:
    number = as_number(value, param)
    if number <= 0:
        raise invalid(param, f"'{param}' must be > 0")
    return number


_OMNI_READERS: tuple[tuple[str, str, Any], ...] = (
    ("ref_audio", "ref_audio", lambda v, p: as_str(v, p, nonempty=True)),
    ("temperature", "temperature", _nonnegative),
    ("overlap_policy", "overlap_policy", lambda v, p: as_str(v, p, nonempty=True)),
    ("overlap_short_ack_ms", "overlap_short_ack_ms", _nonnegative),
    ("overlap_barge_in_ms", "overlap_barge_in_ms", _nonnegative),
    ("overlap_silence_rms", "overlap_silence_rms", _nonnegative),
    ("playback_commit_policy", "playback_commit_policy", lambda v, p: as_str(v, p, nonempty=True)),
    ("idle_timeout_s", "idle_timeout_s", _positive),
    ("initial_user_text", "initial_user_text", as_str),
    ("use_tts_template", "use_tts_template", as_bool),
)


def _omni_fields(
    session: Mapping[str, object], ain: Mapping[str, object] | None, path: str, in_path: str
) -> dict[str, Any]:
    """vLLM-Omni's session fields (``null`` puts one back to the engine's default)."""
    fields: dict[str, Any] = {}
    for key, name, read in _OMNI_READERS:
        if key in session:
            value = session[key]
            fields[name] = None if value is None else read(value, join(path, key))
    for key in ("max_output_tokens", "max_response_output_tokens", "max_tokens"):
        if key in session:
            value = session[key]
            fields["max_output_tokens"] = None if value is None else max_tokens(value, join(path, key))
            break
    if ain is not None and "noise_reduction" in ain:
        source, param = ain["noise_reduction"], join(in_path, "noise_reduction")
    elif "input_audio_noise_reduction" in session:
        source, param = session["input_audio_noise_reduction"], join(path, "input_audio_noise_reduction")
    else:
        return fields
    fields["noise_reduction"] = None if source is None else dict(as_object(source, param))
    return fields


_KINDS = {kind.value: kind for kind in SessionKind}


def _transcription(value: object, param: str) -> InputTranscription | None:
    if value is None:
        return None
    obj = as_object(value, param)
    settings: dict[str, str] = {}
    for key in ("model", "language", "prompt"):
        if obj.get(key) is not None:
            settings[key] = as_str(obj[key], join(param, key))
    return InputTranscription(**settings)


def transcription_object(transcription: InputTranscription | None) -> JsonObject | None:
    """The transcription settings as the client sent them (OpenAI echoes them so)."""
    if transcription is None:
        return None
    obj: JsonObject = {"model": transcription.model}
    if transcription.language is not None:
        obj["language"] = transcription.language
    if transcription.prompt is not None:
        obj["prompt"] = transcription.prompt
    return obj


# ---- SessionConfig -> session object ----


#: The beta session object's ``model`` is one of these names (the beta protocol is frozen):
#: strict beta clients reject any other, so another model name is not shown to them.
_BETA_MODELS = frozenset(
    {
        "gpt-realtime",
        "gpt-realtime-2025-08-28",
        "gpt-4o-realtime-preview",
        "gpt-4o-realtime-preview-2024-10-01",
        "gpt-4o-realtime-preview-2024-12-17",
        "gpt-4o-realtime-preview-2025-06-03",
        "gpt-4o-mini-realtime-preview",
        "gpt-4o-mini-realtime-preview-2024-12-17",
    }
)


def session_payload(
    config: SessionConfig,
    *,
    session_id: str,
    beta: bool,
    capabilities: tuple[tuple[str, object], ...] = (),
) -> JsonObject:
    """The ``session`` object of ``session.created`` / ``session.updated``."""
    transcription = transcription_object(config.input_transcription)
    payload: JsonObject
    if config.kind is SessionKind.TRANSCRIPTION and not beta:
        payload = {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "audio": {
                "input": {
                    "format": format_object(config.input_format),
                    "transcription": transcription,
                    "turn_detection": turn_detection_object(config.turn_detection),
                    "noise_reduction": None,
                },
            },
            "include": None,
        }
        if capabilities:
            payload["capabilities"] = {key: wire_value(value) for key, value in capabilities}
        return payload
    modalities = [modality.value for modality in config.output_modalities]
    if beta:
        payload = {
            "id": session_id,
            "object": "realtime.session",
            "model": config.model if config.model in _BETA_MODELS else None,
            "instructions": config.instructions,
            "modalities": modalities,
            "voice": config.voice,
            "speed": config.speed,
            "input_audio_format": config.input_format.encoding.value,
            "output_audio_format": config.output_format.encoding.value,
            "input_audio_transcription": transcription,
            "turn_detection": turn_detection_object(config.turn_detection),
            # vLLM-Omni extensions: beta names carry no rate.
            "sample_rate_hz": config.input_format.rate,
            "output_sample_rate_hz": config.output_format.rate,
        }
    else:
        payload = {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": config.model,
            "instructions": config.instructions,
            "output_modalities": modalities,
            "audio": {
                "input": {
                    "format": format_object(config.input_format),
                    "turn_detection": turn_detection_object(config.turn_detection),
                    "transcription": transcription,
                },
                "output": {
                    "format": format_object(config.output_format),
                    "voice": config.voice,
                    "speed": config.speed,
                },
            },
        }
    payload.update(_omni_payload(config, beta=beta))
    if config.noise_reduction is not None:
        if beta:
            payload["input_audio_noise_reduction"] = dict(config.noise_reduction)
        else:
            audio = payload["audio"]
            assert isinstance(audio, dict)
            audio["input"]["noise_reduction"] = dict(config.noise_reduction)
    if config.kind is SessionKind.REALTIME:
        payload["tools"] = [tool_object(tool) for tool in config.tools]
        choice = tool_choice_object(config.tool_choice)
        # The beta session's tool_choice is a string: a forced function reads as "required" there.
        payload["tool_choice"] = "required" if beta and not isinstance(choice, str) else choice
    if config.include:
        payload["include"] = list(config.include)
    if capabilities:
        payload["capabilities"] = {key: wire_value(value) for key, value in capabilities}
    return payload


def _omni_payload(config: SessionConfig, *, beta: bool) -> JsonObject:
    """The vLLM-Omni session fields the client set, under the names it set them by."""
    out: JsonObject = {}
    for name in VLLM_OMNI_FIELDS:
        value = getattr(config, name)
        if value is None or name == "noise_reduction" or (name == "extra_body" and not value):
            continue
        if name == "max_output_tokens":
            out["max_response_output_tokens" if beta else "max_output_tokens"] = value
        else:
            out[name] = wire_value(value)
    return out


def wire_value(value: object) -> object:
    """``value`` with tuples turned into lists and mapping keys into strings (JSON-ready)."""
    if isinstance(value, Mapping):
        return {str(key): wire_value(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [wire_value(item) for item in value]
    if isinstance(value, Modality | Encoding | TurnDetectionMode):
        return value.value
    return value
