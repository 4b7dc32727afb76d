"""Gateway configuration: a YAML file, overridden by environment variables, validated at start.

Environment variables use the prefix ``DUPLEX_GATEWAY_`` and ``__`` between
levels, e.g. ``DUPLEX_GATEWAY_LIMITS__MAX_SESSIONS=8``. Unknown keys are
errors, and every error names the key it is about.
"""

from __future__ import annotations

import hashlib
import re
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

# Defined apart, so the spec modules below raise it without importing this module back.
from duplex_gateway.config_error import ConfigError

# Each engine's settings live with the engine, in its spec; imported here for the names this module always had.
from duplex_gateway.engine.echo import EchoSettings
from duplex_gateway.engine.embedded.spec import EmbeddedLlmSettings, EmbeddedSettings
from duplex_gateway.engine.remote.spec import RemoteBackendSettings, RemoteSettings
from duplex_gateway.engine.spec import engine_specs
from duplex_gateway.engine.vllm_omni_spec import VllmOmniSettings
from duplex_gateway.telephony.registry import carrier_settings

__all__ = [
    "API_SCOPES",
    "MAX_APPEND_AUDIO_BYTES",
    "MAX_MESSAGE_BYTES",
    "ApiKeySettings",
    "ApiScope",
    "AuthSettings",
    "BackchannelSettings",
    "ConfigError",
    "EchoSettings",
    "EmbeddedLlmSettings",
    "EmbeddedSettings",
    "EngineSections",
    "EngineSettings",
    "GatewaySettings",
    "LimitSettings",
    "LiveResponsesSettings",
    "LiveSettings",
    "RecordingSettings",
    "RemoteBackendSettings",
    "RemoteSettings",
    "RetentionSettings",
    "ServerSettings",
    "SessionDefaults",
    "TelephonyProfileSettings",
    "TelephonySections",
    "TelephonySettings",
    "VllmOmniSettings",
    "load_settings",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    #: WebSocket ping interval and how long to wait for the pong (transport keepalive).
    ws_ping_interval_s: float = Field(20.0, gt=0)
    ws_ping_timeout_s: float = Field(20.0, gt=0)
    #: A connection must send a whole request head (a WebSocket handshake's included) within this
    #: long, or it is closed: a client that sends half a handshake holds no socket for longer.
    request_head_timeout_s: float = Field(10.0, gt=0)
    #: Serve the browser demo at ``/``.
    web_demo: bool = True
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    #: ``text`` for a person at a terminal; ``json``: one JSON object per line, with ``session_id``
    #: (for a log pipeline). Every session ends with one summary line either way.
    log_format: Literal["text", "json"] = "text"
    #: On SIGTERM, how long live sessions get to finish the reply (or turn) in progress before
    #: they are closed (1001). Meanwhile ``/readyz`` answers 503 and new sessions are refused (1013).
    #: Keep it under the orchestrator's kill timeout (Kubernetes: 30 s by default) less a few seconds.
    drain_grace_s: float = Field(20.0, ge=0, le=3600)
    #: Offer WebSocket compression (permessage-deflate). Base64 audio barely compresses, and
    #: deflating every frame both ways costs more CPU than the rest of a session's work.
    ws_per_message_deflate: bool = False
    #: This process's name among several gateways behind one load balancer. Set, session ids are
    #: ``sess_<node_id>_<hex>``, so the balancer can send a resuming client to the process that holds
    #: its session (docs/scaling.md). Letters, digits and ``-`` only; null: ``sess_<hex>``.
    node_id: str | None = Field(None, pattern=r"^[A-Za-z0-9-]{1,32}$")
    #: Copy resumable sessions into a state store shared by a fleet of gateways, Redis (or Valkey):
    #: ``redis://host:port/db`` (``rediss://`` for TLS). Each session's event journal, resume token
    #: (as a digest), configuration and this gateway's lease on it are written as it goes, off the
    #: audio path, and a resume reaching another gateway of the fleet is taken over there from that
    #: copy (docs/scaling.md). Null: a session lives in this process only. Needs the ``fleet`` extra.
    state_store: str | None = Field(None, pattern=r"^(redis|rediss|unix)://")
    #: The longest one call to the store may take; a slower store counts as down (the gateway
    #: goes on serving, its sessions resumable on it alone, until the store answers again).
    state_store_timeout_s: float = Field(1.0, gt=0, le=30)
    #: How long a gateway's claim on its sessions lasts unrenewed (renewed three times as often):
    #: after a crash, another gateway can take a session over at most this long later.
    state_lease_s: float = Field(5.0, ge=0.5, le=300)
    #: Serve https/wss with this PEM certificate (chain) and private key (uvicorn's ``--ssl-certfile`` /
    #: ``--ssl-keyfile``): browsers give the demo page a microphone only in a secure context.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


#: The most audio one ``input_audio_buffer.append`` may carry, as OpenAI's Realtime API allows.
MAX_APPEND_AUDIO_BYTES = 15 << 20
#: That much audio in base64 (4 characters per 3 bytes) with room for the event's JSON around it.
MAX_MESSAGE_BYTES = MAX_APPEND_AUDIO_BYTES // 3 * 4 + (64 << 10)


class LimitSettings(_Section):
    #: Concurrent sessions this gateway admits; more are refused with ``session_limit`` / 1013.
    max_sessions: int = Field(64, ge=1)
    #: Close a session after this long without any client message (4000).
    idle_timeout_s: float = Field(300.0, gt=0)
    #: Close a session after this long in total (4001).
    max_session_s: float = Field(3600.0, gt=0)
    #: Text messages above this get a ``message_too_large`` error; the session survives. The
    #: default holds an ``input_audio_buffer.append`` of 15 MiB of audio (OpenAI's cap) in base64.
    #: A session holds at most one client message at a time (see ``host/reader.py``).
    max_message_bytes: int = Field(MAX_MESSAGE_BYTES, ge=1024)
    #: Messages above this close the connection with 1009 before they are read whole.
    hard_max_message_bytes: int = Field(24 << 20, ge=1024)
    #: No longer used: fast input is paced by backpressure, never refused. Accepted so that
    #: older config files still load.
    input_rate_factor: float = Field(1.5, gt=0)
    input_burst_ms: float = Field(3000.0, ge=0)
    #: Events buffered for a client before it counts as a slow reader.
    send_queue_size: int = Field(1024, ge=16)
    #: How long a full send queue may stay full before the session closes (4002). A client
    #: that then still takes nothing for as long more is disconnected (a TCP reset), so one
    #: that never reads again cannot keep its connection open.
    send_timeout_s: float = Field(10.0, gt=0)
    #: Engine calls that take longer than this fail with ``engine_error``.
    engine_timeout_s: float = Field(10.0, gt=0)
    #: How long a session whose client dropped waits for ``session.resume`` (0 turns resume off).
    resume_grace_s: float = Field(30.0, ge=0)
    #: Server events kept per session for replay on resume, by count and by bytes.
    resume_journal_events: int = Field(4096, ge=16)
    resume_journal_bytes: int = Field(8 << 20, ge=65536)
    #: Open WebSocket connections one client address may hold (carrier streams aside); more are
    #: refused before the upgrade with HTTP 503 ``session_limit``. Null: no cap.
    max_sessions_per_ip: int | None = Field(None, ge=1)
    #: WebSocket handshakes one client address may make per minute (a token bucket that size,
    #: refilled evenly; carrier streams aside); more get HTTP 429 ``rate_limited``. Null: no limit.
    connections_per_minute_per_ip: int | None = Field(None, ge=1)


#: What an API key may open: the endpoints by their dialect, administration, minting client secrets.
ApiScope = Literal["realtime", "duplex", "telephony", "observe", "admin", "client_secrets"]
API_SCOPES: tuple[ApiScope, ...] = ("realtime", "duplex", "telephony", "observe", "admin", "client_secrets")


class ApiKeySettings(_Section):
    """One API key: a name for logs and metrics, the key's SHA-256, and what the key may do."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    #: ``sha256:<64 hex digits>`` of the key. A plaintext ``key:`` is accepted instead: it is
    #: hashed as the configuration loads, and only the hash is kept.
    hash: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", repr=False)
    scopes: tuple[ApiScope, ...] = API_SCOPES
    #: The engines this key is for (``engine.name``); empty: any. A gateway runs one engine, so a
    #: key for others is refused there (403).
    engines: tuple[str, ...] = ()
    #: WebSocket sessions this key (with the client secrets it minted) may hold at once; null: no cap.
    max_sessions: int | None = Field(None, ge=1)
    #: Record this key's sessions (and those of the client secrets it minted) even while
    #: ``recording.enabled`` is off; where and for how long: the ``recording:`` section.
    record: bool = False

    @model_validator(mode="before")
    @classmethod
    def _hash_plaintext(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "key" not in data:
            return data
        # load_settings reports each error by its key and message, never its input: the key stays unshown.
        rest = {name: value for name, value in data.items() if name != "key"}
        key = data["key"]
        if "hash" in rest:
            raise ValueError("give an API key's hash or the key itself, not both")
        if not isinstance(key, str) or not key:
            raise ValueError("an API key must be a non-empty string")
        return {**rest, "hash": "sha256:" + hashlib.sha256(key.encode()).hexdigest()}


class AuthSettings(_Section):
    #: Accepted API keys in plaintext, each allowed everything (the older form of ``keys``).
    #: With this and ``keys`` both empty there is no authentication.
    api_keys: tuple[str, ...] = Field((), repr=False)
    keys: tuple[ApiKeySettings, ...] = ()
    #: Signs client secrets (``POST /v1/realtime/client_secrets``); at least 32 characters. Null: a
    #: random secret per process, so client secrets die with it and work on no other gateway.
    token_secret: str | None = Field(None, min_length=32, repr=False)
    #: Browser origins (``https://app.example.com``, ``https://*.example.com``) that may call the
    #: gateway; a request whose ``Origin`` is another is refused (403). The gateway's own origin is
    #: always allowed. Empty: any origin.
    allowed_origins: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _distinct(self) -> AuthSettings:
        names = [key.name for key in self.keys]
        if len(set(names)) != len(names):
            raise ValueError("auth.keys: two keys have the same name")
        if len({key.hash for key in self.keys}) != len(self.keys):
            raise ValueError("auth.keys: two keys have the same hash")
        for origin in self.allowed_origins:
            if not _ORIGIN.match(origin):
                raise ValueError(f"auth.allowed_origins: {origin[:80]!r} is not scheme://host[:port] or null")
        return self


_ORIGIN = re.compile(r"^(null|https?://(\*\.)?[A-Za-z0-9.\-\[\]:]+)$")


class TelephonyProfileSettings(_Section):
    """What a call to one number sets in its session."""

    instructions: str | None = None
    voice: str | None = None


class TelephonySections(_Section):
    """``telephony:``: what every call shares, and one section per carrier, from the carriers' table.

    A carrier reads its own section with ``SPEC.settings_of`` (``duplex_gateway.telephony.registry``).
    """

    #: Reply audio is handed to the carrier at real time plus this lead: a clear drops at most this much.
    lead_ms: float = Field(100.0, ge=0, le=5_000)
    #: Take the reply's echo (speakerphones) out of the caller's audio before turn detection hears it.
    echo_suppression: bool = True
    #: Session settings by the number called (E.164) or by a call's ``profile`` start parameter.
    profiles: dict[str, TelephonyProfileSettings] = {}
    #: The gateway's public base URL (``https://gw.example.com``), written into the carriers' answers
    #: (``wss://`` from ``https://``) and the URL webhook signatures cover; null: the request's Host.
    public_url: str | None = Field(None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    #: Longest wait for a carrier's REST hang-up.
    hangup_timeout_s: float = Field(5.0, gt=0, le=60)
    #: Listen for Asterisk AudioSocket calls (TCP) on this port, on server.host; null: no listener.
    audiosocket_port: int | None = Field(None, ge=0, le=65535)


def _telephony_settings_model() -> type[TelephonySections]:
    sections: dict[str, Any] = {name: (model, model()) for name, model in carrier_settings().items()}
    return create_model("TelephonySettings", __base__=TelephonySections, __module__=__name__, **sections)


if TYPE_CHECKING:
    TelephonySettings = TelephonySections
else:
    TelephonySettings = _telephony_settings_model()


class EngineSections(_Section):
    """``engine:``: which engine runs (``name``), and one section per engine, from the engines' specs.

    Every section is validated whichever engine runs, so a mistake in one is found
    before the day it is chosen. An engine reads its own with ``SPEC.settings_of``.
    """

    name: str = "embedded"


def _engine_settings_model() -> type[EngineSections]:
    sections: dict[str, Any] = {}
    for spec in engine_specs():
        # Engines sharing a section (the two vLLM-Omni ones) declare the same model for it.
        sections.setdefault(spec.section, (spec.settings, spec.settings()))
    return create_model("EngineSettings", __base__=EngineSections, __module__=__name__, **sections)


if TYPE_CHECKING:
    EngineSettings = EngineSections
else:
    EngineSettings = _engine_settings_model()


class BackchannelSettings(_Section):
    """Caller speech over a reply: when it is a backchannel the reply survives, when an interruption.

    With the ``backchannel`` policy the reply is held (nothing more of it is sent) while the
    caller speaks over it; speech that lasts ``barge_in_ms`` interrupts it, quiet for
    ``settle_ms`` before that resumes it where it was held. A session's own ``overlap_policy``
    and ``overlap_barge_in_ms`` (vLLM-Omni's session fields) win over these.
    """

    #: ``auto``: ``backchannel`` under ``semantic_vad``, OpenAI's barge-in on every speech start
    #: under ``server_vad``; ``backchannel`` under both; ``barge_in_on_speech`` under neither.
    policy: Literal["auto", "backchannel", "barge_in_on_speech"] = "auto"
    #: Voiced speech over a held reply, from its onset, that makes it an interruption.
    barge_in_ms: int = Field(550, ge=50, le=5_000)
    #: Quiet after shorter speech that makes it a backchannel: the reply resumes.
    settle_ms: int = Field(400, ge=50, le=5_000)
    #: The longest a reply is held by the clock, should the caller's audio stop coming.
    max_hold_ms: int = Field(2_000, ge=100, le=30_000)


class SessionDefaults(_Section):
    """Defaults a session starts with before the client's ``session.update``."""

    instructions: str = ""
    voice: str = "default"
    input_format: Literal["pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw"] = "pcm16"
    input_rate: int = Field(24_000, ge=8_000, le=48_000)
    output_format: Literal["pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw"] = "pcm16"
    output_rate: int = Field(24_000, ge=8_000, le=48_000)
    turn_detection: Literal["server_vad", "none"] = "server_vad"
    vad_threshold: float = Field(0.5, gt=0, lt=1)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    #: Caller speech over a reply (backchannels and interruptions).
    backchannels: BackchannelSettings = BackchannelSettings()


class RetentionSettings(_Section):
    """How many recordings are kept: past any limit, the oldest finished ones are deleted first."""

    #: Recordings kept at most; null: no cap.
    max_recordings: int | None = Field(None, ge=1)
    #: Bytes all recordings may take together; null: no cap.
    max_bytes: int | None = Field(None, ge=1)
    #: Recordings older than this many seconds are deleted; null: kept whatever their age.
    max_age_s: float | None = Field(None, gt=0)


class LiveResponsesSettings(EmbeddedLlmSettings):
    """The backend model of the Live API's Responses delegation: any OpenAI-compatible chat endpoint.

    A Live session with ``delegation.type: responses`` hands the work its voice engine delegates
    to this model, with the session's function tools (run by the client), and the engine speaks
    its answer. Off while ``url`` is null; the ``embedded`` engine's own ``engine.embedded.llm``
    then serves, if it has one; with neither the voice engine does the work itself. The client's
    ``responses.model`` names a model of OpenAI's: this endpoint answers with ``model`` (null: the
    first it lists at start-up).
    """


class LiveSettings(_Section):
    """``/v1/live/sessions``: OpenAI's full-duplex Live API (a WebSocket, or a WebRTC offer posted there)."""

    #: The backend model Responses delegation hands work to (off by default).
    responses: LiveResponsesSettings = LiveResponsesSettings()


class IceServerSettings(_Section):
    """A STUN or TURN server WebRTC calls gather candidates from (``stun:host:port``, ``turn:host:port``)."""

    urls: tuple[str, ...] = Field(min_length=1)
    username: str | None = None
    credential: str | None = Field(None, repr=False)


class WebRtcSettings(_Section):
    """``POST /v1/realtime/calls`` and ``POST /v1/live/sessions``: OpenAI's WebRTC calls (the ``webrtc`` extra)."""

    #: The addresses ICE offers host candidates on; empty: every interface but loopback. List
    #: 127.0.0.1 for clients on the same machine (aioice leaves it out by itself).
    host_addresses: tuple[str, ...] = ()
    #: STUN and TURN servers, for a gateway behind NAT (docs/webrtc.md: coturn).
    ice_servers: tuple[IceServerSettings, ...] = ()
    #: A call whose data channel is not open this long after the answer is ended.
    connect_timeout_s: float = Field(15.0, gt=0, le=300)


class RecordingSettings(_Section):
    """Session recordings (caller and assistant audio as FLAC, an event log) for ``duplex-gateway replay``."""

    #: Record every session. Off, only the sessions of keys with ``record: true`` are recorded,
    #: and with no such key nothing is written at all.
    enabled: bool = False
    #: Where recordings go, one folder per session (relative paths: to the working directory).
    directory: str = "recordings"
    #: Items (audio chunks, events) waiting for a recording's writer thread; beyond this they are
    #: dropped (never waited for) and the recording is marked incomplete.
    queue_size: int = Field(4096, ge=16, le=1_000_000)
    retention: RetentionSettings = RetentionSettings()


class GatewaySettings(BaseSettings):
    """The whole configuration."""

    model_config = SettingsConfigDict(
        env_prefix="DUPLEX_GATEWAY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    limits: LimitSettings = LimitSettings()
    auth: AuthSettings = AuthSettings()
    engine: EngineSettings = EngineSettings()
    session: SessionDefaults = SessionDefaults()
    telephony: TelephonySettings = TelephonySettings()
    recording: RecordingSettings = RecordingSettings()
    live: LiveSettings = LiveSettings()
    webrtc: WebRtcSettings = WebRtcSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Command-line values beat the environment, which beats the file.
        return (init_settings, env_settings, InitSettingsSource(settings_cls, _FILE_DATA.get() or {}))


_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("duplex_gateway_config_file", default=None)


def load_settings(path: str | Path | None = None, **overrides: Any) -> GatewaySettings:
    """Read ``path`` (YAML), then environment variables, then ``overrides`` (dotted keys); validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping at the top level")
        data = loaded
    cli: dict[str, Any] = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = cli
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    token = _FILE_DATA.set(data)
    try:
        return GatewaySettings(**cli)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"]) or "(top level)"
            problems.append(f"{key}: {error['msg']}")
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid configuration{where}:\n  " + "\n  ".join(problems)) from None
    finally:
        _FILE_DATA.reset(token)
