"""The conversation state of one caller, as a sans-I/O state machine.

:mod:`~duplex_gateway.session.machine` holds the :class:`~duplex_gateway.session.machine.Session`
facade and its phase table; its parts are :mod:`~duplex_gateway.session.replies`,
:mod:`~duplex_gateway.session.turns`, :mod:`~duplex_gateway.session.conversation`,
:mod:`~duplex_gateway.session.backchannels` (a reply held while caller speech over it is judged, by
:mod:`~duplex_gateway.session.overlap`'s rule) and :mod:`~duplex_gateway.session.settings`. What it returns besides server events is in
:mod:`~duplex_gateway.session.engine_calls`. No module here does I/O or reads a clock.
"""
