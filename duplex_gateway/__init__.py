"""duplex-gateway: a real-time full-duplex speech gateway over WebSockets."""

__version__ = "0.1.0"
