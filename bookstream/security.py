"""TLS and etcd credentials as command-line options, the same for every command.

    bookstream bookie ... --tls-cert bookie.pem --tls-key bookie.key [--tls-ca ca.pem]   (ca: mutual TLS)
    bookstream --tls-ca ca.pem --etcd-ca ca.pem --etcd-user root streams list
    bookstream standalone --tls ...                                (makes its own CA: bookstream/standalone.py)

Every option has an environment variable (``BOOKSTREAM_TLS_CA`` ...), which
child processes inherit; the etcd password is best given as
``BOOKSTREAM_ETCD_PASSWORD`` (not on a command line). For a bookie, ``--tls-*``
is the server's certificate and key, and ``--tls-ca`` the authority client
certificates must be signed by (mutual TLS); for a client (the admin CLI,
autorecovery) ``--tls-ca`` verifies the bookies and ``--tls-cert``/``--tls-key``
is the client's certificate where bookies ask for one. ``--etcd-*`` are the
same for the connection to etcd. ``--tls-server-name`` (clients) is the name
bookies' certificates are checked against when it is not the host of their
registered address. A bookie takes rotated certificate files up without a
restart (``metadata/tls.py``).
"""
from __future__ import annotations

import dataclasses

from metadata.tls import CLIENT_SETTINGS, EtcdAuth, TlsFiles, client_security

# option name -> environment variable
OPTIONS = CLIENT_SETTINGS
HELP = {
    "tls_ca": "PEM authority: a client verifies bookies with it; a bookie requires client certificates signed by it",
    "tls_cert": "PEM certificate: a bookie's server certificate, or a client's for mutual TLS",
    "tls_key": "PEM private key of --tls-cert",
    "tls_server_name": "a client's: the name bookies' certificates carry, when not the host they register",
    "etcd_ca": "PEM authority that signed etcd's certificate (turns TLS to etcd on)",
    "etcd_cert": "client certificate for etcd (when etcd requires one)",
    "etcd_key": "private key of --etcd-cert",
    "etcd_user": "etcd user (auth on); the password from --etcd-password or $BOOKSTREAM_ETCD_PASSWORD",
    "etcd_password": "etcd password (prefer $BOOKSTREAM_ETCD_PASSWORD)",
}


@dataclasses.dataclass(frozen=True)
class Security:
    tls: TlsFiles | None = None        # gRPC to bookies
    etcd_tls: TlsFiles | None = None
    etcd_auth: EtcdAuth | None = None

    @staticmethod
    def of(values: dict) -> "Security":
        return Security(**client_security(values))

    @staticmethod
    def from_env() -> "Security":
        """From the BOOKSTREAM_* variables (what `bookstream standalone --tls` prints)."""
        import os

        return Security.of({k: os.environ.get(env) for k, env in OPTIONS.items()})

    def client_config(self) -> dict:
        """Keyword overrides of ``stream.client.ClientConfig``."""
        return {"tls": self.tls, "etcd_tls": self.etcd_tls, "etcd_auth": self.etcd_auth}

    def store_options(self) -> dict:
        """Keyword arguments of ``metadata.store.MetadataStore``."""
        return {"tls": self.etcd_tls, "auth": self.etcd_auth}


def add_arguments(p) -> None:
    """The options on an argparse parser (defaults from the environment)."""
    import os

    for name, env in OPTIONS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=os.environ.get(env),
                       help=f"{HELP[name]} (env {env})")


def click_options(f):
    """The options on a click command or group."""
    import click

    for name, env in reversed(OPTIONS.items()):  # the last applied is listed first
        f = click.option("--" + name.replace("_", "-"), name, envvar=env, default=None, show_envvar=True,
                         help=HELP[name])(f)
    return f


# the root command's choice (bookstream/admin.py), read by the admin and autorecovery commands
CURRENT = {"security": Security()}


def current() -> Security:
    return CURRENT["security"]
