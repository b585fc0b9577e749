"""TLS material of the gRPC channels (to etcd and to bookies) and etcd credentials.

``TlsFiles`` names PEM files: ``ca`` (the authority a client verifies the
server with, or a server verifies client certificates with), ``cert`` and
``key`` (this side's own certificate: a server's, or a client's for mutual
TLS). ``EtcdAuth`` is an etcd user and password. Both are plain values; the
gRPC credentials are built from them where a channel or a server is made
(``metadata/store.py``, ``stream/bookie_client.py``, ``bookie/server.py``).

Files are read when credentials are built, so a bad path is one clear
``TlsConfigError`` at start-up, not a failed handshake later.

Certificates rotate without a restart. A server (a bookie) looks at its
files again before each new connection's handshake (gRPC's dynamic server
credentials; a ``stat`` of each file, read only when one changed) and uses
the new pair from then on; connections already open keep theirs. A rotation
caught half done (a certificate whose key is not written yet, an unreadable
file) keeps the old pair and is logged, and is taken up at the next
handshake once complete. A client builds credentials per channel from the
files as they are then, so a new channel (a restarted bookie's, a new
client's) uses a rotated CA or client certificate.

``server_name`` (clients only): the name a bookie's certificate must carry,
when it is not the host of the registered address (a certificate issued for
``bookie-3.internal`` while bookies register IP addresses).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class TlsConfigError(ValueError):
    """A TLS file is missing or unreadable, or a cert comes without its key."""

    retriable = False


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None   # a client's: the name the server's certificate must carry

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise TlsConfigError("a TLS certificate needs its key (and a key its certificate)")

    @staticmethod
    def of(ca=None, cert=None, key=None, server_name=None) -> "TlsFiles | None":
        """TlsFiles, or None when no file is given (plain text)."""
        if server_name and not (ca or cert or key):
            raise TlsConfigError("a TLS server name needs TLS (--tls-ca)")
        return TlsFiles(_s(ca), _s(cert), _s(key), server_name or None) if (ca or cert or key) else None

    def stamp(self) -> tuple:
        """What changes when a file is rewritten or replaced (inode, size,
        modification time of each); None for a file that cannot be stat'ed."""
        out = []
        for which in ("ca", "cert", "key"):
            path = getattr(self, which)
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append(None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def channel_options(self) -> list[tuple[str, str]]:
        """gRPC channel options of a client (the server name override)."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

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
        Built once per version of the files (channels share them)."""
        return _channel_credentials(self, self.stamp())

    def server_credentials(self):
        """A server's: ``cert``/``key``; with ``ca``, clients must present a
        certificate signed by it (mutual TLS). Reloaded when the files
        change (see the module's docstring)."""
        import grpc

        if not self.cert:
            raise TlsConfigError("a TLS server needs a certificate and its key")
        ca = self._read("ca")
        first = self._server_config()
        seen = {"stamp": self.stamp()}

        def fetch():
            # called by gRPC before each new connection's handshake: None keeps the current pair
            stamp = self.stamp()
            if stamp == seen["stamp"]:
                return None
            seen["stamp"] = stamp
            try:
                config = self._server_config()
            except TlsConfigError as e:
                log.warning("TLS files changed but cannot be used yet (%s): keeping the previous ones", e)
                return None
            log.info("TLS: new certificate files loaded (%s)", self.cert)
            return config

        return grpc.dynamic_ssl_server_credentials(first, fetch, require_client_authentication=ca is not None)

    def _server_config(self):
        """The files as they are now, checked as a pair (raises TlsConfigError)."""
        import grpc

        cert, key, ca = self._read("cert"), self._read("key"), self._read("ca")
        _check_pair(cert, key)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


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


# A client's TLS and etcd credentials: setting -> the environment variable
# each defaults to (the command line's options, bookstream/security.py, and
# the Spark options, stream/spark/access.py, are named after these).
CLIENT_SETTINGS = {
    "tls_ca": "BOOKSTREAM_TLS_CA", "tls_cert": "BOOKSTREAM_TLS_CERT", "tls_key": "BOOKSTREAM_TLS_KEY",
    "tls_server_name": "BOOKSTREAM_TLS_SERVER_NAME",
    "etcd_ca": "BOOKSTREAM_ETCD_CA", "etcd_cert": "BOOKSTREAM_ETCD_CERT", "etcd_key": "BOOKSTREAM_ETCD_KEY",
    "etcd_user": "BOOKSTREAM_ETCD_USER", "etcd_password": "BOOKSTREAM_ETCD_PASSWORD",
}


def client_security(values: dict) -> dict:
    """``stream.client.ClientConfig``'s ``tls``, ``etcd_tls`` and ``etcd_auth``
    from ``CLIENT_SETTINGS``' values (missing ones: none).  Raises
    TlsConfigError for a combination that cannot work."""
    v = {k: values.get(k) for k in CLIENT_SETTINGS}
    return {"tls": TlsFiles.of(v["tls_ca"], v["tls_cert"], v["tls_key"], v["tls_server_name"]),
            "etcd_tls": TlsFiles.of(v["etcd_ca"], v["etcd_cert"], v["etcd_key"]),
            "etcd_auth": EtcdAuth.of(v["etcd_user"], v["etcd_password"])}


def _check_pair(cert: bytes, key: bytes) -> None:
    """The certificate (the first of its chain) is of this private key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        public = x509.load_pem_x509_certificate(cert).public_key()
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as e:
        raise TlsConfigError(f"TLS certificate or key not readable as PEM: {e}") from None
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if public.public_bytes(*fmt) != private.public_key().public_bytes(*fmt):
        raise TlsConfigError("TLS certificate and key do not match")


@functools.lru_cache(maxsize=16)
def _channel_credentials(tls: TlsFiles, stamp: tuple):
    import grpc

    return grpc.ssl_channel_credentials(tls._read("ca"), tls._read("key"), tls._read("cert"))


def _s(p) -> str | None:
    return os.fspath(p) if p else None
