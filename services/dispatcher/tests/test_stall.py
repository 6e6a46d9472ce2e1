from switchyard.dispatcher.stall import StallWatch


class TestStallWatch:
    def test_an_engine_silent_on_every_flowing_stream_stalls_once(self):
        watch = StallWatch(5.0)
        engine = watch.activity(1, now=0.0)
        engine.flowing, engine.replies = 2, 10
        assert watch.check(1.0) == []  # it produced replies since the last check
        assert watch.check(5.9) == []
        assert watch.check(6.1) == [1]  # silent for 5 s
        assert watch.check(20.0) == []  # reported once per stall
        engine.replies += 1  # it talks again: a later silence is a new stall
        assert watch.check(21.0) == []
        assert watch.check(26.5) == [1]

    def test_no_stall_without_a_stream_that_produced_output(self):
        """Streams all waiting for their first token (a long prefill) are not a stall."""
        watch = StallWatch(5.0)
        watch.activity(1, now=0.0)
        assert watch.check(100.0) == []

    def test_an_engine_that_keeps_talking_never_stalls(self):
        watch = StallWatch(1.0)
        engine = watch.activity(1, now=0.0)
        engine.flowing = 1
        for step in range(1, 50):
            engine.replies += 1
            assert watch.check(step * 0.5) == []
