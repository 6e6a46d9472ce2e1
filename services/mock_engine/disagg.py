"""One engine's part in prefill/decode disaggregation, shared by both protocol servicers.

A producer (SGLang prefill mode; vLLM kv_producer / kv_both) runs a KvTransferServer on its
bootstrap port (SGLang) or side channel (vLLM) and `offer`s each finished prefill's prompt KV,
its blocks held in the prefix cache until a decode engine takes them or the deadline passes.
A consumer (SGLang decode mode; vLLM kv_consumer / kv_both) `receive`s a prompt's KV from the
prefill engine named in the request, then runs the request with the prompt counted as
transferred (whole blocks of it: no prefill cost, reported as cached tokens).

Counters (`counters`) and one INFO log line per handover on each side ("kv handed over ...",
"kv received ...") let tests check who served what.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

from switchyard.mock_engine.config import EngineProtocol, MockEngineConfig
from switchyard.mock_engine.data_parallel import DataParallelEngine
from switchyard.mock_engine.errors import KvTransferFailed
from switchyard.mock_engine.faults import exit_now
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.kv_handover import (
    HandoverBoard,
    KvPayload,
    TransferCounters,
    TransferKey,
    describe,
)
from switchyard.mock_engine.kv_transfer import KvTransferServer, fetch_kv

logger = logging.getLogger(__name__)


class Disaggregation:
    def __init__(self, config: MockEngineConfig, engine: MockEngine | DataParallelEngine) -> None:
        self.config = config
        self.engine = engine
        self.counters = TransferCounters()
        self.engine_id = str(uuid.uuid4())  # vLLM's kv_engine_id / remote_engine_id
        self.board = HandoverBoard(self.counters)
        self._server: KvTransferServer | None = None
        self.port = 0  # the producer's bound bootstrap / side channel port; 0 if none
        self._next_block_id = 0

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def pending_fetches(self) -> int:
        """Decode engines' fetches this producer is serving now (waiting ones included)."""
        return self._server.connections if self._server is not None else 0

    async def start(self) -> None:
        """Bind the producer's port (SGLang: --bootstrap-port; vLLM: --side-channel-port)."""
        config = self.config
        if not config.kv_producer:
            return
        sglang = config.protocol is EngineProtocol.SGLANG
        wanted = config.bootstrap_port if sglang else config.side_channel_port
        server = KvTransferServer(
            self.board,
            max_wait_s=config.bootstrap_timeout_s,
            on_fetch=self._die_mid_transfer if config.exit_on_kv_fetch else None,
        )
        self.port = await server.start(config.host, wanted)
        self._server = server
        logger.info("kv transfer server listening host=%s port=%d", config.host, self.port)

    def _die_mid_transfer(self) -> None:
        logger.warning("exiting abruptly as a decode engine fetches KV (--exit-on-kv-fetch)")
        exit_now()

    async def stop(self) -> None:
        self.board.close()
        if self._server is not None:
            await self._server.stop()
            self._server = None

    def offer(
        self,
        key: TransferKey,
        prompt_ids: Sequence[int],
        *,
        first_token: int | None,
        deadline_s: float,
        with_block_ids: bool = False,
    ) -> tuple[KvPayload, asyncio.Future[bool]]:
        """Hold the prompt's blocks and offer them under `key` for `deadline_s`.

        Returns the payload and the board's `picked` future (True once taken over, False when
        dropped). A key already on offer is replaced: the newer request wins.
        """
        block_ids: tuple[int, ...] = ()
        if with_block_ids:
            count = -(-len(prompt_ids) // self.block_size)
            block_ids = tuple(range(self._next_block_id, self._next_block_id + count))
            self._next_block_id += count
        payload = KvPayload(tuple(prompt_ids), first_token, block_ids, self.engine_id)
        if key in self.board:
            logger.warning("replacing the KV waiting for pickup under %s", describe(key))
            self.board.withdraw(key)
        lease = self.engine.hold(prompt_ids)
        picked = self.board.offer(
            key, payload, release=lambda: self.engine.unhold(lease), deadline_s=deadline_s
        )
        logger.debug("kv offered %s tokens=%d", describe(key), len(prompt_ids))
        return payload, picked

    async def receive(
        self,
        host: str,
        port: int,
        key: TransferKey,
        prompt_ids: Sequence[int],
        *,
        request_id: str,
        wait: bool,
        block_ids: list[int] | None = None,
    ) -> int:
        """Take over the prompt's KV from host:port; the transferred token count (whole blocks
        of the prompt). KvTransferFailed (counted) when the KV does not arrive."""
        try:
            payload = await fetch_kv(
                host,
                port,
                key,
                timeout_s=self.config.bootstrap_timeout_s,
                wait=wait,
                block_ids=block_ids,
            )
            if payload.token_ids != tuple(prompt_ids):
                raise KvTransferFailed(
                    key,
                    "mismatch",
                    f"the KV of {describe(key)} is for another prompt "
                    f"({len(payload.token_ids)} tokens, this request has {len(prompt_ids)})",
                )
        except KvTransferFailed:
            self.counters.failed += 1
            raise
        self.counters.received += 1
        logger.info(
            "kv received %s from=%s:%d tokens=%d request_id=%s",
            describe(key),
            host,
            port,
            len(prompt_ids),
            request_id,
        )
        return len(prompt_ids) // self.block_size * self.block_size
