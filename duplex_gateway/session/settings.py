"""A session's configuration in force, on its engine and handshake, and what follows from them.

:class:`Settings` answers the questions the session's rules ask of the
configuration (who finds the ends of turns, whether the caller's words go to
the client, whether a reply may call a function) and checks a new configuration
against what the engine can do. The session changes it; nothing here decides a
turn or a reply.
"""

from __future__ import annotations

import enum

from duplex_gateway.engine import port
from duplex_gateway.session.reply_options import check_session_tools
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.session_config import (
    IGNORED_EVENT,
    OVERLAP_EVENT,
    FunctionTool,
    SessionConfig,
    SessionKind,
    SessionPatch,
    ToolChoice,
    ToolChoiceMode,
)

__all__ = ["Handshake", "Settings"]


class Handshake(enum.Enum):
    """How a connection becomes a session."""

    #: OpenAI Realtime: ``session.created`` right after connect, defaults apply.
    REALTIME = "realtime"
    #: vLLM-Omni duplex: the first message must be ``session.update``.
    DUPLEX = "duplex"


class Settings:
    """The configuration a session runs by, with the engine it runs on and the handshake that opened it."""

    def __init__(
        self, config: SessionConfig, capabilities: port.EngineCapabilities, handshake: Handshake
    ) -> None:
        self.config = config
        self.capabilities = capabilities
        self.handshake = handshake
        #: Kinds of input the engine does not use that the client was told of (once each).
        self._unused_told: set[str] = set()

    @property
    def transcribing_only(self) -> bool:
        """A transcription session: turns are transcribed, never answered."""
        return self.config.kind is SessionKind.TRANSCRIPTION

    @property
    def gateway_vad(self) -> bool:
        """Whether the gateway (not the engine) finds the ends of turns."""
        return self.config.turn_detection is not None and not self.capabilities.detects_turns

    @property
    def tells_overlaps(self) -> bool:
        """Whether the client gets ``overlap.decision`` events: vLLM-Omni's clients, or a client that asked."""
        return self.handshake is Handshake.DUPLEX or OVERLAP_EVENT in self.config.include

    @property
    def transcribes_input(self) -> bool:
        """Whether the client gets the caller's words as transcription events.

        A Realtime client asks for them (``audio.input.transcription``); vLLM-Omni's
        duplex server sends whatever its model transcribed, asked or not.
        """
        return (
            self.config.input_transcription is not None
            or self.config.kind is SessionKind.TRANSCRIPTION
            or self.handshake is Handshake.DUPLEX
        )

    @property
    def engine_turns(self) -> bool:
        """The engine's own turn-taking decides which turns get a reply (vLLM-Omni ``auto_response``).

        Asked for by the client with ``extra_body.auto_response``, on an engine that
        has native turn-taking; other engines get the gateway's rendering of it.
        """
        return self.capabilities.native_turns and self.config.auto_response and not self.transcribing_only

    def commit_asks_reply(self, command: cmd.InputAudioCommit, *, replying: bool) -> bool | None:
        """Whether the client's commit of a turn asks for a reply (None: the engine's turn-taking decides).

        ``replying``: a reply in the conversation is in progress.
        """
        if command.create_response:
            return True
        if self.engine_turns:
            # vLLM-Omni answers an auto_response commit by its own turn-taking (it may choose to
            # listen); the reply, if any, is the engine's, announced when it starts.
            return None
        if self.config.auto_response and command.final:
            # vLLM-Omni's server answers every final commit of an auto_response session, even
            # one that says response_create: false. A turn that ends while a reply is in
            # progress asks for no second one.
            return not replying and not self.transcribing_only
        if command.create_response is None:
            return self.gateway_vad and self.turn_end_asks_reply(replying=replying)
        return False

    def turn_end_asks_reply(self, *, replying: bool) -> bool:
        """Whether a turn the gateway's turn detection ended asks for a reply."""
        td = self.config.turn_detection
        return td is not None and td.create_response and not replying and not self.transcribing_only

    def may_call(self, tools: tuple[FunctionTool, ...], choice: ToolChoice) -> bool:
        """Whether a reply offered ``tools`` under ``choice`` may call a function on this engine."""
        return bool(tools) and choice.mode is not ToolChoiceMode.NONE and self.capabilities.tools

    @property
    def replies_may_call(self) -> bool:
        """Whether a reply made by the session's own tools may call a function."""
        return self.may_call(self.config.tools, self.config.tool_choice)

    def checked(self, config: SessionConfig) -> SessionConfig:
        """``config``, if the engine can run it; refused otherwise."""
        if config.kind is SessionKind.TRANSCRIPTION and not self.capabilities.input_transcription:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"the {self.capabilities.name} engine cannot transcribe, so it cannot run a transcription session",
                param="session.type",
            )
        check_session_tools(config, self.capabilities)
        return config

    def updated(self, patch: SessionPatch) -> SessionConfig:
        """The configuration ``session.update`` asks for; refused if the engine cannot run it."""
        before = self.config
        after = self.checked(before.apply(patch))
        if after.kind is not before.kind:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"this is a {before.kind.value} session; session.type cannot change "
                "(open a new session, e.g. /v1/realtime?intent=transcription)",
                param="session.type",
            )
        return after

    def require_native_turns(self, what: str) -> None:
        """Refuse ``what``, a command only an engine with its own turn-taking takes, on one without."""
        if not self.capabilities.native_turns:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_BY_ENGINE,
                f"{what} needs an engine with its own turn-taking; the {self.capabilities.name} engine has none",
            )

    def created(self, session_id: str, resume_token: str | None) -> ev.SessionCreated:
        """The event that announces the session with this configuration."""
        return ev.SessionCreated(
            session_id=session_id,
            config=self.config,
            capabilities=self.capabilities.as_pairs(),
            resume_token=resume_token,
        )

    def resumed(
        self, session_id: str, resume_token: str | None, attachment_generation: int
    ) -> ev.SessionResumed:
        """The event that greets a client re-attaching to the session."""
        return ev.SessionResumed(
            session_id=session_id,
            config=self.config,
            capabilities=self.capabilities.as_pairs(),
            resume_token=resume_token,
            attachment_generation=attachment_generation,
        )

    @staticmethod
    def never_replies(param: str | None = None) -> ProtocolError:
        """The refusal of anything that asks a transcription session for a reply."""
        return ProtocolError(
            ErrorCode.INVALID_EVENT,
            "a transcription session transcribes the caller and never replies",
            param=param,
        )

    def unused(self, kind: str, what: str) -> list[ev.InputIgnored]:
        """Tell the client, the first time only, that the engine does not use ``kind`` of input.

        Duplex-handshake clients are told unasked; a Realtime client only if it asked
        (``session.include``), as strict ones refuse an event type OpenAI does not define.
        """
        if kind in self._unused_told:
            return []
        if self.handshake is not Handshake.DUPLEX and IGNORED_EVENT not in self.config.include:
            return []
        self._unused_told.add(kind)
        name = self.capabilities.name
        return [
            ev.InputIgnored(
                input=kind,
                engine=name,
                message=f"the {name} engine does not use {what}: they are dropped, the rest of the input is used",
            )
        ]
