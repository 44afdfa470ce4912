"""Certificates for the TLS tests, made with the openssl CLI."""

import os
import ssl
import subprocess

__all__ = ["make_pki", "client_context"]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def issue(directory, name, subject, ca, extensions):
    """A key and a certificate for `subject`, signed by `ca` (a name in directory)."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", subject, cwd=directory)
    with open(os.path.join(directory, f"{name}.ext"), "w") as handle:
        # and of a certificate it issued: its issuer's key named
        handle.write(extensions + "\nauthorityKeyIdentifier=keyid,issuer\n"
                     "subjectKeyIdentifier=hash\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=directory)


def make_pki(directory):
    """In `directory`: a CA (ca.pem, ca.key), server certificates for
    localhost and 127.0.0.1 (server.pem/.key, CN first; server2.pem/.key, CN
    second, for a reload), a client certificate from the CA (client) and one
    from another CA (stranger). Returns `directory`."""
    for ca in ("ca", "other-ca"):
        # the extensions a strict verifier wants of a CA (Python 3.13+ sets
        # VERIFY_X509_STRICT in its default contexts)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN={ca}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                "-addext", "subjectKeyIdentifier=hash", cwd=directory)
    server = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth"
    issue(directory, "server", "/CN=first", "ca", server)
    issue(directory, "server2", "/CN=second", "ca", server)
    issue(directory, "client", "/CN=client", "ca", "extendedKeyUsage=clientAuth")
    issue(directory, "stranger", "/CN=stranger", "other-ca", "extendedKeyUsage=clientAuth")
    return directory


def client_context(pki, cert=None):
    """A client's context that trusts the pki's CA, with a client certificate if named."""
    context = ssl.create_default_context(cafile=os.path.join(pki, "ca.pem"))
    if cert:
        context.load_cert_chain(os.path.join(pki, f"{cert}.pem"), os.path.join(pki, f"{cert}.key"))
    return context
