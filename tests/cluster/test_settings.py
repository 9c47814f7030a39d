"""The cluster flags: what they become, and a coded refusal for each mistake."""

from __future__ import annotations

import pytest

from signaling.__main__ import build_parser
from signaling.cluster.settings import ClusterFlagError, settings_from_args

GOOD = ["--cluster", "redis://127.0.0.1:6379/0", "--node-address", "http://10.0.0.5:8080"]
SECRET = "s" * 32


def parse(argv: list[str]):  # type: ignore[no-untyped-def]
    return settings_from_args(build_parser().parse_args(argv))


def test_without_cluster_nothing_is_set() -> None:
    assert parse([]) is None
    # --max-calls-per-key then counts this server's calls (signaling/call_limit.py)
    assert parse(["--max-calls-per-key", "3"]) is None


def test_the_secret_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_CLUSTER_SECRET", SECRET)
    settings = parse([*GOOD, "--max-calls-per-key", "5"])
    assert settings is not None
    assert (settings.redis_url, settings.node_address, settings.secret,
            settings.max_calls_per_key) == ("redis://127.0.0.1:6379/0", "http://10.0.0.5:8080",
                                            SECRET.encode(), 5)
    assert SECRET not in repr(settings)


@pytest.mark.parametrize(("argv", "code"), [
    (["--max-calls-per-key", "-1"], "max_calls_per_key_invalid"),
    (["--cluster", "http://x:1/0", "--node-address", "http://a:1"], "cluster_url_invalid"),
    (["--cluster", "redis://x:1/0"], "node_address_missing"),
    (["--cluster", "redis://x:1/0", "--node-address", "10.0.0.5:8080"], "node_address_invalid"),
    ([*GOOD, "--cluster-secret", "short"], "cluster_secret_missing"),
    ([*GOOD, "--cluster-secret", SECRET, "--max-calls-per-key", "-1"],
     "max_calls_per_key_invalid"),
])
def test_mistakes_are_refused_with_a_code(argv: list[str], code: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_CLUSTER_SECRET", raising=False)
    with pytest.raises(ClusterFlagError) as refused:
        parse(argv)
    assert refused.value.code == code
