"""``duplex-gateway bench``: capacity and latency, side by side, in one run.

Simulated callers (:mod:`~duplex_gateway.bench.callers`) talk in real time to
each target server (:mod:`~duplex_gateway.bench.targets`, the floor server in
:mod:`~duplex_gateway.bench.floor`) at each concurrency level
(:mod:`~duplex_gateway.bench.run`); what they measure
(:mod:`~duplex_gateway.bench.metrics`) becomes JSON, a markdown report
(:mod:`~duplex_gateway.bench.report`) and PNG plots
(:mod:`~duplex_gateway.bench.plots`). The turn-taking part
(:mod:`~duplex_gateway.bench.turns`) compares ``server_vad`` with ``semantic_vad`` on the
embedded engine. Nothing in the gateway imports this package.
"""
