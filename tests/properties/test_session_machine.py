"""The session state machine, driven by arbitrary interleavings of everything that can reach it.

One example is one session's life: client commands (every command dataclass, with
plausible and implausible fields), engine events (for replies the session asked for,
replies it already cancelled, and replies it never heard of), caller audio with VAD
windows, the clock, and the engine's answers to updates, in any order. The harness
plays the connection's part (it opens the engine when asked, feeds processed audio
back, encodes reply audio through the real output stage) and checks, after every step:

* nothing but the documented outputs comes out, and no exception escapes;
* every server event renders to JSON, and for a Realtime session configured in
  OpenAI's terms validates strictly against the ``openai`` SDK's models (GA and
  beta), unless it is a documented extension;
* no delta of a reply reaches the client after that reply's ``response.done``, and no
  reply is done twice;
* what the client is told was played or heard never exceeds the audio produced;
* ``CloseSession`` comes at most once, last, and nothing follows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duplex_gateway.audio.stage import OutputStage
from duplex_gateway.dialects.realtime import render_server_event
from duplex_gateway.engine import port
from duplex_gateway.session.machine import (
    AckPlayback,
    CloseSession,
    CommitInput,
    EngineCall,
    Handshake,
    OpenEngine,
    Output,
    ProcessInput,
    Session,
    StartResponse,
    TruncateReply,
    UpdateEngine,
)
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import (
    CLOSING_EVENT,
    LATENCY_EVENT,
    FunctionTool,
    InputTranscription,
    Modality,
    SessionConfig,
    SessionKind,
    SessionPatch,
    ToolChoice,
    ToolChoiceMode,
    TurnDetection,
)
from tests.properties.settings import examples
from tests.sdk_models import EXTENSION_EVENTS, validate_server_event

#: Engines of every shape the session adapts to.
ENGINES = (
    port.EngineCapabilities(name="echo", input_rate=24_000, output_rate=24_000),
    port.EngineCapabilities(
        name="embedded",
        input_rate=16_000,
        output_rate=22_050,
        input_transcription=True,
        tools=True,
        out_of_band=True,
        response_options=frozenset({"voice", "max_output_tokens", "input"}),
    ),
    port.EngineCapabilities(
        name="vllm-omni",
        input_rate=16_000,
        output_rate=24_000,
        detects_turns=True,
        input_transcription=True,
        native_turns=True,
        tools=True,
    ),
)
#: The formats OpenAI's models can name; the others are vLLM-Omni extensions.
OPENAI_FORMATS = (
    AudioFormat(encoding=Encoding.PCM16, rate=24_000),
    AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000),
    AudioFormat(encoding=Encoding.G711_ALAW, rate=8_000),
)
TOOLS = (
    FunctionTool(name="get_weather", description="The forecast.", parameters={"type": "object"}),
    FunctionTool(name="hang_up"),
)
#: Events that may never follow their reply's ``response.done``.
DELTAS = (ev.AudioDelta, ev.TranscriptDelta, ev.TextDelta, ev.FunctionCallArgumentsDelta)
VAD_WINDOW_MS = 32
GATEWAY_INCLUDES = frozenset({LATENCY_EVENT, CLOSING_EVENT})

_text = st.text(max_size=12)
_ids = st.sampled_from(["item_x", "resp_x", "call_x", "root", "", "item_00001"])


@st.composite
def turn_detections(draw: st.DrawFn) -> TurnDetection | None:
    if draw(st.booleans()):
        return None
    return TurnDetection(
        threshold=draw(st.sampled_from([0.3, 0.5, 0.8])),
        prefix_padding_ms=draw(st.sampled_from([0, 100, 300])),
        silence_duration_ms=draw(st.sampled_from([64, 200, 500])),
        create_response=draw(st.booleans()),
        interrupt_response=draw(st.booleans()),
        idle_timeout_ms=draw(st.sampled_from([None, None, 1_000, 5_000])),
    )


@st.composite
def tool_choices(draw: st.DrawFn) -> ToolChoice:
    mode = draw(st.sampled_from(list(ToolChoiceMode)))
    if mode is ToolChoiceMode.REQUIRED and draw(st.booleans()):
        return ToolChoice(mode=mode, function=draw(st.sampled_from(["get_weather", "nope"])))
    return ToolChoice(mode=mode)


@st.composite
def patches(draw: st.DrawFn) -> SessionPatch:
    """A ``session.update`` in OpenAI's own terms (every field optional)."""
    fields: dict[str, Any] = {}
    maybe = draw(
        st.sets(
            st.sampled_from(
                [
                    "kind",
                    "instructions",
                    "voice",
                    "output_modalities",
                    "input_format",
                    "output_format",
                    "turn_detection",
                    "input_transcription",
                    "tools",
                    "tool_choice",
                    "include",
                ]
            )
        )
    )
    if "kind" in maybe:
        fields["kind"] = draw(st.sampled_from(list(SessionKind)))
    if "instructions" in maybe:
        fields["instructions"] = draw(_text)
    if "voice" in maybe:
        fields["voice"] = draw(st.sampled_from(["alloy", "ash", "marin"]))
    if "output_modalities" in maybe:
        fields["output_modalities"] = draw(st.sampled_from([(Modality.AUDIO,), (Modality.TEXT,)]))
    if "input_format" in maybe:
        fields["input_format"] = draw(st.sampled_from(OPENAI_FORMATS))
    if "output_format" in maybe:
        fields["output_format"] = draw(st.sampled_from(OPENAI_FORMATS))
    if "turn_detection" in maybe:
        fields["turn_detection"] = draw(turn_detections())
    if "input_transcription" in maybe:
        fields["input_transcription"] = draw(st.sampled_from([None, InputTranscription()]))
    if "tools" in maybe:
        fields["tools"] = tuple(
            draw(st.lists(st.sampled_from(TOOLS), max_size=2, unique_by=lambda t: t.name))
        )
    if "tool_choice" in maybe:
        fields["tool_choice"] = draw(tool_choices())
    if "include" in maybe:
        fields["include"] = tuple(
            draw(st.lists(st.sampled_from([LATENCY_EVENT, CLOSING_EVENT]), unique=True))
        )
    return SessionPatch(**fields)


@dataclass
class Trace:
    """What the harness has seen of the session so far, for drawing ids and checking invariants."""

    response_ids: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    engine_items: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    #: Reply audio produced so far (ms at the engine's rate), by response and by item.
    produced_by_response: dict[str, float] = field(default_factory=dict)
    produced_by_item: dict[str, float] = field(default_factory=dict)
    pending_updates: list[UpdateEngine] = field(default_factory=list)
    closed: bool = False
    events: list[str] = field(default_factory=list)


class Harness:
    """Plays the connection's part around one :class:`Session` and checks every output."""

    def __init__(self, caps: port.EngineCapabilities, handshake: Handshake, defaults: SessionConfig) -> None:
        self.caps = caps
        self.session = Session(
            session_id="sess_prop", capabilities=caps, defaults=defaults, handshake=handshake
        )
        self.duplex = handshake is Handshake.DUPLEX
        self.output = OutputStage(caps.output_rate)
        self.trace = Trace()
        self.now = 0.0
        self.input_ms = 0.0
        self.seq = 0

    # -- feeding the session ----------------------------------------------------------------

    def run(self, outputs: list[Output], vad: list[float]) -> None:
        """Check one step's outputs and carry out what the host would (opening, audio, updates)."""
        self.check(outputs)
        for output in outputs:
            if isinstance(output, OpenEngine):
                self.run(self.session.engine_opened(), vad)
            elif isinstance(output, ProcessInput):
                fmt = output.format or self.session.config.input_format
                duration = fmt.duration_ms(len(output.audio))
                pcm = bytes(int(self.caps.input_rate * duration / 1000) * 2)
                self.feed_audio(pcm, duration, vad)
            elif isinstance(output, UpdateEngine):
                self.trace.pending_updates.append(output)

    def feed_audio(self, pcm: bytes, duration_ms: float, vad: list[float]) -> None:
        """Processed caller audio, with one VAD window per 32 ms the chunk completes."""
        start = self.input_ms
        self.input_ms += duration_ms
        ends = range(int(start // VAD_WINDOW_MS) + 1, int(self.input_ms // VAD_WINDOW_MS) + 1)
        windows = [(end * VAD_WINDOW_MS, vad[i % len(vad)] if vad else 0.0) for i, end in enumerate(ends)]
        self.run(self.session.input_processed(pcm, duration_ms, windows, now=self.now), vad)

    # -- the checks -------------------------------------------------------------------------

    def check(self, outputs: list[Output]) -> None:
        trace = self.trace
        if trace.closed:
            assert outputs == [], f"outputs after CloseSession: {outputs}"
        closes = [o for o in outputs if isinstance(o, CloseSession)]
        assert len(closes) <= 1, outputs
        if closes:
            assert outputs[-1] is closes[0], f"something follows CloseSession: {outputs}"
            trace.closed = True
        for output in outputs:
            assert isinstance(output, ev.ServerEvent | EngineCall), f"not an event or engine call: {output!r}"
            if isinstance(output, ev.ServerEvent):
                self.check_event(output)
            else:
                self.check_call(output)

    def check_call(self, call: EngineCall) -> None:
        trace = self.trace
        if isinstance(call, StartResponse):
            trace.response_ids.append(call.response_id)
        elif isinstance(call, CommitInput):
            trace.item_ids.append(call.item_id)
            if call.response_id is not None:
                trace.response_ids.append(call.response_id)
        elif isinstance(call, AckPlayback):
            assert call.played_ms <= trace.produced_by_response.get(call.response_id, 0.0) + 1, call
        elif isinstance(call, TruncateReply):
            assert call.audio_end_ms <= trace.produced_by_response.get(call.response_id, 0.0) + 1, call

    def check_event(self, event: ev.ServerEvent) -> None:
        trace = self.trace
        trace.events.append(event.type)
        if isinstance(event, ev.AudioDelta):
            ms = len(event.audio) * 1000.0 / (2 * self.caps.output_rate)
            trace.produced_by_response[event.response_id] = (
                trace.produced_by_response.get(event.response_id, 0) + ms
            )
            trace.produced_by_item[event.item_id] = trace.produced_by_item.get(event.item_id, 0.0) + ms
        if isinstance(event, ev.PlaybackAcknowledged):
            assert event.played_ms <= event.produced_ms, event
            assert event.produced_ms <= trace.produced_by_response.get(event.response_id, 0.0) + 1, event
        if isinstance(event, ev.ConversationItemTruncated):
            assert event.audio_end_ms <= trace.produced_by_item.get(event.item_id, 0.0) + 1, event
        if isinstance(event, ev.ResponseDone):
            assert event.response_id not in trace.done, f"{event.response_id} done twice"
            trace.done.add(event.response_id)
        for item in _items_of(event):
            trace.item_ids.append(item.id)
            if item.call_id:
                trace.call_ids.append(item.call_id)
        # What the client receives: reply audio encoded to its format, a finished reply's tail added.
        for wire_event in self.output.encode(event, self.session.config.output_format, self.session.epoch):
            if isinstance(wire_event, DELTAS):
                assert wire_event.response_id not in trace.done, (
                    f"{wire_event.type} of {wire_event.response_id} after its response.done"
                )
            self.render(wire_event)

    def render(self, event: ev.ServerEvent) -> None:
        self.seq += 1
        for beta in (False, True):
            wire = render_server_event(
                event,
                seq=self.seq,
                event_id=f"event_{self.seq}",
                beta=beta,
                session_id="sess_prop",
                duplex=self.duplex,
            )
            if wire is None:
                continue
            assert json.loads(json.dumps(wire)) == wire
            if not self.duplex and wire["type"] not in EXTENSION_EVENTS and not self.extended(event, beta):
                validate_server_event(wire, beta=beta)

    @staticmethod
    def extended(event: ev.ServerEvent, beta: bool) -> bool:
        """A session object outside OpenAI's terms, which the client itself asked for.

        The gateway's own ``include`` values are extensions; the beta session object types
        ``tool_choice`` as a string, so a forced function has no beta form.
        """
        config = getattr(event, "config", None)
        if not isinstance(config, SessionConfig):
            return False
        return bool(set(config.include) & GATEWAY_INCLUDES) or (
            beta and config.tool_choice.function is not None
        )


def _items_of(event: ev.ServerEvent) -> list[ev.ConversationItem]:
    item = getattr(event, "item", None)
    items = [item] if isinstance(item, ev.ConversationItem) else []
    output = getattr(event, "output", None)
    if isinstance(output, tuple):
        items += [i for i in output if isinstance(i, ev.ConversationItem)]
    return items


# -- drawing the next input -------------------------------------------------------------------


def _known(draw: st.DrawFn, known: list[str], fresh: st.SearchStrategy[str]) -> str:
    """An id the session handed out (stale ones included), or one it never did."""
    if known and draw(st.integers(0, 3)):
        return draw(st.sampled_from(known))
    return draw(fresh)


def _maybe(draw: st.DrawFn, value: st.SearchStrategy[Any]) -> Any:
    return draw(value) if draw(st.booleans()) else None


def draw_command(draw: st.DrawFn, h: Harness) -> cmd.Command:
    trace = h.trace

    def items() -> str:
        return _known(draw, trace.item_ids, _ids)

    def responses() -> str:
        return _known(draw, trace.response_ids, _ids)

    fmt = h.session.config.input_format
    kind = draw(
        st.sampled_from(
            [
                "append",
                "append",
                "append",
                "commit",
                "clear",
                "cancel_input",
                "text",
                "signal",
                "create",
                "create",
                "cancel",
                "item",
                "truncate",
                "delete",
                "retrieve",
                "output_clear",
                "barge_in",
                "dtmf",
                "ack",
                "update",
                "heartbeat",
                "event_ack",
                "resume",
                "close",
            ]
        )
    )
    event_id = _maybe(draw, st.sampled_from(["evt_1", "evt_2"]))
    if kind == "append":
        samples = draw(st.integers(0, fmt.rate // 5))
        odd = draw(st.integers(0, 9)) == 0
        chunk = _maybe(draw, st.sampled_from(OPENAI_FORMATS)) if draw(st.integers(0, 4)) == 0 else None
        width = (chunk or fmt).encoding.bytes_per_sample
        return cmd.InputAudioAppend(
            event_id=event_id,
            audio=bytes(samples * width + (1 if odd and width > 1 else 0)),
            encoding=chunk.encoding if chunk else None,
            rate=chunk.rate if chunk else None,
            is_speech=_maybe(draw, st.booleans()),
        )
    if kind == "commit":
        return cmd.InputAudioCommit(
            event_id=event_id,
            create_response=_maybe(draw, st.booleans()),
            final=draw(st.booleans()),
            is_speech=_maybe(draw, st.booleans()),
        )
    if kind == "clear":
        return cmd.InputAudioClear(event_id=event_id)
    if kind == "cancel_input":
        return cmd.InputCancel(event_id=event_id)
    if kind == "text":
        return cmd.InputTextAppend(event_id=event_id, text=draw(_text))
    if kind == "signal":
        return cmd.TurnSignal(
            event_id=event_id, event=draw(st.sampled_from(["user_started", "user_stopped"]))
        )
    if kind == "create":
        spec = cmd.ItemSpec(kind="item_reference", item_id=items())
        return cmd.ResponseCreate(
            event_id=event_id,
            instructions=_maybe(draw, _text),
            output_modalities=_maybe(draw, st.sampled_from([(Modality.AUDIO,), (Modality.TEXT,)])),
            tools=_maybe(draw, st.sampled_from([(), TOOLS])),
            tool_choice=_maybe(draw, tool_choices()),
            voice=_maybe(draw, st.sampled_from(["alloy", "ash"])),
            max_output_tokens=_maybe(draw, st.integers(1, 100)),
            out_of_band=draw(st.integers(0, 3)) == 0,
            input=_maybe(draw, st.sampled_from([(), (spec,), (cmd.ItemSpec(text="hi"),)])),
            metadata=_maybe(draw, st.sampled_from([{"topic": "weather"}, {}])),
        )
    if kind == "cancel":
        return cmd.ResponseCancel(event_id=event_id, response_id=_maybe(draw, st.just(responses())))
    if kind == "item":
        item_kind = draw(st.sampled_from(["message", "message", "function_call", "function_call_output"]))
        role = {"function_call": "assistant", "function_call_output": "tool"}.get(
            item_kind, draw(st.sampled_from(["user", "assistant", "system"]))
        )
        return cmd.ConversationItemCreate(
            event_id=event_id,
            item_id=_maybe(draw, st.just(items())),
            role=role,
            text=draw(_text),
            previous_item_id=_maybe(draw, st.just(items())),
            kind=item_kind,
            call_id=_known(draw, trace.call_ids, st.sampled_from(["call_1", "call_2"]))
            if item_kind != "message"
            else None,
            name="get_weather" if item_kind == "function_call" else None,
            arguments="{}" if item_kind == "function_call" else None,
            output='{"ok": true}' if item_kind == "function_call_output" else None,
        )
    if kind == "truncate":
        return cmd.ConversationItemTruncate(
            event_id=event_id,
            item_id=items(),
            content_index=draw(st.sampled_from([0, 0, 1])),
            audio_end_ms=draw(st.integers(-5, 20_000)),
        )
    if kind == "delete":
        return cmd.ConversationItemDelete(event_id=event_id, item_id=items())
    if kind == "retrieve":
        return cmd.ConversationItemRetrieve(event_id=event_id, item_id=items())
    if kind == "output_clear":
        return cmd.OutputAudioClear(event_id=event_id)
    if kind == "barge_in":
        return cmd.BargeIn(event_id=event_id)
    if kind == "dtmf":
        return cmd.CallDtmf(digit=draw(st.sampled_from(["1", "#", "*"])), received_at=1_764_540_000)
    if kind == "ack":
        return cmd.PlaybackAck(
            event_id=event_id,
            response_id=_maybe(draw, st.just(responses())),
            item_id=_maybe(draw, st.just(items())),
            played_ms=draw(st.integers(-5, 20_000)),
        )
    if kind == "update":
        return cmd.SessionUpdate(event_id=event_id, session=draw(patches()))
    if kind == "heartbeat":
        return cmd.SessionHeartbeat(event_id=event_id)
    if kind == "event_ack":
        return cmd.SessionEventAck(event_id=event_id, server_event_seq=draw(st.integers(0, 50)))
    if kind == "resume":
        return cmd.SessionResume(event_id=event_id, session_id="sess_prop", resume_token="tok")
    return cmd.SessionClose(event_id=event_id)


def draw_engine_event(draw: st.DrawFn, h: Harness) -> port.EngineEvent:
    trace = h.trace
    rid = _known(draw, trace.response_ids, st.sampled_from(["resp_engine_1", "resp_engine_2", "resp_x"]))
    engine_item = _known(
        draw, trace.engine_items + trace.item_ids, st.sampled_from(["eitem_1", "eitem_2", ""])
    )
    kind = draw(
        st.sampled_from(
            [
                "started",
                "audio",
                "audio",
                "audio",
                "transcript",
                "text",
                "done",
                "done",
                "call_delta",
                "call",
                "timings",
                "speech_started",
                "speech_stopped",
                "committed",
                "listen",
                "speak",
                "overlap",
                "input_transcript",
                "transcript_failed",
                "error",
                "closed",
            ]
        )
    )
    if kind == "started":
        return port.EngineResponseStarted(response_id=rid)
    if kind == "audio":
        ms = draw(st.sampled_from([0, 10, 20, 100, 250]))
        return port.EngineAudio(response_id=rid, pcm=bytes(int(h.caps.output_rate * ms / 1000) * 2))
    if kind == "transcript":
        return port.EngineTranscript(response_id=rid, delta=draw(_text))
    if kind == "text":
        return port.EngineText(response_id=rid, delta=draw(_text))
    if kind == "done":
        status = draw(st.sampled_from(["completed", "completed", "cancelled", "failed", "incomplete"]))
        reason = draw(st.sampled_from([None, "turn_detected", "max_output_tokens", "engine_error", "odd"]))
        tokens = _maybe(draw, st.integers(0, 500))
        return port.EngineResponseDone(response_id=rid, status=status, reason=reason, output_tokens=tokens)
    call_id = draw(st.sampled_from(["call_1", "call_2"]))
    if kind == "call_delta":
        return port.EngineFunctionCallDelta(
            response_id=rid, call_id=call_id, name="get_weather", delta=draw(_text)
        )
    if kind == "call":
        return port.EngineFunctionCall(
            response_id=rid, call_id=call_id, name="get_weather", arguments='{"a":1}'
        )
    if kind == "timings":
        return port.EngineTimings(response_id=rid, stages=(("recognition", 12.5), ("speech", 40.0)))
    if kind == "speech_started":
        return port.EngineSpeechStarted(audio_start_ms=int(h.input_ms), item_id=engine_item)
    if kind == "speech_stopped":
        return port.EngineSpeechStopped(audio_end_ms=int(h.input_ms), item_id=engine_item)
    if kind == "committed":
        return port.EngineTurnCommitted(item_id=engine_item)
    if kind == "listen":
        return port.EngineListen(response_id=_maybe(draw, st.just(rid)), reason="silence_or_noise")
    if kind == "speak":
        return port.EngineSpeak(response_id=rid)
    if kind == "overlap":
        return port.EngineOverlapDecision(policy="barge_in_on_speech", action="barge_in", reason="speech")
    if kind == "input_transcript":
        return port.EngineInputTranscript(item_id=engine_item, text=draw(_text), final=draw(st.booleans()))
    if kind == "transcript_failed":
        return port.EngineInputTranscriptFailed(
            item_id=engine_item, code="transcription_failed", message="no"
        )
    if kind == "error":
        return port.EngineError(code="boom", message="it broke", fatal=draw(st.integers(0, 4)) == 0)
    return port.EngineClosed(reason=draw(st.sampled_from(["engine_error", "backend gone"])))


@st.composite
def defaults(draw: st.DrawFn) -> SessionConfig:
    return SessionConfig(
        input_format=draw(st.sampled_from(OPENAI_FORMATS)),
        output_format=draw(st.sampled_from(OPENAI_FORMATS)),
        output_modalities=draw(st.sampled_from([(Modality.AUDIO,), (Modality.TEXT,)])),
        turn_detection=draw(turn_detections()),
        input_transcription=draw(st.sampled_from([None, InputTranscription()])),
    )


@examples(200)
@given(
    caps=st.sampled_from(ENGINES),
    handshake=st.sampled_from(list(Handshake)),
    config=defaults(),
    data=st.data(),
)
def test_any_interleaving_keeps_the_session_invariants(
    caps: port.EngineCapabilities, handshake: Handshake, config: SessionConfig, data: st.DataObject
) -> None:
    draw = data.draw
    h = Harness(caps, handshake, config)
    h.run(h.session.start(), [])
    steps = draw(st.integers(1, 80), label="steps")
    for _ in range(steps):
        h.now += draw(st.sampled_from([0.0, 0.001, 0.02, 0.1, 0.5, 2.0]))
        source = draw(
            st.sampled_from(["client", "client", "engine", "engine", "audio", "tick", "update_answer"])
        )
        vad = draw(st.lists(st.sampled_from([0.0, 0.1, 0.6, 0.95]), min_size=1, max_size=8))
        if source == "client":
            command = draw_command(draw, h)
            h.run(h.session.receive(command, now=h.now), vad)
        elif source == "engine":
            event = draw_engine_event(draw, h)
            if isinstance(event, port.EngineSpeechStarted | port.EngineSpeechStopped) and event.item_id:
                h.trace.engine_items.append(event.item_id)
            h.run(h.session.engine_event(event, now=h.now), vad)
        elif source == "audio":
            ms = draw(st.sampled_from([0.0, 10.0, 20.0, 100.0, 300.0]))
            h.feed_audio(bytes(int(caps.input_rate * ms / 1000) * 2), ms, vad)
        elif source == "tick":
            due = h.session.next_timer
            if due is not None and draw(st.booleans()):
                h.now = max(h.now, due)
            h.run(h.session.tick(h.now), vad)
        elif h.trace.pending_updates:
            update = h.trace.pending_updates.pop(0)
            if draw(st.booleans()):
                h.run(h.session.engine_updated(update), vad)
            else:
                h.run(h.session.engine_update_refused(update, code="refused", message="no"), vad)
    # The gateway may end any session at any point: the end keeps the invariants too.
    end = draw(st.sampled_from(["shut_down", "expire", "none"]))
    if end == "shut_down":
        h.run(h.session.shut_down(), [])
    elif end == "expire":
        from duplex_gateway.vocabulary.errors import CloseCode

        h.run(h.session.expire("slow_consumer", CloseCode.SLOW_CONSUMER, "the client did not read"), [])
    if h.trace.closed:
        # Nothing reaches the client of a closed session, whatever still arrives.
        assert h.session.receive(cmd.InputAudioCommit(), now=h.now) == []
        assert h.session.engine_event(port.EngineAudio(response_id="resp_x", pcm=bytes(480)), now=h.now) == []
        assert h.session.input_processed(bytes(480), 10.0, [(10_000, 0.9)], now=h.now) == []
        assert h.session.tick(h.now + 3600) == []
