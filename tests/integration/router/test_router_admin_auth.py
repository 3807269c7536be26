"""`POST /admin/warm`, as a table: token state x headers x tenant settings -> status, and whose
cache the warm filled. "Whose" is measured, not assumed: after each row every tenant sends the
row's prompt to the real simulated pod, and only the warmed tenant's request may find it cached
(`usage.prompt_tokens_details.cached_tokens`), since each tenant's salt keys its own blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.integration.router.conftest import pool_config, serve_router
from tests.integration.router.edge_helpers import RawConnection, request_bytes

TOKEN = "s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
TENANTS = [
    {"name": "acme", "api_keys": [{"value": "k-acme"}]},
    {"name": "beta", "api_keys": [{"value": "k-beta"}]},
]
KEYS = {"acme": "k-acme", "beta": "k-beta", "anonymous": None, "none": None}

# config name -> (config overrides, tenants whose cache each row checks)
CONFIGS = {
    "anonymous": ({"tenants": {"tenants": TENANTS, "unknown_key": "anonymous"}},
                  ["acme", "beta", "anonymous"]),
    "reject": ({"tenants": {"tenants": TENANTS, "unknown_key": "reject"}}, ["acme", "beta"]),
    "no-tenants": ({}, ["none"]),
    "disabled": ({"tenants": {"tenants": TENANTS}}, ["acme", "anonymous"]),
}  # fmt: skip

# (config, request headers, body `tenant` (omitted if None), status, tenant whose cache is warm)
TABLE = [
    ("anonymous", {}, None, 401, None),
    ("anonymous", {"authorization": "Bearer "}, None, 401, None),  # the empty-token bypass
    ("anonymous", {"authorization": "Bearer"}, None, 401, None),
    ("anonymous", {"authorization": "Bearer wrong"}, "acme", 401, None),
    ("anonymous", {"authorization": "Bearer k-acme"}, "acme", 401, None),  # a tenant key
    ("anonymous", {"api-key": TOKEN}, "acme", 401, None),
    ("anonymous", {"authorization": f"Basic {TOKEN}"}, "acme", 401, None),
    ("anonymous", ADMIN, "acme", 200, "acme"),
    ("anonymous", {"authorization": f"bearer {TOKEN}"}, "beta", 200, "beta"),
    ("anonymous", ADMIN, None, 200, "anonymous"),
    ("anonymous", {**ADMIN, "api-key": "k-acme"}, "beta", 200, "beta"),  # keys are ignored
    ("anonymous", ADMIN, "nobody", 400, None),
    ("anonymous", ADMIN, 5, 400, None),
    ("reject", ADMIN, "acme", 200, "acme"),  # used to be a 401: the token read as an API key
    ("reject", ADMIN, None, 400, None),  # no anonymous requests exist to warm for
    ("reject", ADMIN, "anonymous", 400, None),
    ("reject", {"authorization": "Bearer k-beta"}, "beta", 401, None),
    ("no-tenants", ADMIN, None, 200, "none"),
    ("no-tenants", ADMIN, "acme", 400, None),
    ("disabled", ADMIN, "acme", 404, None),
    ("disabled", {}, None, 404, None),
]


def _prompt(row: int) -> str:
    return f"row {row}: " + " ".join(f"word{row}x{i}" for i in range(120))


@pytest.mark.parametrize("config_name", list(CONFIGS))
async def test_admin_warm_table(config_name, sim_pods, client, tmp_path: Path):
    pod = sim_pods(1)[0]
    overrides, checked = CONFIGS[config_name]
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    admin = {} if config_name == "disabled" else {"admin": {"token": {"file": str(token_file)}}}
    config = pool_config([pod.url], **overrides, **admin)
    rows = [(i, row) for i, row in enumerate(TABLE) if row[0] == config_name]
    async with serve_router(config) as (base, _runtime):
        for i, (_, headers, tenant, status, warmed) in rows:
            body: dict = {"model": "m", "prompt": _prompt(i)}
            if tenant is not None:
                body["tenant"] = tenant
            # Raw HTTP: clients like httpx refuse to send `Bearer ` with its trailing space.
            conn = await RawConnection.open(config.server.port)
            await conn.send(
                request_bytes("POST", "/admin/warm", json.dumps(body).encode(), headers)
            )
            resp = await conn.response(within_seconds=30)
            conn.close()
            assert resp.status == status, (i, resp)
            if status == 200:
                assert resp.json()["results"][0]["status"] == 200
                assert resp.json()["tenant"] == (None if warmed == "none" else warmed)
            else:
                assert set(resp.json()["error"]) >= {"message", "type", "code"}
            hits = {}
            for name in checked:
                key = KEYS[name]
                check_headers = {"authorization": f"Bearer {key}"} if key else {}
                check = await client.post(
                    f"{base}/v1/completions",
                    json={"model": "m", "prompt": _prompt(i), "max_tokens": 1},
                    headers=check_headers,
                )
                assert check.status_code == 200, check.text
                hits[name] = check.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert hits == {name: name == warmed for name in checked}, (i, hits)


@pytest.mark.parametrize(
    ("token", "message"),
    [("", "admin.token is empty"), (None, "cannot read secret file"),
     ("k-acme", "also a tenant API key")],
)  # fmt: skip
def test_an_unusable_admin_token_stops_the_router_at_start(token, message, tmp_path: Path):
    token_file = tmp_path / "admin-token"
    if token is not None:
        token_file.write_text(token + "\n")
    config = {
        "server": {"host": "127.0.0.1", "port": 0},
        "pools": [{"name": "p", "model": "m",
                   "endpoints": {"static": [{"url": "http://127.0.0.1:9"}]}}],
        "tenants": {"tenants": TENANTS},
        "admin": {"token": {"file": str(token_file)}},
    }  # fmt: skip
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "router", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout
