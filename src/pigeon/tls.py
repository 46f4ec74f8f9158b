"""The TLS floor of every connection Pigeon makes or takes: TLS 1.2 or newer.

Python 3.10+ already starts its contexts at TLS 1.2, but that is a build default (and an
OpenSSL configuration may lower the security level); Pigeon states its own floor, so a
TLS 1.0/1.1 peer is refused whatever the interpreter or the system configuration say.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2


def client_context(*, verify: bool, cafile: Path | None = None) -> ssl.SSLContext:
    """A client context: TLS 1.2 or newer; with `verify`, the certificate and name are checked
    against `cafile` (or the system's CAs); without it, anything is taken (opportunistic TLS)."""
    if verify:
        context = ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.minimum_version = MINIMUM_VERSION
    return context


def server_context(certificate: Path, private_key: Path) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, the defaults' ciphers. Raises `OSError` or
    `ssl.SSLError` when the files cannot be read or do not make a pair."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    context.load_cert_chain(certificate, private_key)
    return context
