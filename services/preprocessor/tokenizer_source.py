"""Where the preprocessor's tokenizer comes from: `--tokenizer DIR`, or (the normal case, so
the frontend host needs no model files) the engines' own GetTokenizer stream."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable, Mapping

from switchyard.common.engines.connect import client_for
from switchyard.common.errors import EngineError
from switchyard.preprocessor.errors import TokenizerLoadError
from switchyard.preprocessor.tokenizer import TokenizerBundle
from switchyard.protos.messages import Instance

log = logging.getLogger(__name__)


async def fetch_from_engines(
    instances: Callable[[], Mapping[int, Instance]], retry_interval: float = 1.0
) -> TokenizerBundle:
    """Try each known engine until one hands over a tokenizer that loads."""
    while True:
        for inst in list(instances().values()):
            client = client_for(inst.protocol, inst.url, inst.instance_id)
            try:
                data = await client.fetch_tokenizer()
                dest = tempfile.mkdtemp(prefix="switchyard-tokenizer-")
                bundle = await asyncio.to_thread(TokenizerBundle.from_zip_bytes, data, dest)
                log.info("tokenizer fetched from %s (%d bytes) into %s", inst.url, len(data), dest)
                return bundle
            except (EngineError, TokenizerLoadError) as exc:
                log.warning("tokenizer fetch from %s failed: %s", inst.url, exc)
            finally:
                await client.close()
        await asyncio.sleep(retry_interval)
