"""mpirl.transport.inbox, the one receive loop, on a one-rank communicator (messages sent to self):
each message reaches the handler of its kind as its view, an unexpected kind names itself and its
sender, and the limit, the source filter and the buffer reuse hold."""

import numpy as np
import pytest
from mpi4py import MPI

from mpirl.transport.inbox import Inbox, SitePort
from mpirl.transport.wire import Credit, Tag, Weights, Wire, transition_dtype


@pytest.fixture
def port():
    comm = MPI.COMM_SELF.Dup()
    wire = Wire(transition_dtype((4,), np.float32), 10)
    yield SitePort(comm, Inbox(wire, "buffer 3", lambda r: f"actor (site rank {r})", comm)), wire
    while port_backlog(comm):
        pass
    comm.Free()


def port_backlog(comm) -> bool:
    """Receive anything left (a test that failed midway) so the communicator can be freed."""
    st = MPI.Status()
    if comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st):
        comm.Recv([np.empty(st.Get_count(MPI.BYTE), np.uint8), MPI.BYTE], source=0)
        return True
    return False


def _serve_all(port, handlers, want: int, **kw) -> int:
    """Serve until ``want`` messages were handled (a send to self may take a few progress calls
    to match)."""
    n = 0
    for _ in range(10_000):
        n += port.inbox.serve(handlers, **kw)
        port.poll()
        if n >= want:
            break
    return n


def test_each_kind_reaches_its_handler_as_its_view(port):
    port, wire = port
    got = []
    handlers = {Tag.CREDIT: got.append, Tag.WEIGHTS: got.append}
    port.post(wire.credit(5, samples=7.0), 0)
    port.post(wire.weights(np.arange(10, dtype=np.float32), version=4, updates=123), 0)
    assert _serve_all(port, handlers, 2, now=9.5) == 2
    credit, weights = got
    assert isinstance(credit, Credit) and (credit.tokens, credit.samples) == (5, 7.0)
    assert isinstance(weights, Weights)
    assert (weights.version, weights.updates, weights.encoding) == (4, 123, 0)
    assert weights.rank == 0 and weights.t == 9.5 and weights.nbytes == 40 + 40
    np.testing.assert_array_equal(weights.arrays["params"], np.arange(10))


def test_an_unexpected_kind_names_itself_and_its_sender(port):
    port, wire = port
    port.post(wire.stop(2), 0)
    with pytest.raises(RuntimeError, match=r"buffer 3: unexpected STOP from actor \(site rank 0\)"):
        _serve_all(port, {Tag.CREDIT: print}, 1)


def test_limit_sources_and_reuse(port):
    port, wire = port
    got = []
    for k in range(3):
        port.post(wire.credit(k), 0)
    assert _serve_all(port, {Tag.CREDIT: got.append}, 1, sources=lambda: []) == 0  # held
    assert _serve_all(port, {Tag.CREDIT: got.append}, 1, limit=1) == 1
    assert [m.tokens for m in got] == [0]
    assert _serve_all(port, {Tag.CREDIT: got.append}, 2, sources=lambda: [0]) == 2
    assert [m.tokens for m in got] == [0, 1, 2]
    mine = np.empty(80, np.uint8)
    port.post(wire.weights(np.ones(10, np.float32), 1, 1), 0)
    _serve_all(port, {Tag.WEIGHTS: got.append}, 1, reuse={Tag.WEIGHTS: mine})
    assert got[-1].buf is mine and got[-1].arrays["params"].sum() == 10
