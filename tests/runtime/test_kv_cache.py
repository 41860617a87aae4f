import numpy as np

from specedge.runtime.kv_cache import KVCache, grown_slots


def entries(n: int, value: float) -> list[np.ndarray]:
    return [np.full((1, 2, n, 4), value, np.float32) for _ in range(3)]


def test_commit_truncate_and_grow_in_buckets() -> None:
    cache = KVCache(num_layers=3, kv_heads=2, head_dim=4, capacity=40, bucket=16)
    assert cache.slots == 16 and cache.length == 0
    cache.commit(entries(5, 1.0), entries(5, -1.0), [1, 2, 3, 4, 5])
    cache.commit(entries(3, 2.0), entries(3, -2.0), [6, 7])  # only the first 2 of 3 new entries
    assert cache.length == 7 and cache.tokens == [1, 2, 3, 4, 5, 6, 7]
    assert cache.keys[0][0, 0, 6, 0] == 2.0 and cache.keys[0][0, 0, 7, 0] == 0.0
    cache.truncate(6)  # roll back: nothing erased, only the length
    assert cache.length == 6 and cache.keys[0][0, 0, 6, 0] == 2.0
    assert cache.reserve(20) == 32  # next bucket, contents kept
    assert cache.keys[2][0, 1, 5, 3] == 2.0 and cache.values[1][0, 0, 0, 0] == -1.0
    assert cache.reserve(39) == 40  # capped at the capacity


def test_reuse_prefix_keeps_common_part_only() -> None:
    cache = KVCache(num_layers=3, kv_heads=2, head_dim=4, capacity=40, bucket=16)
    cache.commit(entries(6, 1.0), entries(6, 1.0), [5, 6, 7, 8, 9, 10])
    assert cache.reuse_prefix([5, 6, 7, 1, 2], limit=4) == 3
    assert cache.tokens == [5, 6, 7]
    assert cache.reuse_prefix([5, 6, 7], limit=2) == 2


def test_static_cache_takes_full_capacity() -> None:
    cache = KVCache(num_layers=1, kv_heads=1, head_dim=2, capacity=24, bucket=8, static=True)
    assert cache.slots == 24


def test_a_grown_buffer_holds_at_most_a_bucket_or_an_eighth_more() -> None:
    for bucket in (16, 64):
        for needed in range(1, 5000, 7):
            slots = grown_slots(needed, bucket)
            assert slots >= needed and slots % bucket == 0
            assert slots - needed < max(bucket, needed / 8)
