"""DKIM private keys: read from PEM files, checked against the algorithm, and made.

A key is read once (`load_key`), when the node starts or reloads (and parsed again only if
its file changed); signing never touches the file. `dns_record` prints what the domain
publishes at `<selector>._domainkey.<domain>`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Final, Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

Algorithm = Literal["rsa-sha256", "ed25519-sha256"]
PrivateKey = rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey

MIN_RSA_BITS: Final = 1024  # RFC 8301 3.2: verifiers must not accept less
_TXT_STRING: Final = 255  # longest character-string in a TXT record (RFC 1035 3.3)


class KeyProblem(Exception):
    """The key file cannot be used; the message names the file and says why."""


DNS_NAME_PATTERN: Final = r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\Z"
"""A DNS name as DKIM's d= and s= take it (RFC 6376 3.1): dot-separated labels of letters,
digits and hyphens (`name_problem` checks `[[dkim]] selector` and keygen's names with it). It
ends in \\Z: a `$` also matches before a final newline, which would then reach the
DKIM-Signature header (s=)."""
_NAME: Final = re.compile(DNS_NAME_PATTERN)


def name_problem(what: str, name: str) -> str | None:
    """Why `name` cannot be a DKIM domain or selector (`what`: "domain", "selector"), or None."""
    if not name.isascii():
        return f"{what} {name!r}: write an internationalised name as its A-label (xn--...)"
    if len(name) > 253 or not _NAME.match(name) or any(len(label) > 63 for label in name.split(".")):
        return f"{what} {name!r} is not a DNS name (letters, digits, hyphens, dot-separated labels)"
    return None


def load_key(path: Path, algorithm: Algorithm) -> PrivateKey:
    """Read a PEM private key (PKCS#8 or traditional) and check it suits `algorithm`.

    The file is read every time; a key whose bytes were parsed before (at start, or by the
    configuration's check a moment ago) is that key again, not parsed again: parsing an
    RSA-2048 key checks it, 45 to 90 ms of CPU during which OpenSSL holds the GIL, so a
    reload that read each key twice held a worker's event loop (and a policy's hook threads)
    for that long, key after key, though no key had changed."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise KeyProblem(f"cannot read the key file {path}: {error.strerror or error}") from None
    known = (algorithm, hashlib.sha256(data).digest())
    with _PARSED_LOCK:
        key = _PARSED.get(known)
    if key is not None:
        return key
    key = _parse(path, data, algorithm)
    with _PARSED_LOCK:
        _PARSED[known] = key
        while len(_PARSED) > _PARSED_KEPT:  # (keys rolled over long ago)
            del _PARSED[next(iter(_PARSED))]
    return key


_PARSED: dict[tuple[Algorithm, bytes], PrivateKey] = {}  # (algorithm, SHA-256 of the file) -> key
_PARSED_LOCK: Final = threading.Lock()  # (a reload reads in a thread of its own)
_PARSED_KEPT: Final = 1024


def _parse(path: Path, data: bytes, algorithm: Algorithm) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyProblem(f"the key in {path} is encrypted; DKIM keys must be stored without a passphrase") from None
    except (ValueError, NotImplementedError) as error:
        raise KeyProblem(f"{path} holds no PEM private key Pigeon can read ({_without_links(error)})") from None
    if algorithm == "rsa-sha256":
        if not isinstance(key, rsa.RSAPrivateKey):
            raise KeyProblem(f"{path} holds {_a(_kind(key))} key, not the RSA key rsa-sha256 needs")
        if key.key_size < MIN_RSA_BITS:
            raise KeyProblem(f"{path} holds a {key.key_size}-bit RSA key; verifiers refuse under {MIN_RSA_BITS} bits")
        return key
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise KeyProblem(f"{path} holds {_a(_kind(key))} key, not the Ed25519 key ed25519-sha256 needs")
    return key


_SEE_LINK: Final = re.compile(r"\s*See \S+://\S+ for more details\.")


def _without_links(error: Exception) -> str:
    """The library's reason without its "See <URL> for more details." sentence: every message
    is redacted before it is shown or logged, which masks a URL's fragment (it can carry a
    token), so the link would be shown broken ("faq/#***"); the reason itself is about a file,
    and helps without it."""
    return _SEE_LINK.sub("", str(error)).strip() or type(error).__name__


def generate_key(algorithm: Algorithm, bits: int = 2048) -> PrivateKey:
    """A new private key for `algorithm` (`bits`: RSA only)."""
    if algorithm == "rsa-sha256":
        return rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return ed25519.Ed25519PrivateKey.generate()


def pem(key: PrivateKey) -> bytes:
    """The key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_key(path: Path, key: PrivateKey) -> None:
    """Write the key to a new file, mode 0600 from its creation; an existing file is not replaced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(pem(key))


def public_value(key: PrivateKey) -> str:
    """The `p=` of the key record: base64 of the DER SubjectPublicKeyInfo (RSA), or of the
    32 raw bytes of the public key (Ed25519, RFC 8463 4)."""
    public = key.public_key()
    if isinstance(public, ed25519.Ed25519PublicKey):
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    else:
        raw = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(raw).decode("ascii")


def record_text(key: PrivateKey) -> str:
    """The key record's text: "v=DKIM1; k=rsa; p=..." (RFC 6376 3.6.1)."""
    kind = "ed25519" if isinstance(key, ed25519.Ed25519PrivateKey) else "rsa"
    return f"v=DKIM1; k={kind}; p={public_value(key)}"


def dns_record(domain: str, selector: str, key: PrivateKey) -> str:
    """The zone-file line to publish, its text split into strings of at most 255 bytes."""
    text = record_text(key)
    strings = " ".join(f'"{text[i : i + _TXT_STRING]}"' for i in range(0, len(text), _TXT_STRING))
    return f"{selector}._domainkey.{domain.rstrip('.')}. IN TXT {strings}"


def _kind(key: object) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return "RSA"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "Ed25519"
    return type(key).__name__.removeprefix("_").replace("PrivateKey", "") or "other"


def _a(kind: str) -> str:
    """`kind` with its article, as it is read out: "an Ed25519", "an RSA", "a DSA"."""
    return f"{'an' if kind[:1] in set('AEFHILMNORSX') else 'a'} {kind}"
