"""The Stream's credit: granted back in halves of the window, not one message per batch,
and never so late that the sidecar runs out while records wait (issue 34)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from dsclient import DsClient
from dsclient.stream import OwedCredit
from tests.unit.client.inprocess import in_process_mesh
from tests.unit.sidecar.stream_harness import GROUP


def test_credit_is_granted_once_half_the_window_is_owed() -> None:
    owed = OwedCredit(10)
    assert [owed.arrived(1) for _ in range(4)] == [0, 0, 0, 0]
    assert owed.arrived(1) == 5  # half the window: the sidecar still holds the other half
    assert owed.arrived(7) == 7  # a big batch is granted back at once
    assert owed.arrived(2) == 0
    owed.reset()  # a new opening starts with the whole window
    assert owed.arrived(4) == 0 and owed.arrived(1) == 5


def test_a_window_of_one_grants_every_record() -> None:
    owed = OwedCredit(1)
    assert [owed.arrived(1) for _ in range(3)] == [1, 1, 1]
    assert OwedCredit(0).arrived(1) == 1  # a byte-credit-only opening: every batch


def test_records_one_per_batch_all_arrive_with_a_small_window() -> None:
    """Window 4, records buffered one at a time: each is its own batch and the credit
    goes back in twos; every record arrives, in order, and is acked."""
    with in_process_mesh(1) as mesh:
        (sidecar,) = mesh.sidecars
        mesh.on_loop(lambda: sidecar.hold(0, epoch=1, start=0))
        seen: list[int] = []
        with DsClient(GROUP, client_id="app", assigner=mesh.assigner) as client:
            stream = client.stream(4, use_stream_rpc=True)
            with ThreadPoolExecutor(1) as reader:
                for offset in range(20):
                    mesh.on_loop(lambda o=offset: sidecar.buffer(0, range(o, o + 1)))
                    while len(seen) <= offset:
                        try:
                            batch = reader.submit(next, stream).result(timeout=20)
                        except TimeoutError:
                            client.close()  # ends the stream: the reader returns
                            raise AssertionError(f"stalled after {seen}") from None
                        seen.extend(r.offset for r in batch)
                        assert client.ack(batch) == len(batch)
                stream.close()
        assert seen == list(range(20))
        part = mesh.on_loop(lambda: sidecar.table.get(sidecar.table.snapshot()[0].tp))
        assert part is not None and part.acks.commit_point == 20
