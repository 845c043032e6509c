import torch

from radixlm.runtime.device import count_traffic
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT, KVPool, ReqToTokenTable, SlotAllocator


def test_allocator_hands_out_distinct_slots_and_takes_them_back():
    alloc = SlotAllocator(num_slots=9)
    assert alloc.capacity == 8 and alloc.num_free == 8
    a = alloc.allocate(3)
    b = alloc.allocate(5)
    assert alloc.allocate(1) is None
    got = torch.cat([a, b]).tolist()
    assert sorted(got) == list(range(1, 9))  # slot 0 is never handed out
    alloc.free(a)
    assert alloc.num_free == 3
    c = alloc.allocate(3)
    assert sorted(c.tolist()) == sorted(a.tolist())
    alloc.free(b)
    alloc.free(c)
    assert alloc.num_free == 8


def test_allocator_refuses_to_free_more_than_allocated():
    alloc = SlotAllocator(num_slots=4)
    slots = alloc.allocate(2)
    alloc.free(slots)
    try:
        alloc.free(slots)
    except RuntimeError as e:
        assert "more KV slots" in str(e)
    else:
        raise AssertionError("double free went unnoticed")


def test_pool_pad_slot_is_zero_and_write_lands_in_slots():
    pool = KVPool(num_layers=2, num_slots=5, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    assert pool.k[:, PAD_SLOT].abs().sum() == 0 and pool.v[:, PAD_SLOT].abs().sum() == 0
    k = torch.arange(4.0).reshape(2, 1, 2)
    pool.write(1, torch.tensor([3, 1]), k, -k)
    assert torch.equal(pool.k[1, 3], k[0]) and torch.equal(pool.v[1, 1], -k[1])


def test_req_to_token_rows_are_reused():
    table = ReqToTokenTable(max_running_requests=2, max_context_len=4)
    r0, r1 = table.allocate_row(), table.allocate_row()
    assert {r0, r1} == {0, 1} and table.allocate_row() is None
    table.write(r1, 1, torch.tensor([7, 8]))
    assert table.table[r1].tolist() == [0, 7, 8, 0]
    table.free_row(r0)
    assert table.allocate_row() == r0


def test_pool_write_layers_stores_every_layer_at_once():
    pool = KVPool(num_layers=2, num_slots=5, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    pool.k.fill_(7.0)  # uninitialised memory may hold NaNs, which equal nothing
    before = pool.k.clone()
    k = torch.arange(8.0).reshape(2, 2, 1, 2)  # (L, B, Hkv, D)
    pool.write_layers(torch.tensor([4, 2]), k, -k)
    for layer in range(2):
        assert torch.equal(pool.k[layer, [4, 2]], k[layer])
        assert torch.equal(pool.v[layer, [4, 2]], -k[layer])
    assert torch.equal(pool.k[:, [0, 1, 3]], before[:, [0, 1, 3]])


def test_req_to_token_writes_positions_and_reads_rows_on_the_cpu():
    table = ReqToTokenTable(max_running_requests=2, max_context_len=4)
    table.write_positions(torch.tensor([0, 1, 1]), torch.tensor([2, 0, 3]), torch.tensor([5, 6, 7]))
    assert table.table.tolist() == [[0, 0, 5, 0], [6, 0, 0, 7]]
    slots = table.read(1, 3)
    assert slots.tolist() == [6, 0, 0] and slots.data_ptr() == table.table[1].data_ptr()


def test_pool_and_table_live_on_the_device_given():
    meta = torch.device("meta")
    pool = KVPool(2, 5, 1, 2, torch.float32, device=meta)
    table = ReqToTokenTable(2, 4, device=meta)
    assert pool.k.device == pool.v.device == table.table.device == meta
    table.write(0, 1, torch.tensor([3, 4]))  # CPU slots, as the scheduler has them
    table.write_positions(torch.tensor([1]), torch.tensor([0]), torch.tensor([2]))
    pool.write_layers(torch.tensor([1]), *torch.ones(2, 2, 1, 1, 2, device=meta))


def test_a_mirrored_table_reads_the_host_and_sends_a_steps_writes_in_one_copy():
    """On a GPU the table keeps a host copy: reads never wait for the device, and the
    writes since the last flush cross in one copy, the last value of a position twice
    written winning."""
    table = ReqToTokenTable(2, 4, host_mirror=True)
    device = table._device_table
    assert device is not table.host
    table.write(0, 0, torch.tensor([5, 6, 7]))
    table.write_positions(torch.tensor([1, 0]), torch.tensor([3, 1]), torch.tensor([9, 8]))
    table.write(0, 1, torch.tensor([4]))  # position 1 of row 0 again
    assert table.read(0, 3).tolist() == [5, 4, 7]
    assert device.abs().sum() == 0  # nothing sent yet
    with count_traffic() as seen:
        table.flush()
        table.flush()  # nothing left to send
    assert seen.copies_to_device == 1 and seen.syncs == 0
    assert device.tolist() == [[5, 4, 7, 0], [0, 0, 0, 9]]
    table.write(1, 0, torch.tensor([2]))
    assert table.table.tolist() == [[5, 4, 7, 0], [2, 0, 0, 9]]  # reading it flushes


def test_an_unmirrored_table_is_its_own_host_copy():
    table = ReqToTokenTable(2, 4)
    assert table.table is table.host
    with count_traffic() as seen:
        table.write(0, 0, torch.tensor([1, 2]))
        table.flush()
    assert seen.copies_to_device == 0 and table.table[0].tolist() == [1, 2, 0, 0]
