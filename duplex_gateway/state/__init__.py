"""Session state shared by a fleet of gateways (``server.state_store``).

Without a store a session lives in its gateway's memory only. With one (Redis, or
Valkey), each gateway writes what another would need to carry the session on as
the session goes: its resume journal, its resume token, its configuration, and an
ownership lease that says which gateway serves it. Writes never wait on the audio
path: :class:`~duplex_gateway.state.writer.StoreWriter` batches them on a task of
its own, and a store that is down costs cross-gateway resume, not a session.
"""

from duplex_gateway.state.records import JournalEntry, Replay, SessionRecord
from duplex_gateway.state.store import StateStore, StoreUnavailable

__all__ = ["JournalEntry", "Replay", "SessionRecord", "StateStore", "StoreUnavailable"]
