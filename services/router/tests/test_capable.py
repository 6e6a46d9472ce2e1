"""The `capable` filter: a request needing a field only some protocols carry (`seed`) goes
only to engines that can honour it, in every preset and in the prefill profile; migration
exclusions keep it among them; none left is `no_worker`; dry runs name the filter."""

from __future__ import annotations

import pytest

from switchyard.router.config import MODES, load
from switchyard.router.policies.capable import Capable
from switchyard.router.tests.helpers import core, inst, prompt, req

MIXED = (inst(1, protocol="sglang"), inst(2, protocol="vllm"), inst(3, protocol="vllm"))


class TestRouting:
    @pytest.mark.parametrize("mode", MODES)
    def test_seeded_requests_reach_vllm_engines_only(self, mode):
        c = core(*MIXED, mode=mode)
        picked = {
            c.route(req(f"r{n}", prompt(n, 64), requires=["seed"]), now=0).response.instance_id
            for n in range(30)
        }
        assert picked and picked <= {2, 3}

    def test_without_a_need_every_engine_is_a_candidate(self):
        c = core(*MIXED, mode="round_robin")
        picked = {
            c.route(req(f"r{n}", prompt(n, 64)), now=0).response.instance_id for n in range(6)
        }
        assert picked == {1, 2, 3}

    def test_a_migration_stays_among_capable_engines(self):
        c = core(*MIXED)
        reply = c.route(req("r.m1", prompt(1, 64), requires=["seed"], exclude=[2]), now=0)
        assert reply.response.instance_id == 3
        none_left = c.route(req("r.m2", prompt(1, 64), requires=["seed"], exclude=[2, 3]), now=0)
        assert none_left.response.instance_id is None

    def test_dry_run_names_the_filter(self):
        c = core(*MIXED)
        reply = c.route(req("d", prompt(2, 64), requires=["seed"], dry_run=True), now=0).response
        filtered = {w.instance_id: w.filtered_by for w in reply.workers}
        assert filtered[1] == "capable" and filtered[2] == filtered[3] == ""

    def test_the_filter_alone(self):
        from switchyard.router.types import RouteContext

        class W:
            def __init__(self, i):
                self.instance = i

        workers = [W(i) for i in MIXED]
        ctx = RouteContext(request=req("r", [1], requires=["seed"]), now=0, time=None)  # type: ignore[arg-type]
        assert [w.instance.instance_id for w in Capable().filter(ctx, workers)] == [2, 3]  # type: ignore[arg-type]


class TestConfig:
    @pytest.mark.parametrize("profile", ["decode", "prefill"])
    def test_a_profile_must_keep_it(self, profile, tmp_path):
        path = tmp_path / "r.yaml"
        path.write_text(
            f"{profile}:\n  filters: [same_model, serves_requests, prefill_role, same_protocol]\n"
        )
        with pytest.raises(ValueError, match="capable"):
            load(path, "kv")
