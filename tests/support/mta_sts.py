"""For MTA-STS tests: a CA of the test's own (cryptography) and an HTTPS policy server (aiohttp)
on loopback, in a thread, serving `/.well-known/mta-sts.txt` by the request's Host."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import threading
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pigeon.tls import server_context
from tests.support.process import free_port


class TestCa:
    """A CA whose certificate is `path` (the `ca_file` to trust), issuing server certificates."""

    __test__ = False  # (not a test class, whatever its name)

    def __init__(self, directory: Path, name: str = "Pigeon Test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._name = subject
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.path = directory / f"{name.replace(' ', '-').lower()}.pem"
        self.path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *more: str) -> tuple[Path, Path]:
        """A server certificate for the DNS names `name` (and `more`) and its key: (certificate, key) files."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in (name, *more)]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        certificate_path = self.directory / f"{name}.crt"
        key_path = self.directory / f"{name}.key"
        certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return certificate_path, key_path

    def server_context(self, name: str, *more: str) -> ssl.SSLContext:
        """A server context presenting a certificate for `name` (and `more`) from this CA."""
        return server_context(*self.issue(name, *more))


class PolicyServer:
    """HTTPS on `host:port` (port: a free one), answering `/.well-known/mta-sts.txt` with
    `policies[<Host without port>]` as text/plain (404 for a host it has none of). `requests`
    lists the hosts asked; each answer waits `delay` seconds (settable at any time)."""

    def __init__(self, context: ssl.SSLContext, policies: dict[str, str], *, host: str = "127.0.0.1") -> None:
        self.policies = policies
        self.requests: list[str] = []
        self.delay = 0.0
        self.host = host
        self.port = free_port()
        self._context = context
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _policy(self, request: web.Request) -> web.Response:
        host = request.host.rsplit(":", 1)[0].lower()
        self.requests.append(host)
        await asyncio.sleep(self.delay)
        text = self.policies.get(host)
        if text is None:
            return web.Response(status=404, text="no policy")
        return web.Response(text=text, content_type="text/plain")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/.well-known/mta-sts.txt", self._policy)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=self._context).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ReportServer:
    """HTTPS on `host:port` (port: a free one), taking TLS reports (RFC 8460 5.4) POSTed to any
    path: `reports` holds each as (path, Content-Type, body as sent); each is answered `status`."""

    def __init__(self, context: ssl.SSLContext, *, host: str = "127.0.0.1") -> None:
        self.reports: list[tuple[str, str, bytes]] = []
        self.status = 201
        self.host = host
        self.port = free_port()
        self._context = context
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _take(self, request: web.Request) -> web.Response:
        self.reports.append((request.path, request.headers.get("Content-Type", ""), await request.read()))
        return web.Response(status=self.status)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._take)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=self._context).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> ReportServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
