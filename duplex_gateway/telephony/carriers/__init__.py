"""One module per carrier: a pure translator of its media-stream messages (see :mod:`..carrier`)."""
