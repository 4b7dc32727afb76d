"""The gateway's Prometheus metrics: one registry per app, every family, small typed methods.

Everything the gateway measures is named here once. The session host
(:mod:`duplex_gateway.host.connection`), the engine link, the transport's hooks and the
HTTP tier call these methods; nothing else imports ``prometheus_client``. Each
:class:`GatewayMetrics` owns its registry (never the process-global one), so
several apps in one process (tests) keep apart, and ``GET /metrics`` serves it.

Labels are kept to small, fixed sets: a close reason a client or an engine
wrote itself is folded into a known one (:func:`close_reason`), so no one can
grow the number of series by sending odd strings.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from duplex_gateway.engine import port

__all__ = ["CLOSE_REASONS", "CONTENT_TYPE", "GatewayMetrics", "SessionLabels", "call_name", "close_reason"]

#: The ``Content-Type`` of :meth:`GatewayMetrics.render`: text format 0.0.4, which every Prometheus
#: reads (the names here are all plain ASCII, so the output is the same as 1.0.0's).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

PREFIX = "duplex_gateway"

#: Reply latencies: a voice reply is good under 0.5 s and bad past 2 s.
_LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
#: Gaps between two audio chunks of one reply: ~20-100 ms when streaming, more is a stall.
_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
#: Barge-in cut-off: 0 when the reply was all out already; tens of ms when the queue held some.
_CUTOFF_BUCKETS = (0.001, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
#: Engine calls: an append is sub-millisecond, an open or a start may take seconds.
_CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The reader's wait for the engine and the audio stage, per client message: ~0 unless backlogged.
_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Frames in one session's send queue right after one is queued (``limits.send_queue_size``: 1024).
_DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

#: Close reasons kept as they are; any other is folded into the reason its close code stands for.
CLOSE_REASONS = frozenset(
    {
        "client_closed",  # the client closed the socket (1000 / 1001) or sent session.close
        "client_dropped",  # the socket dropped and the session could not be resumed
        "resume_timeout",  # it dropped and was not resumed within limits.resume_grace_s
        "server_shutdown",
        "server_shutting_down",  # refused: the gateway was draining
        "session_limit",
        "engine_unavailable",
        "idle_timeout",
        "max_duration",
        "slow_consumer",
        "unauthorized",
        "internal_error",
        "engine_error",
        "engine_closed",
        "hangup_requested",
        "call_ended",
        "unsupported_call_format",
    }
)
_BY_CODE = {
    1000: "client_closed",
    1001: "server_shutdown",
    1008: "unauthorized",
    1011: "internal_error",
    1013: "session_limit",
    4000: "idle_timeout",
    4001: "max_duration",
    4002: "slow_consumer",
    4003: "engine_closed",
}


def close_reason(reason: str | None, code: int | None) -> str:
    """``reason`` as a label value: one of :data:`CLOSE_REASONS`, else its close code's."""
    if reason:
        name = reason.strip().lower().replace(" ", "_")
        if name.startswith("call_ended"):  # the carrier's words after the colon vary
            return "call_ended"
        if name in CLOSE_REASONS:
            return name
    if code is None:
        return "client_closed"
    return _BY_CODE.get(code, "other")


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def call_name(call: object) -> str:
    """An engine call's label: its type in snake case (``StartResponse`` -> ``start_response``)."""
    return _snake(type(call).__name__)


@functools.cache
def _snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


class SessionLabels:
    """The labels one session's series carry, fixed when it is admitted."""

    __slots__ = ("dialect", "engine")

    def __init__(self, dialect: str, engine: str) -> None:
        self.dialect = dialect
        self.engine = engine


class GatewayMetrics:
    """Every metric family of one gateway, in a registry of its own."""

    def __init__(self, engine: str = "unknown") -> None:
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._sessions_active = Gauge(
            f"{PREFIX}_sessions_active",
            "Sessions holding an admission slot now.",
            ("dialect", "engine"),
            registry=r,
        )
        self._sessions = Counter(
            f"{PREFIX}_sessions",
            "Sessions ended (refusals included), by how they ended.",
            ("dialect", "engine", "reason"),
            registry=r,
        )
        self._replies = Counter(
            f"{PREFIX}_replies",
            "Replies finished, by status (completed, cancelled, failed, incomplete).",
            ("engine", "status"),
            registry=r,
        )
        self._barge_ins = Counter(
            f"{PREFIX}_barge_ins",
            "Replies cut off because the caller spoke over them.",
            ("engine",),
            registry=r,
        )
        self._first_audio = Histogram(
            f"{PREFIX}_first_audio_seconds",
            "Reply requested (turn committed, or response.create) to its first audio chunk going out.",
            ("engine",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._speech_end = Histogram(
            f"{PREFIX}_speech_end_to_first_audio_seconds",
            "End of the caller's speech to the reply's first audio going out (the gateway's turn detection; "
            "turn.latency total_ms).",
            ("engine",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._cutoff = Histogram(
            f"{PREFIX}_barge_in_cutoff_seconds",
            "Caller speech start to the last audio of the cancelled reply sent to the client.",
            ("engine",),
            buckets=_CUTOFF_BUCKETS,
            registry=r,
        )
        self._gaps = Histogram(
            f"{PREFIX}_output_chunk_gap_seconds",
            "Interval between two consecutive audio chunks of one reply written to the client.",
            ("engine",),
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self._backpressure = Histogram(
            f"{PREFIX}_input_backpressure_seconds",
            "Per client message: time the reader waited for the audio stage and the engine before reading on.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self._queue_depth = Histogram(
            f"{PREFIX}_send_queue_depth",
            "Frames waiting in a session's send queue, sampled each time one is queued.",
            buckets=_DEPTH_BUCKETS,
            registry=r,
        )
        client_bytes = Counter(
            f"{PREFIX}_client_bytes",
            "WebSocket message bytes from (in) and to (out) clients.",
            ("direction",),
            registry=r,
        )
        self._bytes_in, self._bytes_out = client_bytes.labels("in"), client_bytes.labels("out")
        self._engine_calls = Histogram(
            f"{PREFIX}_engine_call_seconds",
            "Engine calls that succeeded, by call, and how long each took.",
            ("call",),
            buckets=_CALL_BUCKETS,
            registry=r,
        )
        self._engine_call_children: dict[str, Histogram] = {}
        self._engine_errors = Counter(
            f"{PREFIX}_engine_call_errors",
            "Engine calls that failed: timeout, refused (by the engine) or failed.",
            ("call", "kind"),
            registry=r,
        )
        self._auth_refusals = Counter(
            f"{PREFIX}_auth_refusals",
            "Requests refused by authentication or its limits, by reason.",
            ("reason",),
            registry=r,
        )
        self._resumes = Counter(
            f"{PREFIX}_resumes",
            "session.resume attempts and detached sessions, by outcome "
            "(resumed, refused, gap, disabled, expired).",
            ("outcome",),
            registry=r,
        )
        self._draining = Gauge(f"{PREFIX}_draining", "1 while the gateway drains for shutdown.", registry=r)
        self._engine_sessions = Gauge(
            f"{PREFIX}_engine_sessions",
            "Sessions the engine holds open now.",
            registry=r,
        )
        self._tasks = Gauge(
            f"{PREFIX}_tasks",
            "asyncio tasks alive in the gateway's event loop now (a leak shows as growth).",
            registry=r,
        )

    # -- the exposition -----------------------------------------------------------------

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

    def watch_engine_sessions(self, count: Callable[[], int]) -> None:
        """Read the engine's open session count at each scrape."""
        self._engine_sessions.set_function(lambda: float(count()))

    def watch_state_store(self, up: Callable[[], bool]) -> None:
        """Read at each scrape whether the state store answers (a gateway without one has no such series)."""
        gauge = Gauge(
            f"{PREFIX}_state_store_up",
            "1 while the fleet's state store (server.state_store) answers; 0 while it does not.",
            registry=self.registry,
        )
        gauge.set_function(lambda: 1.0 if up() else 0.0)

    def watch_tasks(self, count: Callable[[], int]) -> None:
        """Read the event loop's live task count at each scrape."""
        self._tasks.set_function(lambda: float(count()))

    # -- sessions ----------------------------------------------------------------------------

    def labels(self, dialect: str) -> SessionLabels:
        return SessionLabels(dialect, self.engine)

    def session_admitted(self, labels: SessionLabels) -> None:
        self._sessions_active.labels(labels.dialect, labels.engine).inc()

    def session_released(self, labels: SessionLabels) -> None:
        self._sessions_active.labels(labels.dialect, labels.engine).dec()

    def session_ended(self, labels: SessionLabels, reason: str) -> None:
        """``reason``: a value of :func:`close_reason`."""
        self._sessions.labels(labels.dialect, labels.engine, reason).inc()

    def reply_done(self, status: str) -> None:
        self._replies.labels(self.engine, status if status in _STATUSES else "other").inc()

    def first_audio(self, seconds: float) -> None:
        self._first_audio.labels(self.engine).observe(seconds)

    def speech_end_to_first_audio(self, seconds: float) -> None:
        self._speech_end.labels(self.engine).observe(seconds)

    def barge_in(self) -> None:
        self._barge_ins.labels(self.engine).inc()

    def barge_in_cutoff(self, seconds: float) -> None:
        self._cutoff.labels(self.engine).observe(max(0.0, seconds))

    def output_gap(self, seconds: float) -> None:
        self._gaps.labels(self.engine).observe(seconds)

    # -- the socket and the reader ---------------------------------------------------------

    def input_wait(self, seconds: float) -> None:
        self._backpressure.observe(seconds)

    def send_queue_depth(self, depth: int) -> None:
        self._queue_depth.observe(depth)

    def byte_counters(self) -> tuple[Callable[[float], None], Callable[[float], None]]:
        """``(in, out)`` adders for client bytes, bound once (they run per frame)."""
        return self._bytes_in.inc, self._bytes_out.inc

    # -- the engine ------------------------------------------------------------------------

    def engine_call(self, call: str, seconds: float) -> None:
        # Every caller frame is an append: the labelled child is looked up once, not per frame.
        child = self._engine_call_children.get(call)
        if child is None:
            child = self._engine_call_children[call] = self._engine_calls.labels(call)
        child.observe(seconds)

    def engine_call_failed(self, call: str, kind: str) -> None:
        """``kind``: ``timeout``, ``refused`` or ``failed``."""
        self._engine_errors.labels(call, kind).inc()

    @contextlib.contextmanager
    def timed_call(self, call: str) -> Iterator[None]:
        """Time the engine call in the block, or count how it failed; the exception goes on."""
        began = time.monotonic()
        try:
            yield
        except TimeoutError:
            self.engine_call_failed(call, "timeout")
            raise
        except (port.EngineRefused, port.EngineSessionLimit):
            self.engine_call_failed(call, "refused")
            raise
        except Exception:
            self.engine_call_failed(call, "failed")
            raise
        self.engine_call(call, time.monotonic() - began)

    # -- the HTTP tier ---------------------------------------------------------------------

    def auth_refused(self, reason: str) -> None:
        """A request refused by authentication or its limits (e.g. ``missing_key``, ``invalid_key``)."""
        self._auth_refusals.labels(reason[:64]).inc()

    def resume(self, outcome: str) -> None:
        """``outcome``: ``resumed``, ``refused``, ``gap``, ``disabled`` or ``expired``."""
        self._resumes.labels(outcome).inc()

    def draining(self, on: bool) -> None:
        self._draining.set(1 if on else 0)


_STATUSES = frozenset({"completed", "cancelled", "failed", "incomplete"})
