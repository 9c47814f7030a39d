"""`--cluster-ca`: the CA bundle https node addresses are checked against; refused with a
code without `--cluster` or when the file holds no certificate."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from signaling.__main__ import build_parser
from signaling.cluster.settings import ClusterFlagError, settings_from_args
from tests.support.tls import ca_signed

GOOD = ["--cluster", "redis://127.0.0.1:6379/0", "--node-address", "https://10.0.0.5:8443",
        "--cluster-secret", "s" * 32]


def parse(argv: list[str]):  # type: ignore[no-untyped-def]
    return settings_from_args(build_parser().parse_args(argv))


def test_the_cluster_ca_alone_is_trusted(tmp_path: Path) -> None:
    ca, _, _ = ca_signed(tmp_path, "10.0.0.5")
    settings = parse([*GOOD, "--cluster-ca", str(ca)])
    assert settings is not None and settings.cluster_ca == str(ca)
    context = settings.node_tls()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [cert["subject"] for cert in context.get_ca_certs()] == [
        ((("commonName", "duplex-agent test CA"),),)]


@pytest.mark.parametrize(("argv", "code"), [
    (["--cluster-ca", "ca.pem"], "cluster_flag_without_cluster"),
    ([*GOOD, "--cluster-ca", "missing.pem"], "cluster_ca_invalid"),
    ([*GOOD, "--cluster-ca", "empty.pem"], "cluster_ca_invalid"),
])
def test_mistakes_are_refused_with_a_code(argv: list[str], code: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty.pem").write_text("no certificate here\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClusterFlagError) as refused:
        parse(argv)
    assert refused.value.code == code
