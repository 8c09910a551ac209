"""The live publisher of PyTorch's allocator (`attach()`) against connections that never read
(issue 33): sixteen of them fill every place, and a dashboard attaches all the same, in the
place of one that has read nothing for a second."""

import json
import socket
import time

from vramscope import _native


def test_sixteen_idle_connections_give_up_a_place_to_a_dashboard(tmp_path):
    path = tmp_path / "idle.sock"
    publisher = _native.LivePublisher(f"unix:{path}")
    idle = []
    try:
        for _ in range(16):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(path))
            idle.append(conn)
        deadline = time.monotonic() + 20
        while publisher.clients < 16:
            assert time.monotonic() < deadline, "the idle connections never attached"
            time.sleep(0.01)
        time.sleep(1.3)
        seen = json.loads(_native.read_telemetry(publisher.addr, 1.6))
        counters = publisher.counters()
    finally:
        publisher.close()
        for conn in idle:
            conn.close()
    assert seen["hello"], seen
    assert seen["snapshots"], seen
    assert counters["refused"] == 0, counters
    assert counters["idle"] >= 1, counters
