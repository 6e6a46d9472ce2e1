from switchyard.router.load import InFlightTracker


class TestInFlightTracker:
    def test_route_first_token_finish(self):
        t = InFlightTracker()
        t.add("a", 1, now=0)
        assert (t.in_flight(1), t.in_prefill(1)) == (1, 1)
        t.first_token("a")
        assert (t.in_flight(1), t.in_prefill(1)) == (1, 0)
        t.finish("a")
        assert (t.in_flight(1), t.in_prefill(1), len(t)) == (0, 0, 0)

    def test_notices_are_idempotent(self):
        t = InFlightTracker()
        t.add("a", 1, now=0)
        t.first_token("a")
        t.first_token("a")
        t.finish("a")
        t.finish("a")
        t.finish("never-routed")
        assert (t.in_flight(1), t.in_prefill(1)) == (0, 0)

    def test_finish_before_first_token_frees_prefill(self):
        t = InFlightTracker()
        t.add("a", 1, now=0)
        t.finish("a")
        assert t.in_prefill(1) == 0

    def test_reroute_moves_the_request(self):
        t = InFlightTracker()
        t.add("a", 1, now=0)
        t.add("a", 2, now=1)
        assert (t.in_flight(1), t.in_flight(2)) == (0, 1)

    def test_lost_notice_expires(self):
        t = InFlightTracker(ttl=10)
        t.add("a", 1, now=0)
        t.add("b", 1, now=5)
        assert t.expire(now=10) == 1
        assert t.in_flight(1) == 1
        assert t.expire(now=15) == 1
        assert t.in_flight(1) == 0

    def test_drop_instance(self):
        t = InFlightTracker()
        t.add("a", 1, now=0)
        t.add("b", 2, now=0)
        t.drop_instance(1)
        assert (t.in_flight(1), t.in_flight(2), len(t)) == (0, 1, 1)
