"""Standby accept: a connection left waiting in a sibling's queue past the grace is taken
and served here; one its owner accepts in time is not."""

from __future__ import annotations

import asyncio
import os
import socket

from switchyard.preprocessor.listener import listen_group
from switchyard.preprocessor.standby import Standby

GRACE = 0.05


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


class TestStandby:
    def test_a_connection_nobody_accepts_is_taken_after_the_grace(self):
        async def run() -> tuple[list[socket.socket], int]:
            (sibling,) = listen_group("127.0.0.1", 0, 1)
            served: list[socket.socket] = []
            counted = []
            standby = Standby([sibling], served.append, GRACE, lambda: counted.append(1))
            standby.start()
            try:
                _, writer = await connect(sibling.getsockname()[1])
                await asyncio.sleep(GRACE / 2)
                assert served == []  # its owner still has the grace
                await asyncio.sleep(GRACE * 4)
                writer.close()
                return served, len(counted)
            finally:
                standby.close()
                sibling.close()

        served, counted = asyncio.run(run())
        assert len(served) == 1 and counted == 1
        assert served[0].getblocking() is False
        assert served[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        served[0].close()

    def test_a_live_owner_keeps_its_connections(self):
        async def run() -> tuple[int, int]:
            own, sibling = listen_group("127.0.0.1", 0, 2)
            accepted_by_owner = []
            loop = asyncio.get_running_loop()

            def owner_accepts(sock: socket.socket) -> None:
                conn, _ = sock.accept()
                accepted_by_owner.append(conn)

            # The owner is another process: its own descriptor of the socket.
            owner = socket.socket(fileno=os.dup(sibling.fileno()))
            for sock in (own, sibling, owner):
                sock.setblocking(False)
            loop.add_reader(owner.fileno(), owner_accepts, owner)
            served: list[socket.socket] = []
            standby = Standby([sibling], served.append, GRACE)
            standby.start()
            writers = []
            try:
                for _ in range(20):
                    writers.append((await connect(own.getsockname()[1]))[1])
                await asyncio.sleep(GRACE * 4)
                # what landed on `own` is nobody's here: it waits (its owner is elsewhere)
                return len(accepted_by_owner), len(served)
            finally:
                standby.close()
                loop.remove_reader(owner.fileno())
                owner.close()
                for writer in writers:
                    writer.close()
                for conn in [*accepted_by_owner, *served]:
                    conn.close()
                own.close()
                sibling.close()

        by_owner, taken = asyncio.run(run())
        assert by_owner > 0  # the kernel sent some of the 20 to the sibling's socket
        assert taken == 0

    def test_closed_standby_takes_nothing(self):
        async def run() -> int:
            (sibling,) = listen_group("127.0.0.1", 0, 1)
            served: list[socket.socket] = []
            standby = Standby([sibling], served.append, GRACE)
            standby.start()
            _, writer = await connect(sibling.getsockname()[1])
            await asyncio.sleep(GRACE / 2)  # its timer is set
            standby.close()
            await asyncio.sleep(GRACE * 3)
            writer.close()
            sibling.close()
            return len(served)

        assert asyncio.run(run()) == 0
