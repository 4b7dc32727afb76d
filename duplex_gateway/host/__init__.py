"""The asyncio around one caller's session: its socket, engine link, outbox, resumption and lifetime.

* :mod:`~duplex_gateway.host.connection`: a session's lifetime, and the wiring of the rest;
* :mod:`~duplex_gateway.host.transport`: the socket attachment, one writer task draining an
  outbox the session fills without waiting, and stall detection;
* :mod:`~duplex_gateway.host.reader`: the read loop, one message at a time, with input
  backpressure, the idle timeout and the maximum session duration;
* :mod:`~duplex_gateway.host.outbox`: numbering, rendering, the resume journal, observers and
  the recorder; :mod:`~duplex_gateway.host.pacing`: a phone call's reply audio in real time;
* :mod:`~duplex_gateway.host.engine_link`: engine calls one way, in order, from one task;
* :mod:`~duplex_gateway.host.resumption` (journal, registry, tokens) and
  :mod:`~duplex_gateway.host.takeover` (a resume's two sides);
* :mod:`~duplex_gateway.host.closing`: the one table from every failure to its error event
  and close code; :mod:`~duplex_gateway.host.admission` and :mod:`~duplex_gateway.host.observers`.
"""
