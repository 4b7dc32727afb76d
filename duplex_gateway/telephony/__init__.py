"""Phone calls: carriers' media streams translated into the gateway's one vocabulary.

Each carrier is a pure translator (:class:`~duplex_gateway.telephony.carrier.Carrier`)
between its WebSocket messages and call events; :class:`~duplex_gateway.telephony.dialect.CallDialect`
turns call events into the session's commands and the session's events into the
carrier's media, marks and clears, pacing reply audio through
:class:`~duplex_gateway.telephony.playout.Playout` so a clear removes what the caller
has not heard yet. No engine knows a call is a call.
"""
