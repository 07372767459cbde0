"""ControllerConfig: defaults, TOML file, env overrides, validation naming the key; TLS served for real."""

from __future__ import annotations

import datetime
import logging
import re
import socket
import ssl
from pathlib import Path

import httpx
import pytest

from agentic_sandbox.controller.app import conformance_member
from agentic_sandbox.controller.config import (
    DEFAULT_V1_SUNSET,
    PROD_HOSTD_SOCKET,
    PROD_STATE_DIR,
    ConfigError,
    ControllerConfig,
    advertised_url,
    load_config,
    parse_imf_fixdate,
)

from .conftest import LiveHostd, controller_env, serve_controller

TOKEN = "t" * 20


def test_dev_defaults_live_under_dot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(env={}, dev=True)
    run = tmp_path / ".run"
    assert config.state_dir == str(run)
    assert config.hostd_socket == str(run / "hostd.sock")
    assert config.admin_token_file == str(run / "admin-token")
    assert config.storage_dir == str(run / "storage")
    assert config.loadouts_dir == str(run / "loadouts")
    assert config.listen == "127.0.0.1:8122"
    assert config.keep_alive_timeout_s == 5.0  # hypercorn's own default
    assert config.v1_sunset == DEFAULT_V1_SUNSET
    assert config.dev


def test_production_defaults() -> None:
    config = load_config(env={"AIWG_ADMIN_TOKEN": TOKEN})
    assert config.state_dir == PROD_STATE_DIR
    assert config.hostd_socket == PROD_HOSTD_SOCKET
    assert not config.dev


def test_file_then_env_override(tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text(
        f'listen = "127.0.0.1:9000"\nstate_dir = "{tmp_path}/s"\nhostd_call_timeout_s = 2.5\nmax_request_bytes = 4096\n'
    )
    config = load_config(path, env={"AIWG_LISTEN": "127.0.0.1:9001"})
    assert config.listen == "127.0.0.1:9001"  # env wins
    assert config.state_dir == f"{tmp_path}/s"
    assert config.hostd_call_timeout_s == 2.5
    assert config.max_request_bytes == 4096
    assert config.storage_dir == f"{tmp_path}/s/storage"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"AIWG_LISTEN": "nonsense"}, "AIWG_LISTEN"),
        ({"AIWG_LISTEN": "127.0.0.1:99999"}, "AIWG_LISTEN"),
        ({"AIWG_HOSTD_CALL_TIMEOUT_S": "soon"}, "AIWG_HOSTD_CALL_TIMEOUT_S"),
        ({"AIWG_HOSTD_CALL_TIMEOUT_S": "-1"}, "AIWG_HOSTD_CALL_TIMEOUT_S"),
        ({"AIWG_MAX_REQUEST_BYTES": "12"}, "AIWG_MAX_REQUEST_BYTES"),
        ({"AIWG_KEEP_ALIVE_TIMEOUT_S": "0"}, "AIWG_KEEP_ALIVE_TIMEOUT_S"),
        ({"AIWG_TLS_CERT": "/nonexistent.pem"}, "AIWG_TLS_KEY"),
        ({"AIWG_TLS_CERT": "/nonexistent.pem", "AIWG_TLS_KEY": "/nonexistent.key"}, "AIWG_TLS_CERT"),
        ({"AIWG_ADMIN_TOKEN": "short"}, "AIWG_ADMIN_TOKEN"),
        ({"AIWG_OPERATOR_TOKEN": TOKEN, "AIWG_ADMIN_TOKEN": TOKEN}, "AIWG_OPERATOR_TOKEN"),
        ({"AIWG_PUBLIC_URL": "ftp://x"}, "AIWG_PUBLIC_URL"),
        ({"AIWG_HOSTD_SOCKET": "/" + "s" * 120}, "AIWG_HOSTD_SOCKET"),
        ({"AIWG_ADVERTISE_URL": "10.0.0.2:8122"}, "AIWG_ADVERTISE_URL"),
        ({"AIWG_HOST_HEARTBEAT_S": "5", "AIWG_HOST_TIMEOUT_S": "5"}, "AIWG_HOST_TIMEOUT_S"),
        ({"AIWG_CARD_URLS": "peer"}, "AIWG_CARD_URLS"),
    ],
)
def test_invalid_settings_name_the_key(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(env=env, dev=True)


def test_unknown_file_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('lisen = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match="lisen"):
        load_config(path, env={})
    path.write_text("listen = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        load_config(tmp_path / "missing.toml", env={})


def test_warm_pools_from_env_and_file(tmp_path: Path) -> None:
    env = {"AIWG_STATE_DIR": str(tmp_path), "AIWG_ADMIN_TOKEN": TOKEN}
    assert load_config(env={**env, "AIWG_WARM_POOLS": " busybox=2, tiny-vm=0 "}).warm_pools == {
        "busybox": 2,
        "tiny-vm": 0,
    }
    assert load_config(env=env).warm_pools == {}
    toml = tmp_path / "c.toml"
    toml.write_text("[warm_pools]\nbusybox = 3\n")
    assert load_config(toml, env=env).warm_pools == {"busybox": 3}
    for bad, why in (
        ("busybox", "not loadout=size"),
        ("busybox=x", "not an integer"),
        ("busybox=65", "between 0 and 64"),
        ("Bad_Name=1", "not a loadout name"),
        ("busybox=1,busybox=2", "named twice"),
    ):
        with pytest.raises(ConfigError, match=f"AIWG_WARM_POOLS.*{why}"):
            load_config(env={**env, "AIWG_WARM_POOLS": bad})


def test_host_labels_from_env_and_file(tmp_path: Path) -> None:
    env = {"AIWG_STATE_DIR": str(tmp_path), "AIWG_ADMIN_TOKEN": TOKEN}
    assert load_config(env={**env, "AIWG_HOST_LABELS": " zone=a, gpu=yes,rack= "}).host_labels == {
        "zone": "a",
        "gpu": "yes",
        "rack": "",
    }
    toml = tmp_path / "c.toml"
    toml.write_text('[host_labels]\n"topology.io/zone" = "eu-1"\n')
    assert load_config(toml, env=env).host_labels == {"topology.io/zone": "eu-1"}
    bad_labels = (("zone", "not key=value"), ("Zone=a", "not a label"), ("zone=a b", "a label"), ("a=1,a=2", "twice"))
    for bad, why in bad_labels:
        with pytest.raises(ConfigError, match=f"AIWG_HOST_LABELS.*{why}"):
            load_config(env={**env, "AIWG_HOST_LABELS": bad})


def test_the_advertised_url() -> None:
    env = {"AIWG_ADMIN_TOKEN": TOKEN}
    config = load_config(env={**env, "AIWG_LISTEN": "127.0.0.1:8122"})
    assert advertised_url(config) == "http://127.0.0.1:8122"
    assert advertised_url(config, "http://127.0.0.1:40123") == "http://127.0.0.1:40123"  # the port bound
    wildcard = load_config(env={**env, "AIWG_LISTEN": "0.0.0.0:8122", "AIWG_ALLOW_PLAINTEXT": "1"})
    assert advertised_url(wildcard) == f"http://{socket.gethostname()}:8122"
    assert advertised_url(load_config(env={**env, "AIWG_LISTEN": "[::1]:9"})) == "http://[::1]:9"
    chosen = load_config(env={**env, "AIWG_ADVERTISE_URL": "https://h1.example:8443/"})
    assert advertised_url(chosen, "http://0.0.0.0:1") == "https://h1.example:8443"


def test_secrets_are_masked_in_repr() -> None:
    config = load_config(env={"AIWG_ADMIN_TOKEN": TOKEN, "AIWG_OPERATOR_TOKEN": "o" * 20}, dev=True)
    assert TOKEN not in repr(config)
    assert "o" * 20 not in repr(config)
    assert "admin_token='***'" in repr(config)


def test_the_struct_forbids_unknown_fields() -> None:
    with pytest.raises(TypeError):
        ControllerConfig(bogus=1)  # type: ignore[call-arg]


def test_sunset_override_and_invalid_fallback(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(env={"AIWG_V1_SUNSET_DATE": "Mon, 01 Nov 2027 00:00:00 GMT"}, dev=True)
    assert config.v1_sunset == "Mon, 01 Nov 2027 00:00:00 GMT"
    assert config.v1_sunset_datetime == datetime.datetime(2027, 11, 1, tzinfo=datetime.UTC)
    for bad in ("2027-05-09", "Sat, 09 May 2027 00:00:00 GMT", "Sun, 09 May 2027 00:00:00 UTC", "tomorrow"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentic_sandbox.controller.config"):
            config = load_config(env={"AIWG_V1_SUNSET_DATE": bad}, dev=True)
        assert config.v1_sunset == DEFAULT_V1_SUNSET
        assert "AIWG_V1_SUNSET_DATE" in caplog.text


def test_imf_fixdate_parser() -> None:
    assert parse_imf_fixdate(DEFAULT_V1_SUNSET) == datetime.datetime(2027, 5, 9, tzinfo=datetime.UTC)
    with pytest.raises(ValueError, match="not a Mon"):
        parse_imf_fixdate("Mon, 09 May 2027 00:00:00 GMT")


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def test_tls_is_served_with_the_configured_pair(hostd: LiveHostd, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    env = controller_env(tmp_path / "c", hostd.socket_path, AIWG_TLS_CERT=str(cert), AIWG_TLS_KEY=str(key))
    config = load_config(env=env)
    assert config.scheme == "https"
    async with serve_controller(config) as live:
        assert live.url.startswith("https://")
        port = live.url.rsplit(":", 1)[1]
        context = ssl.create_default_context(cafile=str(cert))
        async with httpx.AsyncClient(verify=context) as client:
            response = await client.get(f"https://localhost:{port}/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "alive"}


def test_upstreams_listen_addr_and_secrets_dir(tmp_path: Path) -> None:
    base = {"AIWG_STATE_DIR": str(tmp_path / "state")}
    config = load_config(env={**base, "LISTEN_ADDR": "127.0.0.1:8120", "SECRETS_DIR": str(tmp_path / "secrets")})
    # Upstream's layout: gRPC on P, its WebSocket port P+1, HTTP on P+2.
    assert (config.grpc_listen, config.legacy_pty_listen, config.listen) == (
        "127.0.0.1:8120",
        "127.0.0.1:8121",
        "127.0.0.1:8122",
    )
    assert config.admin_token_file == str(tmp_path / "secrets" / "admin.token")
    assert config.operator_tokens_file == str(tmp_path / "secrets" / "operator-tokens.toml")
    # Ours win where both are set.
    ours = load_config(env={**base, "LISTEN_ADDR": "127.0.0.1:8120", "AIWG_LISTEN": "127.0.0.1:9000"})
    assert (ours.listen, ours.grpc_listen) == ("127.0.0.1:9000", "127.0.0.1:8120")
    assert load_config(env=base).operator_tokens_file is None  # no secrets dir: no file
    with pytest.raises(ConfigError, match=re.escape("LISTEN_ADDR='127.0.0.1:65534': its port P must be 1-65533")):
        load_config(env={**base, "LISTEN_ADDR": "127.0.0.1:65534"})


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"AIWG_LISTEN": "0.0.0.0:8122"}, "AIWG_LISTEN='0.0.0.0:8122' would serve without TLS"),
        ({"AIWG_LISTEN": "10.1.2.3:8122"}, "non-loopback"),
        ({"AIWG_GRPC_LISTEN": "[::]:50051"}, "AIWG_GRPC_LISTEN"),
        ({"AIWG_LEGACY_PTY_LISTEN": "0.0.0.0:8121"}, "plain ws://"),
        ({"LISTEN_ADDR": "0.0.0.0:8120"}, "AIWG_LISTEN='0.0.0.0:8122'"),
    ],
)
def test_plaintext_on_a_non_loopback_address_is_refused_unless_allowed(
    tmp_path: Path, extra: dict[str, str], says: str
) -> None:
    env = {"AIWG_STATE_DIR": str(tmp_path), **extra}
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(env=env)
    assert load_config(env={**env, "AIWG_ALLOW_PLAINTEXT": "1"}).allow_plaintext
    for loopback in ("127.0.0.1:1", "localhost:1", "[::1]:1", "127.9.9.9:1"):
        assert load_config(env={"AIWG_STATE_DIR": str(tmp_path), "AIWG_LISTEN": loopback}).listen == loopback


def test_client_certificates_need_https_a_ca_and_a_mode(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    tls = {"AIWG_STATE_DIR": str(tmp_path), "AIWG_TLS_CERT": str(cert), "AIWG_TLS_KEY": str(key)}
    with pytest.raises(ConfigError, match="needs HTTPS"):
        load_config(env={"AIWG_STATE_DIR": str(tmp_path), "AIWG_TLS_CLIENT_AUTH": "required"})
    with pytest.raises(ConfigError, match="needs AIWG_TLS_CLIENT_CA"):
        load_config(env={**tls, "AIWG_TLS_CLIENT_AUTH": "optional"})
    with pytest.raises(ConfigError, match="is not a readable file"):
        load_config(env={**tls, "AIWG_TLS_CLIENT_AUTH": "optional", "AIWG_TLS_CLIENT_CA": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="need AIWG_TLS_CLIENT_AUTH"):
        load_config(env={**tls, "AIWG_MTLS_ADMIN_ALLOWLIST": "ops"})
    with pytest.raises(ConfigError, match="is named twice"):
        load_config(env={**tls, "AIWG_MTLS_ADMIN_ALLOWLIST": "ops,ops"})
    config = load_config(
        env={
            **tls,
            "AIWG_TLS_CLIENT_AUTH": "required",
            "AIWG_TLS_CLIENT_CA": str(cert),
            "AIWG_MTLS_ADMIN_ALLOWLIST": " ops.example , spiffe://x/y ",
        }
    )
    assert (config.tls_client_auth, config.mtls_admin_allowlist) == ("required", ("ops.example", "spiffe://x/y"))


def test_the_conformance_fleet_cycles_the_three_runtimes() -> None:
    members = [conformance_member(i) for i in range(4)]
    assert members == [
        ("00000000-0000-7000-8000-000000000001", "conformance", "host", "echo"),
        ("00000000-0000-7000-8000-000000000002", "conformance-2", "docker", "busybox"),
        ("00000000-0000-7000-8000-000000000003", "conformance-3", "qemu", "tiny-vm"),
        ("00000000-0000-7000-8000-000000000004", "conformance-4", "host", "echo"),
    ]
    for bad in ("0", "17"):
        with pytest.raises(ConfigError, match="AIWG_CONFORMANCE_FLEET_SIZE"):
            load_config(env={"AIWG_CONFORMANCE_FLEET_SIZE": bad})
