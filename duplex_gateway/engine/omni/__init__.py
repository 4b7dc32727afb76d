"""vLLM-Omni, translated once for every engine that talks to it.

The ``vllm-omni`` engine (an in-process ``DuplexOmni``) and the ``remote`` engine
(vLLM-Omni's ``/v1/realtime`` server over a socket) speak the same vocabulary;
what turns it into the engine port's words lives here, free of I/O:

* :mod:`.events` -- server events -> port events (a table), and a reply's end;
* :mod:`.audio` -- a reply's audio: formats, resampling, the playback ledger's count;
* :mod:`.session` -- the ``session`` object a session is opened and updated with;
* :mod:`.fields`, :mod:`.tools`, :mod:`.items` -- its vLLM-Omni fields, function
  tools and calls, conversation messages;
* :mod:`.loading` -- building the vLLM-Omni object an in-process engine runs.

Each engine keeps only what differs between a handle and a socket: which reply
it asked for is which, its commits, updates and the errors about its own commands.
"""
