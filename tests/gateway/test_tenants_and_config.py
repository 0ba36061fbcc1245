"""Tenants (keys, pools, limits), per-tenant policy, config validation and reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import yaml

from gpufleet.errors import UserError
from gpufleet.gateway.config import load_config, validate_config
from gpufleet.gateway.server import Gateway, build_fleet
from gpufleet.routing.types import ReplicaState

from .conftest import GatewayFactory, wait_until
from .stub_backend import StubBackend

MSG = [{"role": "user", "content": "hi"}]


def _tenants() -> list[dict]:
    return [
        {"name": "gold", "api_keys": ["sk-gold"], "pool": "gold"},
        {"name": "free", "api_keys": ["sk-free"], "requests_per_s": 0.01, "burst": 2},
        {"name": "one", "api_keys": ["sk-one"], "max_concurrency": 1},
    ]


@pytest.mark.process
async def test_keys_pools_and_limits(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway(
        [],
        wait_ready=False,
        tenants=_tenants(),
        replicas=[{"url": stubs[0].url, "pool": "gold"}, {"url": stubs[1].url}],
    )
    await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
    url = gw.url + "/v1/chat/completions"
    body = {"model": "stub-model", "messages": MSG}
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-gold"}):
            async with s.post(url, json=body, headers=headers) as resp:
                assert resp.status == 401
                err = (await resp.json())["error"]
                assert err["code"] == 401 and "invalid_api_key" in err["message"]
        for _ in range(3):
            async with s.post(url, json=body, headers={"Authorization": "Bearer sk-gold"}) as r:
                assert r.status == 200
        assert len(stubs[0].received) == 3 and stubs[1].received == []
        # The gateway's key is not passed on to the replica.
        assert "Authorization" not in stubs[0].received_headers[0]
        statuses = []
        for _ in range(3):
            async with s.post(url, json=body, headers={"Authorization": "Bearer sk-free"}) as r:
                statuses.append(r.status)
                if r.status == 429:
                    assert int(r.headers["Retry-After"]) >= 1
                    assert (await r.json())["error"]["type"] == "RateLimitError"
        assert statuses == [200, 200, 429]
        assert len(stubs[1].received) == 2  # the unpinned tenant uses the shared replicas
        stubs[1].hold = asyncio.Event()
        held = asyncio.create_task(
            s.post(url, json=body, headers={"Authorization": "Bearer sk-one"})
        )
        await wait_until(lambda: gw.tenants.tenants["one"].in_flight == 1)
        async with s.post(url, json=body, headers={"Authorization": "Bearer sk-one"}) as r:
            assert r.status == 429
        stubs[1].hold.set()
        resp = await held
        assert resp.status == 200
        resp.release()


@pytest.mark.process
async def test_per_tenant_policy(stubs: list[StubBackend], make_gateway: GatewayFactory) -> None:
    tenants = [
        {"name": "t", "api_keys": ["k"], "policy": "least_outstanding"},
        {"name": "s", "api_keys": ["k2"], "policy": "session", "policy_options": {"vnodes": 7}},
    ]
    gw = await make_gateway([s.url for s in stubs], tenants=tenants)
    assert gw.fleet.tenant_policies["t"].name == "least_outstanding"
    assert gw.fleet.tenant_policies["s"].name == "session"
    assert gw.fleet.policy.name == "round_robin"
    with pytest.raises(UserError, match="policy_options"):
        bad = [{"name": "t", "api_keys": ["k"], "policy": "session",
                "policy_options": {"nope": 1}}]  # fmt: skip
        Gateway(validate_config({"tenants": bad}))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"replicas": [{"url": "localhost:8001"}]}, "replicas[0].url"),
        ({"replicas": [{"url": "http://a", "weight": 2}]}, "replicas[0].weight"),
        ({"tenants": [{"name": "a", "api_keys": []}]}, "tenants[0].api_keys"),
        ({"limits": {"max_body_bytes": "big"}}, "limits.max_body_bytes"),
        ({"prot": 1}, "prot"),
        ({"slow_start_s": -1}, "slow_start_s"),
        ({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}]},
         "tenants[1].api_keys"),
    ],
)  # fmt: skip
def test_config_errors_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(UserError) as info:
        validate_config(data, source="fleet.yaml")
    assert field in str(info.value)
    assert "fix:" in str(info.value)


def test_slow_start_reaches_the_fleet_core_and_is_off_by_default() -> None:
    assert build_fleet(validate_config({})).slow_start_s == 0.0
    assert build_fleet(validate_config({"slow_start_s": 20})).slow_start_s == 20.0


def test_unknown_policy_is_a_user_error() -> None:
    with pytest.raises(UserError) as info:
        Gateway(validate_config({"policy": "fastest"}))
    assert info.value.field == "policy"


def test_load_config_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1\n")
    with pytest.raises(UserError, match="YAML"):
        load_config(bad)
    with pytest.raises(UserError, match="--config"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.process
async def test_replica_list_reloads_from_file(stubs: list[StubBackend], tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    cfg = {"replicas": [{"url": stubs[0].url}], "reload_interval_s": 0.05,
           "health": {"probe_interval_s": 0.1}}  # fmt: skip
    path.write_text(yaml.safe_dump(cfg))
    gw = Gateway(load_config(path), config_path=str(path))
    await gw.start("127.0.0.1", 0)
    try:
        gw.add_replica("http://127.0.0.1:9", replica_id="by-admin")  # nothing listens there
        await wait_until(lambda: len(gw.replicas) == 2)
        cfg["replicas"] = [{"url": stubs[1].url, "id": "second"}]
        path.write_text(yaml.safe_dump(cfg))
        # Admin-added replicas survive; config replicas follow the file.
        await wait_until(lambda: set(gw.replicas.by_id) == {"by-admin", "second"})
        path.write_text("replicas: 3\n")  # invalid: the running set stays
        with pytest.raises(UserError):
            gw.reload()
        assert set(gw.replicas.by_id) == {"by-admin", "second"}
    finally:
        await gw.stop()
