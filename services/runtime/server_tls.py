"""TLS for the mesh's servers: the gRPC ports and the HTTP ports, reloaded on change.

gRPC: :func:`grpc_server_credentials` hands gRPC a certificate fetcher, which gRPC calls
for every new TLS handshake; it answers "unchanged" until the certificate, key or CA file
changes, then the new configuration, so a renewed certificate is served from the next
connection on without a restart. With ``client_auth: require`` a client must present a
certificate signed by the CA (mTLS); gRPC's Python API offers no "verify if presented", so
mTLS is all or nothing per server.

HTTP: :class:`HttpTls` builds an :class:`ssl.SSLContext` and builds it again when a file
changed; the HTTP endpoint wraps each accepted connection with the current one. There a
client certificate is asked for and verified when presented (``CERT_OPTIONAL``), so a
browser with a token reaches ``/ui`` and Prometheus scrapes ``/metrics`` with or without
one; with ``client_auth: require`` it must present one.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable

import grpc

from dsclient.connection.tls import TlsConfig
from dsclient.watched_file import WatchedFile


def _files(tls: TlsConfig) -> list[WatchedFile[bytes]]:
    paths = [tls.cert_file, tls.key_file, tls.ca_file]
    return [WatchedFile(p, bytes, min_interval=0.0) for p in paths if p is not None]


class _GrpcCertificates:
    """gRPC's certificate fetcher over the watched files."""

    def __init__(self, tls: TlsConfig) -> None:
        self._tls = tls
        self._files = _files(tls)
        self._lock = threading.Lock()
        self.reloads = 0

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        contents = [f.get() for f in self._files]
        cert, key = contents[0], contents[1]
        ca = contents[2] if len(contents) > 2 else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            if not any(f.changed() for f in self._files):
                return None
            try:
                configuration = self.configuration()
            except Exception:
                return None  # half-written: keep serving the old one, try at the next handshake
            self.reloads += 1
            return configuration


def grpc_server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    """The gRPC server's credentials; None: plaintext (no certificate configured)."""
    if not tls.server_enabled:
        return None
    certificates = _GrpcCertificates(tls)
    return grpc.dynamic_ssl_server_credentials(
        certificates.configuration(),
        certificates,  # type: ignore[arg-type]  # grpc-stubs: None (unchanged) is allowed
        require_client_authentication=tls.client_auth == "require",
    )


class HttpTls:
    """The HTTP server's SSL context, built again when a file changed (checked at most
    once a second, on the next connection)."""

    def __init__(self, tls: TlsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        if not tls.server_enabled:
            raise ValueError("HTTP TLS needs cert_file and key_file")
        self._tls = tls
        self._clock = clock
        self._files = _files(tls)
        self._lock = threading.Lock()
        self._current = self._build()
        self._checked = clock()
        self.reloads = 0

    def _build(self) -> ssl.SSLContext:
        for watched in self._files:
            watched.get()  # remember what is being loaded
        tls = self._tls
        assert tls.cert_file is not None and tls.key_file is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.ca_file is not None:
            context.load_verify_locations(cafile=str(tls.ca_file))
            context.verify_mode = (
                ssl.CERT_REQUIRED if tls.client_auth == "require" else ssl.CERT_OPTIONAL
            )
        return context

    def context(self) -> ssl.SSLContext:
        """The current context: a new one once the certificate, key or CA file changed."""
        with self._lock:
            now = self._clock()
            if now - self._checked >= 1.0:
                self._checked = now
                if any(f.changed() for f in self._files):
                    try:
                        self._current = self._build()
                        self.reloads += 1
                    except (OSError, ssl.SSLError):
                        pass  # half-written: keep the old context, try again later
            return self._current
