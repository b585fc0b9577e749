"""TLS material of the gRPC channels (to etcd and to bookies) and etcd credentials.

``TlsFiles`` names PEM files: ``ca`` (the authority a client verifies the
server with, or a server verifies client certificates with), ``cert`` and
``key`` (this side's own certificate: a server's, or a client's for mutual
TLS). ``EtcdAuth`` is an etcd user and password. Both are plain values; the
gRPC credentials are built from them where a channel or a server is made
(``metadata/store.py``, ``stream/bookie_client.py``, ``bookie/server.py``).

Files are read when credentials are built, so a bad path is one clear
``TlsConfigError`` at start-up, not a failed handshake later.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path


class TlsConfigError(ValueError):
    """A TLS file is missing or unreadable, or a cert comes without its key."""

    retriable = False


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise TlsConfigError("a TLS certificate needs its key (and a key its certificate)")

    @staticmethod
    def of(ca=None, cert=None, key=None) -> "TlsFiles | None":
        """TlsFiles, or None when no file is given (plain text)."""
        return TlsFiles(_s(ca), _s(cert), _s(key)) if (ca or cert or key) else None

    def _read(self, which: str) -> bytes | None:
        path = getattr(self, which)
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise TlsConfigError(f"TLS {which} file {path!r}: {e.strerror or e}") from None

    def channel_credentials(self):
        """A client's: verify the server against ``ca`` (the system roots
        without it); present ``cert``/``key`` when given (mutual TLS).
        Built once per TlsFiles (every bookie channel shares them)."""
        return _channel_credentials(self)

    def server_credentials(self):
        """A server's: ``cert``/``key``; with ``ca``, clients must present a
        certificate signed by it (mutual TLS)."""
        import grpc

        if not self.cert:
            raise TlsConfigError("a TLS server needs a certificate and its key")
        ca = self._read("ca")
        return grpc.ssl_server_credentials([(self._read("key"), self._read("cert"))], root_certificates=ca,
                                           require_client_auth=ca is not None)


@dataclasses.dataclass(frozen=True)
class EtcdAuth:
    user: str
    password: str = dataclasses.field(repr=False)

    @staticmethod
    def of(user=None, password=None) -> "EtcdAuth | None":
        """EtcdAuth, or None without a user; the password defaults to
        ``$BOOKSTREAM_ETCD_PASSWORD`` (kept off command lines)."""
        if not user:
            return None
        password = password if password is not None else os.environ.get("BOOKSTREAM_ETCD_PASSWORD")
        if password is None:
            raise TlsConfigError(f"etcd user {user!r} needs a password (--etcd-password or "
                                 "$BOOKSTREAM_ETCD_PASSWORD)")
        return EtcdAuth(user, password)


@functools.lru_cache(maxsize=16)
def _channel_credentials(tls: TlsFiles):
    import grpc

    return grpc.ssl_channel_credentials(tls._read("ca"), tls._read("key"), tls._read("cert"))


def _s(p) -> str | None:
    return os.fspath(p) if p else None
