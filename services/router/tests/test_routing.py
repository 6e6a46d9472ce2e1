"""Routing decisions of the presets: KV overlap and load in time units, data-parallel
ranks, engines at capacity, session affinity, bursts of a new prefix, dry-run explanations."""

from smg_grpc_proto.generated import common_pb2

from switchyard.protos.messages import STAGE_FIRST_TOKEN, RouteProgress
from switchyard.router.tests.helpers import core, hold, inst, prompt, req
from switchyard.router.timing import OFFSET_HALF_LIFE_S, TimeModel, TimeParams


def busy_record(running: int, waiting: int, window: int = 8) -> common_pb2.EngineLoad:
    return common_pb2.EngineLoad(
        running_requests=running, waiting_requests=waiting, max_running_requests=window
    )


class TestKvInTimeUnits:
    def test_prefix_goes_where_it_is_cached(self):
        c = core(inst(1), inst(2), inst(3))
        tokens = prompt(1, 2048)
        hold(c, (2, 0), tokens[:1024])
        assert c.route(req("r", tokens), now=0).response.instance_id == 2

    def test_a_conversation_stays_on_its_busy_worker(self):
        """Regression: under load the in-flight term outweighed a whole-conversation hit (a
        running request's decode blocks weighed as much as a prompt's prefill)."""
        c = core(inst(1), inst(2), inst(3), inst(4))
        conversation = prompt(2, 4000)
        hold(c, (2, 0), conversation[:3968])
        for n in range(6):  # six long conversations decoding there
            c.tracker.add(f"other{n}", (2, 0), now=0, prefill_tokens=0, tokens=8000)
        reply = c.route(req("turn", conversation + prompt(3, 40)), now=0).response
        assert reply.instance_id == 2

    def test_it_moves_when_waiting_there_costs_more_than_recomputing(self):
        c = core(inst(1), inst(2))
        conversation = prompt(2, 2000)
        hold(c, (2, 0), conversation[:1984])
        for n in range(5):  # 20k prompt tokens queued for prefill there
            c.tracker.add(f"queued{n}", (2, 0), now=0, prefill_tokens=4000, tokens=4000)
        assert c.route(req("turn", conversation + [7] * 40), now=0).response.instance_id == 1

    def test_engine_reported_queue_counts_too(self):
        c = core(inst(1), inst(2))
        conversation = prompt(2, 2000)
        hold(c, (2, 0), conversation[:1984])
        record = busy_record(4, 30, window=256)
        record.waiting_uncached_tokens = 40_000  # another router's requests, say
        c.engine_loads.update((2, 0), record, now=0)
        assert c.route(req("turn", conversation + [7] * 40), now=0).response.instance_id == 1


class TestDecodeLoad:
    def test_long_decodes_spread_over_an_idle_engine(self):
        """Regression: with only the running penalty (0.2 ms a request), a one-block hit
        outweighed any decode batch, so a new engine got no streams while the others each ran
        8 long ones."""
        tokens = prompt(5, 40)
        for weight, expected in ((5.0, 1), (0.0, 2)):
            c = core(inst(1), inst(2), time=TimeParams(decode_ms_per_1k_tokens=weight))
            hold(c, (2, 0), tokens[:32])
            for n in range(8):  # decoding there, prefilled long ago
                c.tracker.add(f"s{n}", (2, 0), now=0, tokens=40)
                c.tracker.first_token(f"s{n}")
            assert c.route(req("new", tokens), now=0).response.instance_id == expected

    def test_explained_in_milliseconds(self):
        c = core(inst(1), inst(2))
        c.tracker.add("s", (2, 0), now=0, tokens=1000)
        rows = {
            w.instance_id: w
            for w in c.route(req("d", prompt(6, 64), dry_run=True), now=0).response.workers
        }
        # 5 ms per 1k tokens x (1000 prompt + 256 output tokens in flight)
        assert abs(rows[2].decode_ms - 5 * 1.256) < 1e-6
        assert rows[1].decode_ms == 0.0

    def test_bad_values_raise(self):
        for bad in ({"decode_ms_per_1k_tokens": -1}, {"output_tokens": 1.5}, {"output_tokens": -3}):
            try:
                TimeParams(**bad)
            except ValueError as e:
                assert next(iter(bad)) in str(e)
            else:
                raise AssertionError(f"{bad} accepted")


class TestDataParallel:
    def test_prefix_on_rank_1_is_routed_to_rank_1(self):
        c = core(inst(1, dp_size=2), inst(2))
        tokens = prompt(4, 1024)
        hold(c, (1, 1), tokens)
        reply = c.route(req("r", tokens + [5] * 20), now=0).response
        assert (reply.instance_id, reply.dp_rank) == (1, 1)
        assert c.tracker.load((1, 1)).in_flight == 1

    def test_an_engine_without_dp_gets_no_rank(self):
        c = core(inst(1))
        assert c.route(req("r", [1] * 40), now=0).response.dp_rank is None

    def test_load_is_per_rank(self):
        c = core(inst(1, dp_size=2), mode="least_loaded")
        picks = [c.route(req(f"r{n}", [n] * 40), now=0).response.dp_rank for n in range(4)]
        assert sorted(picks) == [0, 0, 1, 1]


class TestCapacity:
    def test_an_engine_at_capacity_is_skipped_while_another_has_room(self):
        c = core(inst(1, max_running=8), inst(2, max_running=8))
        tokens = prompt(5, 1024)
        hold(c, (1, 0), tokens)
        c.engine_loads.update((1, 0), busy_record(8, 3), now=0)
        reply = c.route(req("r", tokens, dry_run=True), now=0).response
        assert reply.instance_id == 2
        filtered = {w.instance_id: w.filtered_by for w in reply.workers}
        assert filtered == {1: "has_capacity", 2: ""}

    def test_router_bookkeeping_counts_without_a_report(self):
        c = core(inst(1, max_running=2), inst(2, max_running=2))
        tokens = prompt(5, 1024)
        hold(c, (1, 0), tokens)
        c.tracker.add("a", (1, 0), now=0)
        c.tracker.add("b", (1, 0), now=0)
        assert c.route(req("r", tokens), now=0).response.instance_id == 2

    def test_all_at_capacity_keeps_everyone(self):
        c = core(inst(1, max_running=8), inst(2, max_running=8))
        tokens = prompt(5, 1024)
        hold(c, (1, 0), tokens)
        for key in ((1, 0), (2, 0)):
            c.engine_loads.update(key, busy_record(8, 3), now=0)
        assert c.route(req("r", tokens), now=0).response.instance_id == 1

    def test_stale_report_reads_as_none(self):
        c = core(inst(1, max_running=8), inst(2, max_running=8))
        tokens = prompt(5, 1024)
        hold(c, (1, 0), tokens)
        c.engine_loads.update((1, 0), busy_record(8, 3), now=0)
        assert c.route(req("r", tokens), now=60).response.instance_id == 1


class TestSessionAffinity:
    def test_a_session_sticks_to_its_worker(self):
        c = core(inst(1), inst(2), inst(3))
        first = c.route(req("a", prompt(6, 200), session="s1"), now=0).response.instance_id
        c.progress(RouteProgress("a", first, "finished"))
        for n in range(5):  # unrelated prompts, equal load elsewhere: the session decides
            reply = c.route(req(f"b{n}", prompt(10 + n, 200), session="s1"), now=1).response
            c.progress(RouteProgress(f"b{n}", reply.instance_id, "finished"))
            assert reply.instance_id == first

    def test_the_sticky_worker_yields_when_overloaded(self):
        c = core(inst(1), inst(2), inst(3))
        first = c.route(req("a", prompt(6, 200), session="s1"), now=0).response.instance_id
        for n in range(8):
            c.tracker.add(f"load{n}", (first, 0), now=0)
        reply = c.route(req("b", prompt(7, 200), session="s1"), now=1).response
        assert reply.instance_id != first

    def test_of_two_workers_the_busy_sticky_one_yields_to_an_idle_one(self):
        """Regression: the guard compared the sticky worker with the candidates' average,
        itself included; of two workers it can never hold more than twice that, so after an
        engine restart every session stayed on the engine that had taken them over and the
        restarted one got no request at all."""
        c = core(inst(1), inst(2))
        first = c.route(req("a", prompt(6, 200), session="s1"), now=0).response.instance_id
        for n in range(8):
            c.tracker.add(f"load{n}", (first, 0), now=0)
        reply = c.route(req("b", prompt(7, 200), session="s1"), now=1).response
        assert reply.instance_id == 3 - first

    def test_two_busy_workers_yield_to_an_idle_third(self):
        c = core(inst(1), inst(2), inst(3))
        first = c.route(req("a", prompt(6, 200), session="s1"), now=0).response.instance_id
        busy, idle = [i for i in (1, 2, 3) if i != first]
        for n in range(5):
            c.tracker.add(f"mine{n}", (first, 0), now=0)
            c.tracker.add(f"other{n}", (busy, 0), now=0)
        reply = c.route(req("b", prompt(7, 200), session="s1"), now=1).response
        assert reply.instance_id == idle

    def test_a_session_stays_while_the_others_are_about_as_busy(self):
        c = core(inst(1), inst(2))
        first = c.route(req("a", prompt(6, 200), session="s1"), now=0).response.instance_id
        for n in range(5):
            c.tracker.add(f"mine{n}", (first, 0), now=0)
        for n in range(4):
            c.tracker.add(f"other{n}", (3 - first, 0), now=0)
        reply = c.route(req("b", prompt(7, 200), session="s1"), now=1).response
        assert reply.instance_id == first

    def test_sessions_expire(self):
        c = core(inst(1), inst(2), inst(3))
        scorer = dict(c.decode.scorers)
        affinity = next(s for s in scorer if s.name == "session_affinity")
        c.route(req("a", prompt(6, 200), session="s1"), now=0)
        assert affinity.sticky("s1", now=599) is not None
        assert affinity.sticky("s1", now=601) is None


class TestBursts:
    def test_a_burst_of_a_new_prefix_waits_for_its_first_prefill(self):
        c = core(inst(1), inst(2), inst(3), inst(4))
        shared = prompt(8, 4096)
        chosen = {
            c.route(req(f"r{n}", shared + prompt(100 + n, 64)), now=0).response.instance_id
            for n in range(6)
        }
        assert len(chosen) == 1

    def test_without_bookings_the_burst_spreads(self):
        c = core(inst(1), inst(2), inst(3), inst(4), booking_ttl=0)
        shared = prompt(8, 4096)
        chosen = {
            c.route(req(f"r{n}", shared + prompt(100 + n, 64)), now=0).response.instance_id
            for n in range(6)
        }
        assert len(chosen) == 4


class TestTimeModel:
    def test_speed_learned_from_first_tokens(self):
        c = core(inst(1))
        for n in range(30):
            tokens = prompt(n, 512 + 64 * (n % 8))
            routed = c.route(req(f"r{n}", tokens), now=n * 10.0).response
            c.progress(
                RouteProgress(f"r{n}", routed.instance_id, STAGE_FIRST_TOKEN),
                now=n * 10.0 + 0.01 + len(tokens) * 2e-4,
            )
            c.progress(RouteProgress(f"r{n}", routed.instance_id, "finished"))
        speed = c.time.speed((1, 0))
        assert abs(speed.slope - 2e-4) / 2e-4 < 0.1
        assert abs(speed.base - 0.01) < 0.01

    def test_prior_holds_without_spread(self):
        model = TimeModel(TimeParams(prefill_ms_per_1k_tokens=50))
        for _ in range(20):
            model.observe((1, 0), 1000, 0.2)  # one size only: slope unknowable
        assert abs(model.speed((1, 0)).slope - 5e-5) < 1e-5

    def test_a_new_worker_is_priced_by_the_fleet_fit(self):
        """Regression: a worker with no observations of its own kept the prior (25 ms base)
        while its peers had learned 5 ms, so a new engine looked slow and drew no requests."""
        model = TimeModel(TimeParams())
        for n in range(20):
            model.observe((1, 0), 100 * (n % 5), 0.005 + 1e-5 * 100 * (n % 5))
        assert model.speed((2, 0)) == model.speed((3, 0))  # the pooled fit
        assert abs(model.speed((2, 0)).base - 0.005) < 0.002
        for n in range(8):  # its own, once it has enough
            model.observe((2, 0), 100 * (n % 4), 0.05 + 1e-4 * 100 * (n % 4))
        own = model.own_speed((2, 0)).slope  # its prompts spread: its own slope, nearly
        assert abs(model.speed((2, 0)).slope - own) < 0.15 * own
        assert model.speed((2, 0)).base > 0.02
        assert model.speed((2, 0)).base > model.speed((1, 0)).base + 0.02

    def test_a_delay_every_worker_sees_moves_the_fleet_not_one_worker(self):
        """Regression: fitted on its own, the base of the worker timed during a busy spell
        stayed high once the spell was over and it was no longer chosen: of two identical
        engines one drew every request."""
        model = TimeModel(TimeParams())
        a, b = (1, 0), (2, 0)
        t = 0.0
        for n in range(40):  # quiet: both answer in 20 ms
            t += 0.1
            model.observe(a if n % 2 else b, 64, 0.020, now=t)
        for n in range(40):  # a busy gateway: 120 ms on both
            t += 0.1
            model.observe(a if n % 2 else b, 64, 0.120, now=t)
        for _ in range(30):  # quiet again, and `b` is the one timed (fitted alone, `a` kept
            t += 0.1  # its busy 120 ms and would not be chosen again)
            model.observe(b, 64, 0.020, now=t)
        assert abs(model.speed(a, t).base - model.speed(b, t).base) < 0.006
        assert abs(model.speed(b, t).base + 64 * model.speed(b, t).slope - 0.020) < 0.002

    def test_a_slope_its_prompts_cannot_tell_is_the_fleets(self):
        """Prompts of nearly one length: the noise of their first tokens made a slope of its
        own for each worker, which priced identical engines apart at low load."""
        model = TimeModel(TimeParams())
        for n in range(80):
            if n % 2:  # prompts that spread: 1e-5 s per token
                model.observe((1, 0), 100 * (n % 5), 0.005 + 1e-5 * 100 * (n % 5), now=n * 0.1)
            else:  # 70-72 tokens, first tokens 5 ms apart by chance
                model.observe((2, 0), 70 + n % 3, 0.006 + 0.005 * (n % 3 == 2), now=n * 0.1)
        fleet = model.speed((3, 0)).slope
        assert abs(model.speed((2, 0)).slope - fleet) < 0.25 * fleet
        assert model.own_speed((2, 0)).slope > 3 * fleet  # on its own: near the prior

    def test_a_slow_worker_is_priced_slow_while_it_is_timed(self):
        model = TimeModel(TimeParams())
        fast, slow = (1, 0), (2, 0)
        for n in range(60):
            model.observe(fast if n % 2 else slow, 64, 0.020 if n % 2 else 0.060, now=n * 0.1)
        gap = model.speed(slow, 6.0).base - model.speed(fast, 6.0).base
        assert 0.03 < gap < 0.05

    def test_an_offset_fades_while_the_worker_is_not_timed(self):
        model = TimeModel(TimeParams())
        fast, slow = (1, 0), (2, 0)
        for n in range(60):
            model.observe(fast if n % 2 else slow, 64, 0.020 if n % 2 else 0.060, now=n * 0.1)
        now = 6.0 + OFFSET_HALF_LIFE_S
        gap = model.speed(slow, now).base - model.speed(fast, now).base
        assert 0.015 < gap < 0.025  # half of it
        model.observe(slow, 64, 0.060, now=now)  # timed again: it learns from the faded value
        assert model.speed(slow, now).base - model.speed(fast, now).base > gap

    def test_learning_off(self):
        model = TimeModel(TimeParams(learn=False))
        for n in range(20):
            model.observe((1, 0), 100 * n, n)
        assert model.speed((1, 0)).slope == TimeParams().per_token_s


class TestDryRun:
    def test_every_plugin_score_and_the_time_model_explained(self):
        c = core(inst(1), inst(2))
        tokens = prompt(9, 1024)
        hold(c, (2, 0), tokens[:512])
        reply = c.route(req("d", tokens, dry_run=True, session="s"), now=0).response
        rows = {w.instance_id: w for w in reply.workers}
        assert set(rows[1].scores) == {"predicted_ttft", "session_affinity"}
        assert rows[2].scores["predicted_ttft"] == 1.0
        assert rows[2].cached_tokens == 512 and rows[1].cached_tokens == 0
        # The uncached half costs prefill time on worker 2, the whole prompt on worker 1.
        assert rows[1].prefill_ms > rows[2].prefill_ms > 0
        assert rows[2].ttft_ms == reply.predicted_ttft_ms
        assert len(c.tracker) == 0 and c.bookings.size((2, 0)) == 0


class TestLazyPromptHashes:
    """The core hashes a prompt only as deep as the index walk reads it, and books token
    bytes: the decisions are those of fully hashed prompts."""

    def test_a_prompt_nobody_holds_hashes_one_block(self):
        from switchyard.router.tests.helpers import BLOCK

        c = core(inst(1), inst(2))
        hold(c, (2, 0), prompt(1, 1024))
        reply = c.route(req("r", prompt(2, 4096)), now=0).response
        assert reply.prompt_blocks == 4096 // BLOCK and reply.overlap_blocks == 0
        assert c.prompt_hashes.hashed_blocks == 1

    def test_a_held_prefix_is_read_to_its_end(self):
        from switchyard.router.tests.helpers import BLOCK

        c = core(inst(1), inst(2))
        tokens = prompt(3, 4096)
        hold(c, (2, 0), tokens[: 100 * BLOCK])
        reply = c.route(req("r", tokens), now=0).response
        assert reply.instance_id == 2 and reply.overlap_blocks == 100
        assert 100 <= c.prompt_hashes.hashed_blocks <= 100 + 32  # one chunk past the prefix

    def test_the_booking_of_an_unhashed_prompt_counts_for_the_next(self):
        c = core(inst(1), inst(2), inst(3))
        shared = prompt(4, 4096)
        first = c.route(req("a", shared + prompt(5, 64)), now=0).response.instance_id
        dry = c.route(req("b", shared + prompt(6, 64), dry_run=True), now=0).response
        row = next(w for w in dry.workers if w.instance_id == first and w.profile == "decode")
        assert row.pending_tokens == len(shared)  # the whole shared prefix is booked there
        assert dry.instance_id == first
