"""The Live API's session object: ``session.start``'s configuration in, the session resource out.

:func:`parse_start` reads a ``session.start``'s ``session`` strictly (unknown fields refused) into a
:class:`LiveSetup`: what the gateway's session takes (:meth:`LiveSetup.patch`, the startup history as
conversation items) and what only the Live client sees echoed (delegation settings, ``store``).
:func:`parse_update` reads a ``session.update``, which may change delegation settings only, within
the startup mode. :func:`session_resource` renders the resolved session as ``session.started``,
``session.updated`` and ``session.closed`` carry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from duplex_gateway.dialects.live_backend import backend_tool
from duplex_gateway.dialects.live_errors import (
    DELEGATION_MODE_MISMATCH,
    INVALID_VALUE,
    NOT_SUPPORTED,
    bad_value,
    check_fields,
    missing,
    read_bool,
    read_int,
    read_object,
    read_str,
    refuse,
    wrong_type,
)
from duplex_gateway.vocabulary.commands import ConversationItemCreate
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import (
    FunctionTool,
    InputTranscription,
    Modality,
    SessionConfig,
    SessionPatch,
    ToolChoice,
    ToolChoiceMode,
    TurnDetection,
)

__all__ = [
    "DELEGATE_TOOL",
    "MAX_INPUT_ITEMS",
    "Delegation",
    "HistoryMessage",
    "LiveSetup",
    "engine_tools",
    "parse_start",
    "parse_update",
    "session_resource",
]

JsonObject = dict[str, object]

#: The most startup ``input`` messages a session takes.
MAX_INPUT_ITEMS = 128

#: The one function a client-delegation session offers its engine: calling it is the engine handing
#: work to the application, which the client sees as ``session.delegation.created`` (a Live
#: delegation names no task, so the function takes no arguments).
DELEGATE_TOOL = FunctionTool(
    name="delegate",
    description=(
        "Hand the caller's request to the application when it needs information or an action you do not "
        "have; keep talking meanwhile, and use what comes back."
    ),
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
)

_SESSION_FIELDS = ("model", "instructions", "audio", "delegation", "input", "store")
_STARTUP_ONLY = dict.fromkeys(
    ("model", "instructions", "audio", "input", "store"), " It can only be set by session.start."
)
_AUDIO_RATES: Mapping[str, tuple[Encoding, tuple[int, ...]]] = {
    "audio/pcm": (Encoding.PCM16, (16_000, 24_000)),
    "audio/pcmu": (Encoding.G711_ULAW, (8_000,)),
    "audio/pcma": (Encoding.G711_ALAW, (8_000,)),
}
_WIRE_TYPE = {encoding: kind for kind, (encoding, _) in _AUDIO_RATES.items()}
_HISTORY_PART = {"developer": "input_text", "user": "input_text", "assistant": "output_text"}
#: Startup history roles as the gateway's conversation names them.
_HISTORY_ROLE = {"developer": "system", "user": "user", "assistant": "assistant"}
#: Responses settings the gateway echoes (its one engine runs the delegated work itself).
_RESPONSES_FIELDS = (
    "model",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "service_tier",
    "max_output_tokens",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Delegation:
    """Who does delegated work: ``client`` (the application) or ``responses`` (a backend model)."""

    target: str = "client"
    acknowledgement_delay_ms: int | None = None
    #: ``responses`` settings as resolved: only function tools stay, the engine being the one to call them.
    responses: Mapping[str, object] = field(default_factory=dict)
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice | None = None
    #: Tools the client named that the gateway cannot run (hosted ones), by type.
    dropped_tools: tuple[str, ...] = ()

    def wire(self) -> JsonObject:
        wire: JsonObject = {"type": self.target}
        if self.target == "responses":
            wire["responses"] = dict(self.responses)
        if self.acknowledgement_delay_ms is not None:
            wire["acknowledgement_delay_ms"] = self.acknowledgement_delay_ms
        return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryMessage:
    """One message of the startup ``input``."""

    role: str
    text: str
    item_id: str | None = None

    def wire(self) -> JsonObject:
        wire: JsonObject = {
            "type": "message",
            "role": self.role,
            "content": [{"type": _HISTORY_PART[self.role], "text": self.text}],
        }
        if self.item_id is not None:
            wire["id"] = self.item_id
        return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSetup:
    """A ``session.start``'s configuration, validated."""

    model: str
    instructions: str | None = None
    voice: str | None = None
    audio_format: AudioFormat = field(
        default_factory=lambda: AudioFormat(encoding=Encoding.PCM16, rate=24_000)
    )
    delegation: Delegation = field(default_factory=Delegation)
    history: tuple[HistoryMessage, ...] = ()
    #: The client asked for the session to be kept; the gateway keeps none, so it resolves to false.
    store_requested: bool = False

    def patch(self, *, backend: bool = False) -> SessionPatch:
        """What the gateway's session takes: one format both ways, spoken replies, the caller's words, turns
        the model or the gateway takes (no client event asks for a reply).

        ``backend``: Responses delegation goes to the gateway's backend model, so the engine's one
        function hands work to it; without one the engine calls the client's functions itself.
        """
        delegation = self.delegation
        changes: dict[str, object] = {"tools": engine_tools(delegation, backend=backend)}
        if self.instructions:
            changes["instructions"] = self.instructions
        if self.voice is not None:
            changes["voice"] = self.voice
        if delegation.tool_choice is not None and not backend:
            changes["tool_choice"] = delegation.tool_choice
        return SessionPatch(
            model=self.model,
            input_format=self.audio_format,
            output_format=self.audio_format,
            output_modalities=(Modality.AUDIO,),
            input_transcription=InputTranscription(),
            # The model decides when to speak: an engine with turn-taking of its own uses it
            # (vLLM-Omni's auto_response); for the others the gateway's turn detection answers
            # each turn and a caller who speaks over a reply stops it.
            turn_detection=TurnDetection(create_response=True, interrupt_response=True),
            # ... unless it was a backchannel ("mm-hm"): the reply is held while that is judged.
            hold_for_backchannels=True,
            auto_response=True,
            **changes,  # type: ignore[arg-type]
        )

    def history_items(self, event_id: str | None) -> tuple[ConversationItemCreate, ...]:
        """The startup history as conversation items, in order, on behalf of ``session.start`` ``event_id``."""
        return tuple(
            ConversationItemCreate(
                event_id=event_id,
                item_id=message.item_id,
                role=_HISTORY_ROLE[message.role],
                text=message.text,
            )
            for message in self.history
        )


def parse_start(session: Mapping[str, object]) -> LiveSetup:
    """Read ``session.start``'s ``session`` object."""
    check_fields(session, _SESSION_FIELDS, "session")
    model = read_str(session, "model", "session", required=True)
    assert model is not None
    if not model:
        raise bad_value("session.model", model)
    instructions = read_str(session, "instructions", "session")
    voice, audio_format = _audio(read_object(session, "audio", "session"))
    delegation_obj = read_object(session, "delegation", "session")
    delegation = Delegation() if delegation_obj is None else _delegation(delegation_obj, "session.delegation")
    return LiveSetup(
        model=model,
        instructions=instructions.strip() or None if instructions is not None else None,
        voice=voice,
        audio_format=audio_format,
        delegation=delegation,
        history=_history(session.get("input")),
        store_requested=bool(read_bool(session, "store", "session")),
    )


def engine_tools(delegation: Delegation, *, backend: bool = False) -> tuple[FunctionTool, ...]:
    """The functions the voice engine may call under ``delegation`` (see :meth:`LiveSetup.patch`)."""
    if delegation.target == "client":
        return (DELEGATE_TOOL,)
    if backend:
        return (backend_tool(delegation.responses, delegation.tools),)
    return delegation.tools


def parse_update(
    session: Mapping[str, object], current: Delegation, *, backend: bool = False
) -> tuple[Delegation, SessionPatch]:
    """Read ``session.update``'s ``session``: delegation settings of the session's own mode.

    ``backend``: the session's Responses delegation goes to the gateway's backend model (whose
    settings change; the engine's function is described anew).
    """
    check_fields(session, ("delegation",), "session", why=_STARTUP_ONLY)
    obj = read_object(session, "delegation", "session")
    if obj is None:
        return current, SessionPatch()
    kind = read_str(obj, "type", "session.delegation", required=True)
    if kind != current.target:
        raise refuse(
            DELEGATION_MODE_MISMATCH,
            f"The session delegates to '{current.target}'; its delegation type cannot change to '{kind}'. "
            "Start a new session for another mode.",
            param="session.delegation.type",
        )
    update = _delegation(obj, "session.delegation", update=True)
    merged_responses = {**current.responses, **update.responses}
    delegation = replace(
        current,
        acknowledgement_delay_ms=(
            update.acknowledgement_delay_ms
            if update.acknowledgement_delay_ms is not None
            else current.acknowledgement_delay_ms
        ),
        responses=merged_responses,
        tools=update.tools if "tools" in update.responses else current.tools,
        tool_choice=update.tool_choice if update.tool_choice is not None else current.tool_choice,
        dropped_tools=update.dropped_tools if "tools" in update.responses else current.dropped_tools,
    )
    changes: dict[str, object] = {}
    if backend:
        if "tools" in update.responses or "instructions" in update.responses:
            changes["tools"] = engine_tools(delegation, backend=True)
    else:
        if "tools" in update.responses:
            changes["tools"] = update.tools
        if update.tool_choice is not None:
            changes["tool_choice"] = update.tool_choice
    return delegation, SessionPatch(**changes)  # type: ignore[arg-type]


def _audio(audio: Mapping[str, object] | None) -> tuple[str | None, AudioFormat]:
    default = AudioFormat(encoding=Encoding.PCM16, rate=24_000)
    if audio is None:
        return None, default
    check_fields(audio, ("format", "output"), "session.audio")
    voice: str | None = None
    output = read_object(audio, "output", "session.audio")
    if output is not None:
        check_fields(output, ("voice",), "session.audio.output")
        voice = _voice(output.get("voice"))
    fmt = read_object(audio, "format", "session.audio")
    if fmt is None:
        return voice, default
    check_fields(fmt, ("type", "rate"), "session.audio.format")
    kind = read_str(fmt, "type", "session.audio.format", required=True)
    if kind not in _AUDIO_RATES:
        raise bad_value("session.audio.format.type", kind, _AUDIO_RATES)
    encoding, rates = _AUDIO_RATES[str(kind)]
    rate = read_int(fmt, "rate", "session.audio.format")
    if rate is None:
        rate = rates[-1]
    if rate not in rates:
        raise bad_value("session.audio.format.rate", rate, rates)
    return voice, AudioFormat(encoding=encoding, rate=rate)


def _voice(value: object) -> str | None:
    param = "session.audio.output.voice"
    if value is None:
        return None
    if isinstance(value, dict):  # a custom voice, by id
        check_fields(value, ("id",), param)
        voice = read_str(value, "id", param, required=True)
    elif isinstance(value, str):
        voice = value
    else:
        raise wrong_type(param, "a string or an object", value)
    if not voice:
        raise bad_value(param, voice)
    return voice


def _delegation(obj: Mapping[str, object], path: str, *, update: bool = False) -> Delegation:
    kind = read_str(obj, "type", path, required=True)
    if kind == "decisions":
        raise refuse(
            NOT_SUPPORTED,
            "Decisions delegation is not supported by this gateway; use 'client' or 'responses'.",
            param=f"{path}.type",
        )
    if kind not in ("client", "responses"):
        raise bad_value(f"{path}.type", kind, ("client", "responses"))
    allowed = ("type", "acknowledgement_delay_ms") + (("responses",) if kind == "responses" else ())
    check_fields(obj, allowed, path)
    delay = read_int(obj, "acknowledgement_delay_ms", path)
    if kind == "client":
        return Delegation(target="client", acknowledgement_delay_ms=delay)
    responses = read_object(obj, "responses", path, required=not update)
    return _responses(responses or {}, f"{path}.responses", delay)


def _responses(obj: Mapping[str, object], path: str, delay: int | None) -> Delegation:
    check_fields(obj, _RESPONSES_FIELDS, path)
    for key in ("model", "instructions", "service_tier"):
        read_str(obj, key, path)
    read_bool(obj, "parallel_tool_calls", path)
    read_int(obj, "max_output_tokens", path, minimum=1)
    for key in ("reasoning", "text"):
        read_object(obj, key, path)
    resolved: dict[str, object] = {key: obj[key] for key in _RESPONSES_FIELDS if obj.get(key) is not None}
    tools: tuple[FunctionTool, ...] = ()
    dropped: tuple[str, ...] = ()
    if "tools" in resolved:
        tools, kept, dropped = _tools(resolved["tools"], f"{path}.tools")
        resolved["tools"] = kept
    choice = (
        _tool_choice(resolved["tool_choice"], f"{path}.tool_choice") if "tool_choice" in resolved else None
    )
    return Delegation(
        target="responses",
        acknowledgement_delay_ms=delay,
        responses=resolved,
        tools=tools,
        tool_choice=choice,
        dropped_tools=dropped,
    )


def _tools(value: object, path: str) -> tuple[tuple[FunctionTool, ...], list[object], tuple[str, ...]]:
    if not isinstance(value, list):
        raise wrong_type(path, "an array", value)
    tools: list[FunctionTool] = []
    kept: list[object] = []
    dropped: list[str] = []
    for index, tool in enumerate(value):
        at = f"{path}[{index}]"
        if not isinstance(tool, dict):
            raise wrong_type(at, "an object", tool)
        kind = read_str(tool, "type", at, required=True)
        if kind != "function":
            dropped.append(str(kind))  # hosted tools need OpenAI's servers; the engine has none of them
            continue
        check_fields(tool, ("type", "name", "description", "parameters", "strict"), at)
        name = read_str(tool, "name", at, required=True)
        if not name:
            raise bad_value(f"{at}.name", name)
        parameters = read_object(tool, "parameters", at) or {}
        tools.append(
            FunctionTool(
                name=str(name), description=read_str(tool, "description", at) or "", parameters=parameters
            )
        )
        kept.append(tool)
    return tuple(tools), kept, tuple(dropped)


def _tool_choice(value: object, path: str) -> ToolChoice:
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise bad_value(path, value, ("auto", "none", "required"))
        return ToolChoice(mode=ToolChoiceMode(value))
    if isinstance(value, dict) and value.get("type") == "function":
        check_fields(value, ("type", "name"), path)
        name = read_str(value, "name", path, required=True)
        return ToolChoice(mode=ToolChoiceMode.REQUIRED, function=name)
    raise wrong_type(path, "'auto', 'none', 'required' or a function choice", value)


def _history(value: object) -> tuple[HistoryMessage, ...]:
    path = "session.input"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise wrong_type(path, "an array", value)
    if len(value) > MAX_INPUT_ITEMS:
        raise refuse(
            INVALID_VALUE,
            f"Invalid '{path}': array too long. Expected an array with maximum length {MAX_INPUT_ITEMS}, "
            f"but got an array with length {len(value)} instead.",
            param=path,
        )
    return tuple(_message(item, f"{path}[{index}]") for index, item in enumerate(value))


def _message(item: object, path: str) -> HistoryMessage:
    if not isinstance(item, dict):
        raise wrong_type(path, "an object", item)
    check_fields(item, ("type", "role", "content", "id", "status"), path)
    kind = read_str(item, "type", path)
    if kind not in (None, "message"):
        raise bad_value(f"{path}.type", kind, ("message",))
    role = read_str(item, "role", path, required=True)
    if role not in _HISTORY_PART:
        raise bad_value(f"{path}.role", role, _HISTORY_PART)
    read_str(item, "status", path)
    content = item.get("content")
    if content is None:
        raise missing(f"{path}.content")
    if not isinstance(content, list):
        raise wrong_type(f"{path}.content", "an array", content)
    if len(content) != 1:
        raise refuse(
            INVALID_VALUE,
            f"Invalid '{path}.content': a startup message takes exactly one text part.",
            param=f"{path}.content",
        )
    part = content[0]
    at = f"{path}.content[0]"
    if not isinstance(part, dict):
        raise wrong_type(at, "an object", part)
    check_fields(part, ("type", "text"), at)
    part_type = read_str(part, "type", at)
    accepted = ("output_text", "text") if role == "assistant" else ("input_text",)
    if part_type is not None and part_type not in accepted:
        raise bad_value(f"{at}.type", part_type, accepted)
    text = read_str(part, "text", at, required=True)
    return HistoryMessage(role=str(role), text=str(text), item_id=read_str(item, "id", path))


def session_resource(
    config: SessionConfig, setup: LiveSetup, delegation: Delegation, *, session_id: str, expires_at: int
) -> JsonObject:
    """The resolved session: what the client asked for, as the gateway serves it."""
    fmt = config.output_format
    resource: JsonObject = {
        "id": session_id,
        "expires_at": expires_at,
        "model": config.model,
        "status": "active",  # always, even in session.closed: the event type says it closed
        "audio": {
            "format": {"type": _WIRE_TYPE.get(fmt.encoding, "audio/pcm"), "rate": fmt.rate},
            "output": {"voice": config.voice},
        },
        "delegation": delegation.wire(),
        "store": False,
    }
    if config.instructions:
        resource["instructions"] = config.instructions
    if setup.history:
        resource["input"] = [message.wire() for message in setup.history]
    return resource
