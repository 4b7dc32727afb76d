"""Authentication, origin and connection limits for every HTTP request and WebSocket handshake.

One layer decides before the app runs (:class:`AuthMiddleware`, like Starlette's
``AuthenticationMiddleware``) and leaves a :class:`Principal` in ``scope["auth"]``; handlers read it
and check nothing themselves. Its parts, each pure but the middleware:

* :mod:`~duplex_gateway.auth.credentials`: the secrets a request presents (Bearer, subprotocol, ...);
* :mod:`~duplex_gateway.auth.keys`: the configured keys, kept hashed;
* :mod:`~duplex_gateway.auth.tokens`: client secrets (ephemeral keys), HMAC-signed;
* :mod:`~duplex_gateway.auth.policy`: what each endpoint needs, allowed origins, refusals;
* :mod:`~duplex_gateway.auth.limits`: connection rate and concurrent sessions per key and address;
* :mod:`~duplex_gateway.auth.gate`: the decision, with carriers' signature checks plugged in;
* :mod:`~duplex_gateway.auth.routes`: ``POST /v1/realtime/client_secrets``, ``GET /v1/auth/check``.
"""

from __future__ import annotations

from duplex_gateway.auth.gate import Gate, SignatureCheck
from duplex_gateway.auth.keys import ApiKey, KeyStore, hash_key
from duplex_gateway.auth.middleware import AuthMiddleware
from duplex_gateway.auth.policy import Denial, OriginPolicy
from duplex_gateway.auth.principal import Principal, PrincipalKind, Scope
from duplex_gateway.auth.routes import SessionDescriber, auth_routes
from duplex_gateway.auth.tokens import TokenSigner

__all__ = [
    "ApiKey",
    "AuthMiddleware",
    "Denial",
    "Gate",
    "KeyStore",
    "OriginPolicy",
    "Principal",
    "PrincipalKind",
    "Scope",
    "SessionDescriber",
    "SignatureCheck",
    "TokenSigner",
    "auth_routes",
    "hash_key",
]
