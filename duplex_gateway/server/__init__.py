"""The HTTP server: the ASGI application's routes, probes and the web demo, and uvicorn's limits."""
