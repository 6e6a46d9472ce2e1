from switchyard.common.instance_diff import apply_events, diff_instances, index_instances
from switchyard.common.instance_id import instance_id
from switchyard.protos.messages import (
    ROLE_DECODE,
    Instance,
    InstanceAdded,
    InstanceRemoved,
    InstanceUpdated,
)


def inst(port: int, **changes: object) -> Instance:
    url = f"grpc://127.0.0.1:{port}"
    fields: dict = dict(
        instance_id=instance_id(url),
        url=url,
        protocol="sglang",
        model="m",
        context_length=4096,
        block_size=16,
    )
    fields.update(changes)
    return Instance(**fields)


A, B, C = inst(1001), inst(1002), inst(1003)


class TestDiff:
    def test_empty_to_empty(self):
        assert diff_instances({}, []) == []

    def test_add(self):
        assert diff_instances({}, [B, A]) == [InstanceAdded(A), InstanceAdded(B)]

    def test_remove(self):
        old = index_instances([A, B])
        assert diff_instances(old, [B]) == [InstanceRemoved(A.instance_id, A.url)]

    def test_readd_after_remove_keeps_id(self):
        old = index_instances([A, B])
        gone = diff_instances(old, [B])
        back = diff_instances(apply_events(old, gone), [A, B])
        assert back == [InstanceAdded(A)]
        assert back[0].instance.instance_id == gone[0].instance_id

    def test_reorder_gives_no_events(self):
        assert diff_instances(index_instances([A, B, C]), [C, A, B]) == []

    def test_duplicate_urls_collapse_last_wins(self):
        decode = inst(1001, role=ROLE_DECODE)
        assert diff_instances({}, [A, decode]) == [InstanceAdded(decode)]
        assert diff_instances(index_instances([A]), [A, A]) == []

    def test_changed_probe_result_is_updated(self):
        bigger = inst(1002, context_length=8192)
        assert diff_instances(index_instances([A, B]), [A, bigger]) == [InstanceUpdated(bigger)]

    def test_order_removed_updated_added_each_by_url(self):
        old = index_instances([inst(1005), inst(1004), inst(1002), inst(1001)])
        new = [inst(1007), inst(1002, model="x"), inst(1006), inst(1001, model="y")]
        kinds = [
            (type(e).__name__, e.url if isinstance(e, InstanceRemoved) else e.instance.url)
            for e in diff_instances(old, new)
        ]
        assert kinds == [
            ("InstanceRemoved", "grpc://127.0.0.1:1004"),
            ("InstanceRemoved", "grpc://127.0.0.1:1005"),
            ("InstanceUpdated", "grpc://127.0.0.1:1001"),
            ("InstanceUpdated", "grpc://127.0.0.1:1002"),
            ("InstanceAdded", "grpc://127.0.0.1:1006"),
            ("InstanceAdded", "grpc://127.0.0.1:1007"),
        ]

    def test_diff_then_apply_reaches_new(self):
        old = index_instances([A, B])
        new = [inst(1002, block_size=32), C]
        assert apply_events(old, diff_instances(old, new)) == index_instances(new)
        assert old == index_instances([A, B])  # not mutated
