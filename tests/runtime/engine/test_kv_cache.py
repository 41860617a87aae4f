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


def test_copy_prefix_takes_the_entries_of_a_prefix_from_another_cache() -> None:
    """A slot's cache given another's entries for a prefix (a request beside another with the same
    context): float16 keys in whole blocks of 16 slots, values by row, the tokens those entries are of."""
    from specedge.kernels.attention_model import pack_keys, unpack_keys

    rng = np.random.default_rng(1)
    source = KVCache(num_layers=2, kv_heads=2, head_dim=16, capacity=64, static=True, in_place=True, dtype=np.float16)
    keys = rng.normal(0, 1, (2, 64, 16)).astype(np.float16)
    values = rng.normal(0, 1, (2, 64, 16)).astype(np.float16)
    for layer in range(2):
        source.keys[layer][0] = pack_keys(keys).reshape(2, 64, 16)
        source.values[layer][0] = values
    source.commit([], [], list(range(100, 140)))
    slot = KVCache(num_layers=2, kv_heads=2, head_dim=16, capacity=64, static=True, in_place=True, dtype=np.float16)
    slot.commit([], [], [7, 8, 9])  # what it held before is dropped
    slot.copy_prefix(source, list(range(100, 121)))
    assert slot.tokens == list(range(100, 121))
    for layer in range(2):
        copied = unpack_keys(slot.keys[layer][0].reshape(2, 4, 16, 16))
        assert np.array_equal(copied[:, :21], keys[:, :21])
        assert np.array_equal(slot.values[layer][0, :, :21], values[:, :21])
        assert not slot.values[layer][0, :, 32:].any()  # nothing past the prefix's last key block
    cache32 = KVCache(num_layers=1, kv_heads=2, head_dim=4, capacity=40, bucket=16)
    cache32.commit(entries(30, 3.0)[:1], entries(30, -3.0)[:1], list(range(30)))
    grown = KVCache(num_layers=1, kv_heads=2, head_dim=4, capacity=40, bucket=16)
    grown.copy_prefix(cache32, list(range(25)))  # a growable cache makes room first
    assert grown.length == 25 and grown.slots >= 25 and (grown.keys[0][:, :, :25] == 3.0).all()
    assert not grown.keys[0][:, :, 25:].any()
