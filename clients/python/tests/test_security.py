"""TLS, mTLS and the bearer token, against the real server."""

from __future__ import annotations

import os
import shutil
import subprocess

import grpc
import pytest

from floodgate_client import AsyncClient, Client, ConfigError, Source, Tls
from floodgate_client._proto import floodgate_pb2 as pb
from floodgate_client._proto import floodgate_pb2_grpc as pb_grpc

UP = 5.0  # the first call also makes the TLS handshake


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and localhost, a client
    certificate, and a second CA that signed neither."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: cannot make test certificates")
    d = str(tmp_path_factory.mktemp("certs"))
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca + ".key", "-out", ca + ".pem",
                "-days", "2", "-subj", "/CN=floodgate test " + ca, cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "localhost"), ("client", "python-client")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
                "-subj", "/CN=" + cn, cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext", cwd=d)
    return lambda name: os.path.join(d, name)


def test_tls_with_the_servers_ca(make_server, certs):
    server = make_server(extra=["--tls-cert", certs("server.pem"), "--tls-key", certs("server.key")], scheme="https")
    with open(certs("ca.pem"), "rb") as f:
        ca_bytes = f.read()
    for tls in (Tls(ca=certs("ca.pem")), Tls(ca=ca_bytes)):
        c = Client(server.url, timeout=UP, tls=tls, fail_mode="closed")
        d = c.acquire("t.api", {"tenant": "tls"})
        assert d.source is Source.SERVER and d.allowed
        c.close()
    # A CA that did not sign the server's certificate: no answer, the fail mode decides.
    c = Client(server.url, timeout=1.0, tls=Tls(ca=certs("other-ca.pem")), fail_mode="closed")
    assert c.acquire("t.api", {"tenant": "tls"}).source is Source.FAIL_CLOSED
    c.close()


def test_mtls_needs_the_client_certificate(make_server, certs):
    server = make_server(
        extra=["--tls-cert", certs("server.pem"), "--tls-key", certs("server.key"), "--tls-client-ca", certs("ca.pem")],
        scheme="https",
        client_cert=(certs("client.pem"), certs("client.key")),
    )
    c = Client(server.url, timeout=UP, tls=Tls(ca=certs("ca.pem"), cert=certs("client.pem"), key=certs("client.key")),
               fail_mode="closed")
    assert c.acquire("t.api", {"tenant": "mtls"}).source is Source.SERVER
    c.close()
    anonymous = Client(server.url, timeout=1.0, tls=Tls(ca=certs("ca.pem")), fail_mode="closed")
    assert anonymous.acquire("t.api", {"tenant": "mtls"}).source is Source.FAIL_CLOSED
    anonymous.close()


def test_async_mtls(make_server, certs):
    import asyncio

    server = make_server(
        extra=["--tls-cert", certs("server.pem"), "--tls-key", certs("server.key"), "--tls-client-ca", certs("ca.pem")],
        scheme="https",
        client_cert=(certs("client.pem"), certs("client.key")),
    )

    async def main():
        tls = Tls(ca=certs("ca.pem"), cert=certs("client.pem"), key=certs("client.key"), server_name="localhost")
        async with AsyncClient(server.url, timeout=UP, tls=tls, fail_mode="closed") as c:
            return (await c.acquire("t.api", {"tenant": "amtls"})).source

    assert asyncio.run(main()) is Source.SERVER


def test_bad_tls_settings_are_config_errors(certs):
    with pytest.raises(ConfigError):
        Client("https://127.0.0.1:1", tls=Tls(ca="/nonexistent/ca.pem"))
    with pytest.raises(ConfigError):
        Client("https://127.0.0.1:1", tls=Tls(cert=certs("client.pem")))
    with pytest.raises(ConfigError):
        Client("127.0.0.1:1", token="two\nlines")


def test_the_bearer_token_reaches_the_server(make_server, tmp_path):
    # The data plane takes any caller; Admin checks the token, so it shows
    # that the client's calls carry `authorization: Bearer TOKEN`.
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret-token-for-tests read ops\n")
    server = make_server(extra=["--admin-token-file", str(tokens)])

    def admin_call(token):
        c = Client(server.url, timeout=UP, token=token)
        try:
            assert c.acquire("t.nothing").source is Source.SERVER, "the data plane answers with or without a token"
            ep = c._endpoints[0]
            pb_grpc.AdminStub(ep.channel).GetRules(pb.GetRulesRequest(), timeout=UP, metadata=c._core.metadata)
            return "ok"
        except grpc.RpcError as e:
            return e.code()
        finally:
            c.close()

    assert admin_call("s3cret-token-for-tests") == "ok"
    assert admin_call("wrong") == grpc.StatusCode.UNAUTHENTICATED
    assert admin_call(None) == grpc.StatusCode.UNAUTHENTICATED
