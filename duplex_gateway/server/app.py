"""The ASGI application: WebSocket endpoints, health probes and the web demo."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from duplex_gateway.audio.vad import SileroVad
from duplex_gateway.auth import AuthMiddleware, Denial, Gate, Principal, auth_routes
from duplex_gateway.auth.principal import PrincipalKind, Scope
from duplex_gateway.config import GatewaySettings
from duplex_gateway.dialects.live_pacing import PacedLiveDialect
from duplex_gateway.dialects.live_webrtc import WebRtcLiveDialect, opening_event
from duplex_gateway.dialects.realtime import RealtimeDialect
from duplex_gateway.dialects.realtime_session import parse_session_patch, session_payload
from duplex_gateway.dialects.realtime_webrtc import MEDIA_FORMAT, WebRtcRealtimeDialect
from duplex_gateway.engine import port
from duplex_gateway.host.closing import FAILURES, Failure, close_code
from duplex_gateway.host.connection import Connection, SessionRegistry
from duplex_gateway.host.delegation import ResponsesBackend, backend_settings
from duplex_gateway.host.resumption import ResumeRegistry, new_session_id
from duplex_gateway.ops.metrics import CONTENT_TYPE, GatewayMetrics
from duplex_gateway.ops.recording import Recordings
from duplex_gateway.server.adoption import Adoption
from duplex_gateway.server.direct_socket import direct_socket
from duplex_gateway.server.fleet import Fleet
from duplex_gateway.server.live_calls import (
    LIVE_SESSIONS_PATH,
    RefusedLiveCall,
    live_call_answer,
    read_live_call,
)
from duplex_gateway.server.webrtc import (
    CALLS_PATH,
    MAX_SDP_BYTES,
    AnsweredCall,
    BadCall,
    CallSocket,
    IceServer,
    WebRtcCalls,
    call_error,
    read_call_request,
    unavailable,
    webrtc_available,
)
from duplex_gateway.session.machine import Handshake
from duplex_gateway.telephony.audiosocket import AudioSocketServer, start_audiosocket
from duplex_gateway.telephony.carrier import Carrier
from duplex_gateway.telephony.dialect import CallDialect, CallProfile, CallSetup
from duplex_gateway.telephony.hangup import HangupOutcome, hang_up
from duplex_gateway.telephony.registry import (
    DetectingCarrier,
    carrier_for,
    require_extras,
    signed_streams,
    subprotocols,
)
from duplex_gateway.telephony.webhooks import signature_checks, webhook_routes
from duplex_gateway.vocabulary.errors import ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Socket
from duplex_gateway.vocabulary.session_config import (
    InputTranscription,
    SessionConfig,
    SessionKind,
    TurnDetection,
)

__all__ = ["create_app", "session_defaults"]

logger = logging.getLogger(__name__)

WEB_DEMO_DIR = Path(__file__).resolve().parents[1] / "web_demo"
_BETA_PROTOCOL = "openai-beta.realtime-v1"


def session_defaults(settings: GatewaySettings) -> SessionConfig:
    """The configuration a session starts with, from the ``session:`` section."""
    s = settings.session
    turn = (
        TurnDetection(
            threshold=s.vad_threshold,
            prefix_padding_ms=s.prefix_padding_ms,
            silence_duration_ms=s.silence_duration_ms,
        )
        if s.turn_detection == "server_vad"
        else None
    )
    return SessionConfig(
        instructions=s.instructions,
        voice=s.voice,
        input_format=AudioFormat(encoding=Encoding(s.input_format), rate=s.input_rate),
        output_format=AudioFormat(encoding=Encoding(s.output_format), rate=s.output_rate),
        turn_detection=turn,
    )


class _Gateway:
    """Shared state of the running gateway: one engine, the session count, the sessions parked for resume."""

    def __init__(self, settings: GatewaySettings, engine: port.Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.defaults = session_defaults(settings)
        self.registry = SessionRegistry(settings.limits.max_sessions)
        self.connections: set[Connection] = set()
        #: Set once shutdown has begun: /readyz answers 503 so a load balancer stops sending callers.
        self.shutting_down = False
        #: Every metric of this gateway (``GET /metrics``); the auth layer counts its refusals
        #: with ``metrics.auth_refused(reason)``.
        self.metrics = GatewayMetrics(engine.capabilities.name)
        self.metrics.watch_engine_sessions(lambda: engine.active_sessions)
        # Soak runs read it: a session that leaves a task behind shows as growth here.
        self.metrics.watch_tasks(_live_tasks)
        #: The state store shared with other gateways (``server.state_store``; None: none).
        self.fleet = Fleet.from_settings(settings, self.metrics)
        self.resumes: ResumeRegistry[Connection] = ResumeRegistry(
            settings.server.node_id,
            writer=self.fleet.writer if self.fleet is not None else None,
            adopt=(
                Adoption(self.fleet, self.defaults, self._realtime_connection, self.registry)
                if self.fleet
                else None
            ),
        )
        #: Which sessions are recorded, and where (``recording:``, ``auth.keys[].record``).
        self.recordings = Recordings.from_settings(settings)
        #: The Live API's Responses delegation backend (``live.responses``), connected at start-up.
        self._backend_settings = backend_settings(settings)
        self.backend: ResponsesBackend | None = None
        #: WebRTC calls (``POST /v1/realtime/calls``), while their connections come up and after.
        rtc = settings.webrtc
        self.calls = WebRtcCalls(
            host_addresses=rtc.host_addresses,
            ice_servers=[IceServer(s.urls, s.username, s.credential) for s in rtc.ice_servers],
            connect_timeout_s=rtc.connect_timeout_s,
            send_timeout_s=settings.limits.send_timeout_s,
        )

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        ready = self.engine.ready and not self.shutting_down
        body: dict[str, object] = {
            "status": "ready" if ready else ("shutting_down" if self.shutting_down else "not_ready"),
            "node": self.settings.server.node_id,
            "engine": self.engine.capabilities.name,
            "sessions": self.registry.count,
            "engine_sessions": self.engine.active_sessions,
            "max_sessions": self.registry.max_sessions,
        }
        if self.fleet is not None:
            # Not a reason to stop taking callers: without the store, sessions stay on this gateway.
            body["state_store"] = self.fleet.status()
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text exposition of this gateway's registry."""
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def realtime(self, websocket: WebSocket) -> None:
        call_id = websocket.query_params.get("call_id")
        if call_id is not None:
            await self._observe(websocket, call_id)
            return
        # ?duplex=1 asks for the vLLM-Omni handshake; ?resume=1 means the first message may be
        # session.resume, so session.created must wait for it.
        wait = any(
            websocket.query_params.get(key, "0").lower() in ("1", "true") for key in ("duplex", "resume")
        )
        await self._serve(websocket, Handshake.DUPLEX if wait else Handshake.REALTIME)

    async def _observe(self, websocket: WebSocket, call_id: str) -> None:
        """``/v1/realtime?call_id=...``: watch a live call (or any session, by its id); steer a WebRTC call."""
        offered = [
            p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
        ]
        watched = next((c for c in self.connections if call_id in (c.call_id, c.session_id)), None)
        if watched is None:
            await websocket.close(close_code(Failure.NO_SUCH_CALL), FAILURES[Failure.NO_SUCH_CALL].reason)
            return
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        # A WebRTC call's sideband steers it (OpenAI's sideband control), for a key that may open sessions.
        call = self.calls.socket(watched.call_id or "")
        principal = websocket.scope.get("auth")
        steers = (
            isinstance(principal, Principal)
            and principal.kind is not PrincipalKind.CLIENT_SECRET  # a browser's: it watches, at most
            and Scope.REALTIME in principal.scopes
        )
        await watched.observe(
            direct_socket(websocket), call.control if call is not None and call.steerable and steers else None
        )

    async def duplex(self, websocket: WebSocket) -> None:
        await self._serve(websocket, Handshake.DUPLEX)

    async def telephony(self, websocket: WebSocket) -> None:
        """A carrier's media stream: ``/telephony/<carrier>``, or ``/telephony`` to recognize it."""
        name = websocket.path_params.get("carrier")
        # The auth layer has checked the carrier's signature on the upgrade (where it signs one) before this runs.
        signed = signed_streams(self.settings.telephony)
        carrier = DetectingCarrier(signed_only=signed) if name is None else carrier_for(name)
        offered = [
            p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
        ]
        if carrier is None:
            await websocket.close(
                close_code(Failure.NO_SUCH_CARRIER), f"no carrier named {name[:32]!r}" if name else None
            )
            return
        # The subprotocol some carrier's stream asks for (chan_websocket's "media").
        known = subprotocols()
        await websocket.accept(subprotocol=next((p for p in offered if p in known), None))
        await self.serve_call(direct_socket(websocket), carrier)

    async def serve_call(self, socket: Socket, carrier: Carrier) -> None:
        """One phone call's media stream, whatever carries it: a carrier's WebSocket, an AudioSocket connection."""
        session_id = new_session_id(self.settings.server.node_id)
        telephony = self.settings.telephony
        setup = CallSetup(
            lead_ms=telephony.lead_ms,
            echo_suppression=telephony.echo_suppression,
            profiles={
                key: CallProfile(instructions=p.instructions, voice=p.voice)
                for key, p in telephony.profiles.items()
            },
        )
        dialect = CallDialect(carrier, setup)
        connection = Connection(
            socket,
            session_id=session_id,
            engine=self.engine,
            settings=self.settings,
            defaults=self.defaults,
            registry=self.registry,
            handshake=Handshake.DUPLEX,  # the carrier's start message opens the session
            dialect=dialect,
            resumes=None,  # a dropped call is over
            metrics=self.metrics,
            dialect_name="telephony",
            recorder=self.recordings.start(
                session_id,
                principal=None,
                engine=self.engine.capabilities,
                dialect="telephony",
                config=self.defaults,
            ),
        )
        await self._serve_connection(connection)
        start = dialect.start
        if start is not None and start.call_id and not dialect.ended and connection.closed_by_server:
            # The gateway ended the call. Closing the stream ends most calls; the carrier's REST
            # hang-up (with its credentials configured) ends the rest, e.g. TwiML after <Stream>.
            result = await hang_up(start.carrier, start.call_id, self.settings)
            quiet = (HangupOutcome.NOT_CONFIGURED, HangupOutcome.UNSUPPORTED)  # closing the stream ended it
            level = logging.INFO if result.ok or result.outcome in quiet else logging.WARNING
            logger.log(
                level,
                "call %s (%s): hang-up %s %s",
                start.call_id,
                start.carrier,
                result.outcome,
                result.detail or "",
            )

    async def hang_up_call(self, request: Request) -> Response:
        """``POST /v1/realtime/calls/{call_id}/hangup`` (OpenAI's): end a live call."""
        if not self._hang_up(request.path_params["call_id"]):
            return _no_such_call()
        return JSONResponse({}, 200)

    async def hang_up_live_session(self, request: Request) -> Response:
        """``POST /v1/live/sessions/{session_id}/hangup`` (OpenAI's): end a live call; no body back."""
        return (
            Response(status_code=200) if self._hang_up(request.path_params["session_id"]) else _no_such_call()
        )

    def _hang_up(self, call_id: str) -> bool:
        """End the live call ``call_id`` names (a call id or a session id); False: there is none."""
        connection = next((c for c in self.connections if call_id in (c.call_id, c.session_id)), None)
        if connection is None:
            return False
        connection.end("hangup_requested")
        return True

    def _refuse_offer(self) -> Response | None:
        """Why a WebRTC offer is refused before it is read (None: it is not), with the codes a
        WebSocket's error event carries."""
        if not webrtc_available():
            return unavailable()
        if self.shutting_down or self.registry.draining:
            return call_error(503, "server_shutting_down", "the gateway is shutting down; connect again")
        if self.registry.count >= self.registry.max_sessions:
            return call_error(
                429,
                "session_limit",
                f"the gateway is at its limit of {self.registry.max_sessions} sessions; try again later",
            )
        return None

    def _on_the_tracks(self, defaults: SessionConfig) -> SessionConfig:
        """``defaults`` with the formats a call's tracks are decoded to and encoded from.

        PCM16 at the engine's own rates: the transport's libswresample converts with under a
        millisecond held back, where the session's soxr would hold back ~20 ms each way.
        """
        engine = self.engine.capabilities
        return replace(
            defaults,
            input_format=replace(MEDIA_FORMAT, rate=engine.input_rate),
            output_format=replace(MEDIA_FORMAT, rate=engine.output_rate),
        )

    async def answer_call(self, request: Request) -> Response:
        """``POST /v1/realtime/calls`` (OpenAI's WebRTC interface): answer the offer, then serve the call.

        A ``session`` sent with the offer (multipart) applies over the client secret's, before
        the first event; a bad one refuses the call (400), as a bad offer does.
        """
        refused = self._refuse_offer()
        if refused is not None:
            return refused
        try:
            call = await read_call_request(request)
        except BadCall as exc:
            return call_error(400, "invalid_request", str(exc))
        defaults = self.defaults
        principal = request.scope.get("auth")
        principal = principal if isinstance(principal, Principal) else None
        try:
            if principal is not None and principal.session:
                defaults = _with_session(defaults, principal.session)
            if call.session is not None:
                defaults = _with_session(defaults, call.session)
        except ProtocolError as exc:
            return call_error(400, exc.code.value, f"session: {exc.message}")
        defaults = self._on_the_tracks(defaults)

        async def serve(socket: CallSocket, call_id: str) -> None:
            await self._serve_webrtc(socket, call_id, defaults, principal)

        return await self.calls.answer(
            call.sdp, serve, input_rate=defaults.input_format.rate, output_rate=defaults.output_format.rate
        )

    async def open_live_call(self, request: Request) -> Response:
        """``POST /v1/live/sessions`` (OpenAI's Live API over WebRTC): start the session, answer the offer.

        The body's ``session`` is the session's ``session.start`` (a bad one refuses the offer
        with the error that event would get); the Live events then travel on the first data
        channel the client opens, the audio on the tracks (see :mod:`duplex_gateway.server.live_calls`).
        """
        refused = self._refuse_offer()
        if refused is not None:
            return refused
        try:
            limit = self.settings.limits.max_message_bytes + MAX_SDP_BYTES
            call = await read_live_call(request, max_bytes=limit)
        except RefusedLiveCall as exc:
            return exc.response()
        session_id = new_session_id(self.settings.server.node_id)
        principal = request.scope.get("auth")
        principal = principal if isinstance(principal, Principal) else None
        defaults = self.defaults
        if principal is not None and principal.session:
            try:  # a client secret's session, as on the Live WebSocket; the POST's applies over it
                defaults = _with_session(defaults, principal.session)
            except ProtocolError as exc:
                logger.warning("session %s: client secret's session not applied: %s", session_id, exc.message)
        defaults = self._on_the_tracks(defaults)

        async def serve(socket: CallSocket, call_id: str) -> None:
            await self._serve_live_webrtc(socket, session_id, defaults, principal)

        answered = await self.calls.accept(
            call.sdp,
            serve,
            input_rate=defaults.input_format.rate,
            output_rate=defaults.output_format.rate,
            call_id=session_id,  # the Live API names a call by its session: hang-ups use that id
            events_channel=None,  # OpenAI names no label for the Live events' channel
            steerable=False,  # a Realtime sideband watches it; its events are not the Live API's
            opening=opening_event(call.session),
        )
        if not isinstance(answered, AnsweredCall):
            return answered
        return live_call_answer(session_id, answered.sdp)

    async def _serve_webrtc(
        self, socket: CallSocket, call_id: str, defaults: SessionConfig, principal: Principal | None
    ) -> None:
        session_id = new_session_id(self.settings.server.node_id)
        connection = Connection(
            socket,
            session_id=session_id,
            engine=self.engine,
            settings=self.settings,
            defaults=defaults,
            registry=self.registry,
            handshake=Handshake.REALTIME,
            dialect=WebRtcRealtimeDialect(
                session_id=session_id,
                call_id=call_id,
                max_message_bytes=self.settings.limits.max_message_bytes,
                input_format=defaults.input_format,
                output_format=defaults.output_format,
            ),
            resumes=None,  # a media connection cannot be resumed: a new call is a new session
            metrics=self.metrics,
            dialect_name="webrtc",
            recorder=self.recordings.start(
                session_id,
                principal=principal,
                engine=self.engine.capabilities,
                dialect="webrtc",
                config=defaults,
                endpoint={"path": CALLS_PATH, "query": {}, "beta": False},
            ),
        )
        await self._serve_connection(connection)

    async def _serve_live_webrtc(
        self, socket: CallSocket, session_id: str, defaults: SessionConfig, principal: Principal | None
    ) -> None:
        limits = self.settings.limits
        await self._serve_connection(
            Connection(
                socket,
                session_id=session_id,
                engine=self.engine,
                settings=self.settings,
                defaults=defaults,
                registry=self.registry,
                handshake=Handshake.DUPLEX,  # the session.start the POST carried opens it
                dialect=WebRtcLiveDialect(
                    session_id=session_id,
                    call_id=session_id,
                    expires_at=int(time.time() + limits.max_session_s),
                    max_message_bytes=limits.max_message_bytes,
                    backend=self.backend.model if self.backend is not None else None,
                    input_format=defaults.input_format,
                    output_format=defaults.output_format,
                ),
                backend=self.backend,
                resumes=None,  # the Live API has no resume, and a media connection none either
                metrics=self.metrics,
                dialect_name="live-webrtc",
                recorder=self.recordings.start(
                    session_id,
                    principal=principal,
                    engine=self.engine.capabilities,
                    dialect="live-webrtc",
                    config=defaults,
                    endpoint={"path": LIVE_SESSIONS_PATH, "query": {}, "beta": False},
                ),
            )
        )

    async def _serve_connection(self, connection: Connection) -> None:
        """Serve ``connection`` as one of the gateway's (hang-ups, observers, shutdown find it)."""
        self.connections.add(connection)
        try:
            await connection.serve()
        finally:
            self.connections.discard(connection)

    async def _serve(self, websocket: WebSocket, handshake: Handshake) -> None:
        offered = [
            p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
        ]
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        beta = (
            "realtime=v1" in websocket.headers.get("openai-beta", "")
            or _BETA_PROTOCOL in offered
            or websocket.query_params.get("beta", "0").lower() in ("1", "true")
        )
        session_id = new_session_id(self.settings.server.node_id)
        defaults = self.defaults
        if websocket.query_params.get("intent") == "transcription":
            # OpenAI's way to open a transcription session: it starts as one, transcribing.
            defaults = replace(
                defaults, kind=SessionKind.TRANSCRIPTION, input_transcription=InputTranscription()
            )
        principal = websocket.scope.get("auth")
        if isinstance(principal, Principal) and principal.session:
            # A client secret carries the session its minter asked for: this session starts as that.
            try:
                defaults = _with_session(defaults, principal.session)
            except ProtocolError as exc:  # checked when minted; a gateway of another version may differ
                logger.warning("session %s: client secret's session not applied: %s", session_id, exc.message)
        connection = self._realtime_connection(
            direct_socket(websocket),
            session_id,
            handshake,
            defaults,
            beta=beta,
            principal=principal if isinstance(principal, Principal) else None,
            endpoint=_endpoint(websocket, beta),
        )
        await self._serve_connection(connection)

    def _realtime_connection(
        self,
        socket: Socket,
        session_id: str,
        handshake: Handshake,
        defaults: SessionConfig,
        *,
        beta: bool = False,
        principal: Principal | None = None,
        endpoint: dict[str, object] | None = None,
    ) -> Connection:
        """A Realtime (or vLLM-Omni duplex) session on ``socket``; a session taken over gets no endpoint."""
        dialect = "duplex" if handshake is Handshake.DUPLEX else "realtime"
        return Connection(
            socket,
            session_id=session_id,
            engine=self.engine,
            settings=self.settings,
            defaults=defaults,
            registry=self.registry,
            handshake=handshake,
            dialect=RealtimeDialect(
                session_id=session_id,
                beta=beta,
                duplex=handshake is Handshake.DUPLEX,
                max_message_bytes=self.settings.limits.max_message_bytes,
            ),
            resumes=self.resumes,
            metrics=self.metrics,
            dialect_name=dialect,
            recorder=self.recordings.start(
                session_id,
                principal=principal,
                engine=self.engine.capabilities,
                dialect=dialect,
                config=defaults,
                endpoint=endpoint or {},
            ),
        )

    async def live(self, websocket: WebSocket) -> None:
        """``/v1/live/sessions``: OpenAI's full-duplex Live API; its ``session.start`` opens the session.

        Auth, admission, metrics, logs and recording are the Realtime route's; a Live session is
        not resumed (the Live API has no resume), so a dropped socket ends it.
        """
        offered = [
            p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
        ]
        # A browser offers "realtime" beside its key's subprotocol, as on /v1/realtime.
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        session_id = new_session_id(self.settings.server.node_id)
        defaults = self.defaults
        principal = websocket.scope.get("auth")
        if isinstance(principal, Principal) and principal.session:
            try:  # a client secret's session, as on /v1/realtime; session.start applies over it
                defaults = _with_session(defaults, principal.session)
            except ProtocolError as exc:
                logger.warning("session %s: client secret's session not applied: %s", session_id, exc.message)
        limits = self.settings.limits
        connection = Connection(
            direct_socket(websocket),
            session_id=session_id,
            engine=self.engine,
            settings=self.settings,
            defaults=defaults,
            registry=self.registry,
            handshake=Handshake.DUPLEX,  # nothing but session.start until it comes
            dialect=PacedLiveDialect(
                session_id=session_id,
                expires_at=int(time.time() + limits.max_session_s),
                max_message_bytes=limits.max_message_bytes,
                backend=self.backend.model if self.backend is not None else None,
            ),
            backend=self.backend,
            resumes=None,
            metrics=self.metrics,
            dialect_name="live",
            recorder=self.recordings.start(
                session_id,
                principal=principal if isinstance(principal, Principal) else None,
                engine=self.engine.capabilities,
                dialect="live",
                config=defaults,
                endpoint=_endpoint(websocket, False),
            ),
        )
        await self._serve_connection(connection)

    async def close_all(self, timeout_s: float = 5.0) -> None:
        """Tell every live session the gateway is going away and wait for them to close."""
        self.begin_drain()
        connections = list(self.connections) + self.resumes.parked()
        if not connections:
            return
        logger.info("closing %d sessions for shutdown", len(connections))
        await asyncio.gather(*(c.shut_down() for c in connections), return_exceptions=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # Connections leave the set from their own tasks: polled against the deadline, with no event to wait on.
        while self.connections and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    def stop_admitting(self) -> None:
        """/readyz answers 503 and every new session is refused (1013) from now on.

        Only sets flags (no lock, no log), so a signal handler may call it.
        """
        self.shutting_down = True
        self.registry.draining = True

    def begin_drain(self) -> None:
        self.stop_admitting()
        self.metrics.draining(True)

    async def drain(self, grace_s: float, *, abandon: Callable[[], bool] = lambda: False) -> None:
        """Drain for shutdown: warn live sessions, let them finish their reply for ``grace_s``, close the rest.

        Sessions close (1001) as their reply in progress ends; detached ones at once, since
        nobody would hear the warning. ``abandon`` (a second signal) cuts the grace short.
        """
        self.begin_drain()
        loop = asyncio.get_running_loop()
        hosts = self.registry.hosts()
        admitted = {id(host) for host in hosts}
        # Connections not (yet) a session: a duplex handshake before its session.update, a socket
        # handed over to a resumed session. Nothing to finish: closed now.
        others = [c for c in self.connections if id(c) not in admitted]
        if hosts or others:
            logger.info("draining %d sessions for shutdown (grace %g s)", len(hosts), grace_s)
        parked = {id(c) for c in self.resumes.parked()}
        for host in hosts:
            host.drain(grace_s)
        await asyncio.gather(
            *(c.shut_down() for c in others),
            *(h.shut_down() for h in hosts if id(h) in parked),
            return_exceptions=True,
        )
        deadline = loop.time() + grace_s
        # Polled: sessions end in their own tasks, and `abandon` (a signal) sets no event either.
        while (self.registry.count or self.connections) and loop.time() < deadline and not abandon():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        left = {
            id(c): c for c in [*self.registry.hosts(), *self.connections] if not c.session.closed
        }.values()
        if left:
            logger.info("drain grace over: closing %d sessions", len(left))
            await asyncio.gather(*(c.shut_down() for c in left), return_exceptions=True)
        # Their closing frames and engine releases take a moment more (bounded by the send timeout).
        deadline = loop.time() + self.settings.limits.send_timeout_s
        while (self.registry.count or self.connections) and loop.time() < deadline and not abandon():  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Every session runs the VAD: loaded before the app serves, so /readyz is never ready without it.
        await asyncio.to_thread(SileroVad.shared)
        await self.engine.start()
        logger.info("engine %s ready", self.engine.capabilities.name)
        if self.fleet is not None:
            await self.fleet.start()
        audiosocket: AudioSocketServer | None = None
        if self._backend_settings is not None:
            self.backend = await ResponsesBackend.connect(self._backend_settings)
            if self.backend is not None:
                logger.info(
                    "Live Responses delegation goes to model %s at %s", self.backend.model, self.backend.where
                )
        try:
            # Asterisk AudioSocket calls over TCP, when telephony.audiosocket_port is set.
            audiosocket = await start_audiosocket(
                self.serve_call, self.settings.server.host, self.settings.telephony.audiosocket_port
            )
            yield
        finally:
            await self.calls.close()
            if self.fleet is not None:
                await self.fleet.close()
            if audiosocket is not None:
                await audiosocket.close()
            if self.backend is not None:
                await self.backend.aclose()
            held = self.engine.active_sessions
            await self.engine.shutdown()
            # What an operator checks after a drain: every engine session released before the engine stopped.
            logger.info(
                "engine %s stopped; it held %d sessions at shutdown, %d now",
                self.engine.capabilities.name,
                held,
                self.engine.active_sessions,
                extra={
                    "event": "engine_stopped",
                    "engine_sessions_at_shutdown": held,
                    "engine_sessions": self.engine.active_sessions,
                    "sessions": self.registry.count,
                },
            )


def _endpoint(websocket: WebSocket, beta: bool) -> dict[str, object]:
    """Where a recorded session connected, for its replay: the path and the query, credentials left out."""
    query = {
        name: value
        for name, value in websocket.query_params.items()
        if not any(secret in name.lower() for secret in ("key", "token", "secret"))
    }
    return {"path": websocket.url.path, "query": query, "beta": beta}


def _no_such_call() -> Response:
    return JSONResponse({"error": {"code": "not_found", "message": "no live call with that id"}}, 404)


def _live_tasks() -> int:
    """Tasks alive in the running loop (0 outside one: a scrape always runs inside it)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


def _with_session(defaults: SessionConfig, session: Mapping[str, object]) -> SessionConfig:
    """``defaults`` with a Realtime ``session`` object applied, as ``session.update`` would apply it."""
    return defaults.apply(parse_session_patch(session))


def create_app(settings: GatewaySettings, engine: port.Engine) -> Starlette:
    """The gateway as an ASGI app serving ``engine``."""
    # A configured carrier feature (a hang-up, a signature) whose extra is missing is refused now,
    # not when a call ends.
    require_extras(settings.telephony)
    gateway = _Gateway(settings, engine)
    # Authentication, origins and connection limits, decided before any handler runs (duplex_gateway.auth).
    gate = Gate.from_settings(settings, signature_checks(settings))

    def describe_session(session: Mapping[str, object]) -> Mapping[str, object]:
        # What a client secret minted with ``session`` opens, checked now: a bad value fails the mint.
        payload = session_payload(_with_session(gateway.defaults, session), session_id="", beta=False)
        payload.pop("id", None)  # no session exists yet
        return payload

    def refused(denial: Denial) -> None:
        gateway.metrics.auth_refused(denial.reason)

    routes: list[Route | WebSocketRoute | Mount] = [
        Route("/healthz", gateway.healthz),
        Route("/readyz", gateway.readyz),
        Route("/metrics", gateway.metrics_endpoint),
        # The carriers' answer webhooks (/telephony/<carrier>/<path>), from the carriers' table.
        *webhook_routes(settings),
        Route(CALLS_PATH, gateway.answer_call, methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}/hangup", gateway.hang_up_call, methods=["POST"]),
        Route(LIVE_SESSIONS_PATH, gateway.open_live_call, methods=["POST"]),
        Route(LIVE_SESSIONS_PATH + "/{session_id}/hangup", gateway.hang_up_live_session, methods=["POST"]),
        WebSocketRoute("/v1/realtime", gateway.realtime),
        WebSocketRoute("/v1/duplex", gateway.duplex),
        WebSocketRoute("/v1/live/sessions", gateway.live),
        WebSocketRoute("/telephony", gateway.telephony),
        WebSocketRoute("/telephony/{carrier}", gateway.telephony),
        # POST /v1/realtime/client_secrets (OpenAI's ephemeral keys), GET /v1/auth/check.
        *auth_routes(gate, describe_session),
    ]
    admin_routes = getattr(engine, "admin_routes", None)
    if callable(admin_routes):
        # Engines may serve admin endpoints (engine remote: /admin/backends); the auth layer asks
        # for the admin scope there, so the routes carry no keys of their own.
        routes.extend(admin_routes(()))
    if settings.server.web_demo and WEB_DEMO_DIR.is_dir():
        routes.append(Mount("/", app=StaticFiles(directory=WEB_DEMO_DIR, html=True), name="web_demo"))
    app = Starlette(
        routes=routes,
        lifespan=gateway.lifespan,
        middleware=[Middleware(AuthMiddleware, gate=gate, on_refused=refused)],
    )
    app.state.gateway = gateway
    app.state.gate = gate
    return app
