from switchyard.dispatcher.stall import StallWatch


def flowing(watch: StallWatch, streams: int = 2):
    engine = watch.activity(1, now=0.0)
    engine.streams, engine.replies, engine.armed = streams, 10, True
    return engine


class TestStallWatch:
    def test_an_engine_silent_with_streams_running_stalls_once(self):
        watch = StallWatch(5.0)
        engine = flowing(watch)
        assert watch.check(1.0) == []  # it produced replies since the last check
        assert watch.check(5.9) == []
        assert watch.check(6.1) == [1]  # silent for 5 s
        assert watch.check(20.0) == []  # reported once per stall
        engine.replies += 1  # it talks again: a later silence is a new stall
        assert watch.check(21.0) == []
        assert watch.check(26.5) == [1]

    def test_streams_waiting_for_a_first_token_are_not_a_stall(self):
        """Nothing flowed yet (a long prefill)."""
        watch = StallWatch(5.0)
        watch.activity(1, now=0.0).streams = 1
        assert watch.check(100.0) == []

    def test_a_long_prefill_after_streams_finished_normally_is_not_a_stall(self):
        watch = StallWatch(5.0)
        engine = flowing(watch, streams=3)
        assert watch.check(1.0) == []
        engine.streams, engine.armed = 1, False  # two finished; one is still prefilling
        assert watch.check(50.0) == []

    def test_cancelled_streams_keep_it_armed_for_those_waiting(self):
        """The preprocessor gave up on the flowing streams of a frozen engine (gap timeout):
        the streams still waiting for their first token there must go too."""
        watch = StallWatch(5.0)
        engine = flowing(watch, streams=4)
        assert watch.check(1.0) == []
        engine.streams = 1  # three cancelled (armed stays), one waits for its first token
        assert watch.check(6.5) == [1]

    def test_an_idle_engine_is_disarmed(self):
        watch = StallWatch(5.0)
        engine = flowing(watch)
        assert watch.check(1.0) == []
        engine.streams = 0
        assert watch.check(2.0) == []
        engine.streams = 1  # a new request, in a long prefill
        assert watch.check(30.0) == []

    def test_an_engine_that_keeps_talking_never_stalls(self):
        watch = StallWatch(1.0)
        engine = flowing(watch, streams=1)
        for step in range(1, 50):
            engine.replies += 1
            assert watch.check(step * 0.5) == []
