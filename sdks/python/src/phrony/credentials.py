"""Channel credentials for the runtime's auth modes, from arguments or the CLI's variables.

| argument | variable | meaning |
|---|---|---|
| `token` | `PHRONY_TOKEN` | an API token or OIDC JWT, sent as `authorization: Bearer …` |
| `tls_ca` | `PHRONY_TLS_CA` | PEM file of the CA that signed the runtime's certificate: TLS |
| `tls_cert`, `tls_key` | `PHRONY_TLS_CERT`, `PHRONY_TLS_KEY` | client certificate and key (mutual TLS) |

A token is never sent in plaintext over the network: without TLS it is only sent to a loopback
address (gRPC's local credentials); to any other address it is refused with `PhronyError`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import grpc

from phrony.client.errors import PhronyError


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise PhronyError(f"cannot read the {what} {os.fspath(path)!r}: {error.strerror or error}") from None


def is_loopback(address: str) -> bool:
    """Whether `host:port` names this machine (`localhost`, 127.0.0.0/8, ::1)."""
    host = address
    for scheme in ("http://", "https://"):
        host = host.removeprefix(scheme)
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def channel_credentials(
    address: str,
    *,
    token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    use_env: bool = True,
) -> grpc.ChannelCredentials | None:
    """The credentials to reach `address` with; `None` means a plaintext channel."""
    if use_env:
        token = token or _env("PHRONY_TOKEN")
        tls_ca = tls_ca or _env("PHRONY_TLS_CA")
        tls_cert = tls_cert or _env("PHRONY_TLS_CERT")
        tls_key = tls_key or _env("PHRONY_TLS_KEY")
    if (tls_cert is None) != (tls_key is None):
        raise PhronyError("a client certificate needs both tls_cert and tls_key (PHRONY_TLS_CERT / PHRONY_TLS_KEY)")
    if address.startswith("http://") and (tls_ca or tls_cert):
        raise PhronyError(f"{address} is http:// but TLS settings were given; use https:// or drop tls_ca/tls_cert")
    tls = bool(tls_ca or tls_cert) or address.startswith("https://")
    if tls:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca, "TLS CA file") if tls_ca else None,
            private_key=_read(tls_key, "TLS client key") if tls_key else None,
            certificate_chain=_read(tls_cert, "TLS client certificate") if tls_cert else None,
        )
        if token:
            return grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return creds
    if token:
        if not is_loopback(address):
            raise PhronyError(
                f"refusing to send a token in plaintext to {address}: connect over TLS (tls_ca / PHRONY_TLS_CA) "
                "or to a loopback address"
            )
        return grpc.composite_channel_credentials(
            grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
            grpc.access_token_call_credentials(token),
        )
    return None
