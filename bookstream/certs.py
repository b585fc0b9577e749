"""Test and demo certificates: a throw-away CA and certificates it signs
(``cryptography``), for `bookstream standalone --tls` and the TLS tests.
Never for production: the keys are written unencrypted next to the certs."""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from metadata.tls import TlsFiles


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key, cert) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization

    path.parent.mkdir(parents=True, exist_ok=True)
    kp, cp = path.with_suffix(".key"), path.with_suffix(".pem")
    kp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    kp.chmod(0o600)
    cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(cp), str(kp)


class DemoCa:
    """A CA in ``directory`` (``ca.pem``) that issues server and client certificates."""

    def __init__(self, directory, name: str = "bookstream test CA"):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        self.dir = Path(directory)
        self.key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=365))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.ca, _ = _write(self.dir / "ca", self.key, self.cert)

    def issue(self, name: str, hosts=("127.0.0.1", "localhost"), client: bool = False) -> TlsFiles:
        """A certificate for ``hosts`` (IP addresses or DNS names), usable as
        a server's and, with ``client``, as a client's; TlsFiles with this CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = _key()
        sans = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
             .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert, keyf = _write(self.dir / name, key, b.sign(self.key, hashes.SHA256()))
        return TlsFiles(self.ca, cert, keyf)
