import numpy as np

from specedge.runtime.engine.kv_cache import KVCache, grown_slots


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


def test_a_float16_cache_grows_keeping_whole_key_blocks() -> None:
    """The native attention's cache: keys in blocks of 16 slots ([KV, T/16, d, 16] in a [1, KV, T, d]
    buffer), so a grown buffer keeps every block a committed slot lies in, and every value row."""
    from specedge.kernels.attention_model import pack_keys, unpack_keys

    cache = KVCache(num_layers=1, kv_heads=2, head_dim=16, capacity=256, bucket=64, in_place=True, dtype=np.float16)
    rng = np.random.default_rng(0)
    keys = rng.normal(0, 1, (2, 64, 16)).astype(np.float16)
    values = rng.normal(0, 1, (2, 64, 16)).astype(np.float16)
    cache.keys[0][0] = pack_keys(keys).reshape(2, 64, 16)
    cache.values[0][0] = values
    cache.commit([], [], list(range(37)))  # in place: the pass wrote the entries
    cache.reserve(100)  # grows to 128 slots
    assert cache.slots == 128 and cache.keys[0].dtype == np.float16 and cache.bytes_for(1) == 2 * 2 * 16 * 2
    grown = unpack_keys(cache.keys[0][0].reshape(2, 8, 16, 16))
    assert np.array_equal(grown[:, :37], keys[:, :37]) and np.array_equal(cache.values[0][0, :, :37], values[:, :37])
