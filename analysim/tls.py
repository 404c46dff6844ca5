"""TLS material for the gRPC and HTTP servers and their clients, read from PEM files.

Servers: ``--tls-cert``/``--tls-key`` (and ``--tls-ca`` to require client certificates signed
by that CA: mutual TLS). Clients: ``--tls-ca`` to verify the server (and ``--tls-cert``/
``--tls-key`` to present a certificate to a server that asks). Without them, plaintext."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from analysim.errors import UserError


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"{what} {path}: cannot read ({e.strerror})") from None


# What each side of a TLS connection must be allowed to do by its certificate's extended key
# usage (RFC 5280 4.2.1.12): a certificate that lists purposes, without this one, is refused by
# the peer's handshake ("unsupported certificate purpose"), which a waiting client only sees as
# a closed connection.
_PURPOSE = {"server": ("serverAuth", "1.3.6.1.5.5.7.3.1"), "client": ("clientAuth", "1.3.6.1.5.5.7.3.2")}


def check_purpose(cert_pem: bytes, path: str, flag: str, role: str) -> None:
    """A one-line error when the certificate's extended key usage leaves out ``role`` ("server"
    or "client"), saying what to add; one without the extension may do both."""
    from cryptography import x509

    name, oid = _PURPOSE[role]
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    except ValueError as e:
        raise UserError(f"{flag} {path}: not a PEM certificate ({e})") from None
    has = [u.dotted_string for u in eku]
    if oid in has:
        return
    names = {v[1]: v[0] for v in _PURPOSE.values()}
    listed = ", ".join(names.get(u, u) for u in has) or "none"
    use = "serve TLS" if role == "server" else "authenticate as a TLS client (mutual TLS)"
    raise UserError(f"{flag} {path}: its extended key usage ({listed}) does not allow it to {use}: issue it with "
                    f"extendedKeyUsage = {', '.join(dict.fromkeys([*(names.get(u, u) for u in has), name]))} "
                    "(docs/live.md, TLS)")


@dataclass(frozen=True)
class TlsFiles:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.ca)

    def _pair(self) -> tuple[bytes, bytes] | None:
        """(private key, certificate chain), checked to be a matching PEM pair."""
        if bool(self.cert) != bool(self.key):
            raise UserError("--tls-cert and --tls-key go together")
        if not self.cert:
            return None
        cert, key = _read(self.cert, "--tls-cert"), _read(self.key, "--tls-key")
        try:
            ssl.create_default_context().load_cert_chain(self.cert, self.key)
        except ssl.SSLError as e:
            raise UserError(f"--tls-cert {self.cert} / --tls-key {self.key}: not a matching PEM certificate "
                            f"and key ({e.reason or e})") from None
        if self.ca:
            try:
                ssl.create_default_context().load_verify_locations(self.ca)
            except (ssl.SSLError, OSError) as e:
                raise UserError(f"--tls-ca {self.ca}: not a PEM certificate ({e})") from None
        return key, cert

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """None: plaintext. With a CA: clients must present a certificate it signed."""
        pair = self._pair()
        if pair is None:
            if self.ca:
                raise UserError("--tls-ca on a server needs --tls-cert and --tls-key")
            return None
        check_purpose(pair[1], str(self.cert), "--tls-cert", "server")
        ca = _read(self.ca, "--tls-ca")
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """None: plaintext. The CA verifies the server; a cert/key pair is presented if given."""
        if not self.enabled:
            return None
        pair = self._pair()
        if pair is not None:
            check_purpose(pair[1], str(self.cert), "--tls-cert", "client")
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca, "--tls-ca"),
                                            private_key=pair[0] if pair else None,
                                            certificate_chain=pair[1] if pair else None)

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """For an HTTP server (aiohttp): None for plaintext."""
        pair = self._pair()
        if pair is None:
            return None
        check_purpose(pair[1], str(self.cert), "--tls-cert", "server")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.ca:
                ctx.load_verify_locations(self.ca)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as e:
            raise UserError(f"--tls-cert {self.cert} / --tls-key {self.key}: {e}") from None
        return ctx


def add_tls_arguments(p, server: bool, mutual: bool = True) -> None:  # noqa: ANN001 — an argparse parser
    """``--tls-cert``, ``--tls-key`` and (unless ``mutual`` is False on a server) ``--tls-ca``,
    with help for a server or a client."""
    if server:
        p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (chain)")
        p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
        if mutual:
            p.add_argument("--tls-ca", metavar="PEM", help="mutual TLS: require client certificates signed by this CA")
    else:
        p.add_argument("--tls-ca", metavar="PEM", help="connect with TLS, verifying the server against this CA")
        p.add_argument("--tls-cert", metavar="PEM", help="mutual TLS: present this client certificate")
        p.add_argument("--tls-key", metavar="PEM", help="the client certificate's private key")


def tls_from_args(args) -> TlsFiles:  # noqa: ANN001 — an argparse Namespace
    return TlsFiles(getattr(args, "tls_cert", None), getattr(args, "tls_key", None), getattr(args, "tls_ca", None))


def secure_channel(target: str, tls: TlsFiles, options: list | None = None, aio: bool = False):  # noqa: ANN201
    """A gRPC channel, TLS when ``tls`` says so (sync or grpc.aio)."""
    creds = tls.channel_credentials()
    mod = grpc.aio if aio else grpc
    if creds is None:
        return mod.insecure_channel(target, options=options)
    return mod.secure_channel(target, creds, options=options)
