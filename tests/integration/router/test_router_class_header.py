"""The class header through a real router and two real simulated pods (an online pool and a
batch pool): which pool served each request, as the `x-kvgate-pool` header says."""

from __future__ import annotations

from tests.integration.router.conftest import pool_config, serve_router

TENANTS = [
    {"name": "nightly", "api_keys": [{"value": "k-nightly"}], "request_class": "batch"},
    {"name": "ops", "api_keys": [{"value": "k-ops"}], "request_class": "batch",
     "may_choose_class": True},
    {"name": "app", "api_keys": [{"value": "k-app"}]},
]  # fmt: skip

# (API key, x-kvgate-class, pool that must serve it)
TABLE = [
    ("k-nightly", None, "batch"),
    ("k-nightly", "online", "batch"),  # a batch tenant cannot lift itself
    ("k-ops", "online", "online"),  # ... unless it may choose
    ("k-ops", None, "batch"),
    ("k-app", None, "online"),
    ("k-app", "batch", "batch"),  # lowering is always allowed
    (None, "online", "online"),  # anonymous: online by default
    (None, "batch", "batch"),
]


async def test_class_header_only_lowers_unless_allowed(sim_pods, client):
    online, batch = sim_pods(2)
    config = pool_config(
        [online.url],
        pools=[
            {"name": "online", "model": "m", "endpoints": {"static": [{"url": online.url}]}},
            {
                "name": "batch",
                "model": "m",
                "pool_class": "batch",
                "endpoints": {"static": [{"url": batch.url}]},
            },
        ],
        tenants={"tenants": TENANTS},
        # No borrowing either way: the pool that serves a request is its class's pool.
        borrowing={"enabled": False, "online_may_use_batch_pools": False},
    )
    served = []
    async with serve_router(config) as (base, _runtime):
        for key, asked, _pool in TABLE:
            headers = {"authorization": f"Bearer {key}"} if key else {}
            if asked:
                headers["x-kvgate-class"] = asked
            resp = await client.post(
                f"{base}/v1/completions",
                json={"model": "m", "prompt": "hello", "max_tokens": 1},
                headers=headers,
            )
            assert resp.status_code == 200, resp.text
            served.append(resp.headers["x-kvgate-pool"].split("/")[1])
    assert served == [pool for _key, _asked, pool in TABLE]
