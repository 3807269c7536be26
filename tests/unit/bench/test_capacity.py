"""Fleet capacity from the simulated engine under round robin."""

from kvgate.bench.capacity import fleet_capacity
from kvgate.bench.workloads import build_workload

SMALL = {
    "num_groups": "8",
    "prompts_per_group": "32",
    "system_prompt_len": "1024",
    "question_len": "32",
    "output_len": "16",
}


def test_more_pods_more_capacity_and_sharing_helps():
    shared = build_workload("shared-prefix", SMALL)
    one = fleet_capacity(shared, 1)
    two = fleet_capacity(shared, 2)
    assert one.requests_per_s > 0 and one.sampled_requests == 256
    assert 1.2 < two.requests_per_s / one.requests_per_s <= 2.05
    unique = build_workload(
        "shared-prefix", SMALL | {"num_groups": "256", "prompts_per_group": "1"}
    )
    assert fleet_capacity(unique, 1).requests_per_s < one.requests_per_s
    assert one.output_tokens_per_s == one.requests_per_s * 16
    assert fleet_capacity(shared, 1, sample=8).sampled_requests == 8
