"""Where the preprocessor's tokenizers come from: one per served model.

From the operator (`--tokenizer DIR` for every model, `--tokenizer MODEL=DIR` for one), else,
the normal case (the frontend host needs no model files), from one of the model's own engines
through GetTokenizer, as soon as the model appears in the fleet. A fetch that fails is retried
on the model's engines until one loads or the model is gone. Models served with the same
tokenizer folder share one loaded bundle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from switchyard.common import heap, scratch
from switchyard.common.engines.connect import client_for
from switchyard.common.engines.tls import EngineTls
from switchyard.common.errors import EngineError
from switchyard.preprocessor.errors import TokenizerLoadError
from switchyard.preprocessor.tokenizer import TokenizerBundle
from switchyard.protos.messages import Instance

log = logging.getLogger(__name__)

Instances = Callable[[], Mapping[int, Instance]]


def parse_tokenizer_flags(values: Iterable[str | Path]) -> tuple[Path | None, dict[str, Path]]:
    """`--tokenizer` values -> (the folder for every model, {model: its own folder}).
    `MODEL=DIR` names one model; a bare `DIR` is for all the others (at most one)."""
    default: Path | None = None
    per_model: dict[str, Path] = {}
    for value in values:
        text = str(value)
        model, sep, folder = text.partition("=")
        if sep and model and folder:
            per_model[model] = Path(folder)
        elif sep:
            # "=DIR" or "MODEL=": a MODEL=DIR with a half missing, not a folder's name
            what = "a model name before" if not model else "a folder after"
            raise ValueError(f"{text!r}: MODEL=DIR needs {what} the '='")
        elif default is None:
            default = Path(text)
        else:
            raise ValueError(f"two tokenizer folders for every model: {default} and {text}")
    return default, per_model


async def fetch_from_engines(
    instances: Instances,
    model: str | None = None,
    retry_interval: float = 1.0,
    tls: EngineTls | None = None,
) -> TokenizerBundle:
    """Try each known engine (of `model`, when given) until one hands over a tokenizer that
    loads."""
    while True:
        for inst in list(instances().values()):
            if model is not None and inst.model != model:
                continue
            client = client_for(inst.protocol, inst.url, inst.instance_id, tls)
            try:
                data = await client.fetch_tokenizer()
                # Loaded, the bundle holds everything in memory: the unpacked files go at once
                # (a process killed meanwhile leaves them to the next start's sweep).
                with scratch.folder("switchyard-tokenizer-") as dest:
                    bundle = await asyncio.to_thread(TokenizerBundle.from_zip_bytes, data, dest)
                log.info(
                    "tokenizer of model %r fetched from %s (%d bytes), unpacked in %s "
                    "(removed once loaded)",
                    inst.model,
                    inst.url,
                    len(data),
                    dest,
                )
                return bundle
            except (EngineError, TokenizerLoadError) as exc:
                log.warning("tokenizer fetch from %s failed: %s", inst.url, exc)
            finally:
                await client.close()
        await asyncio.sleep(retry_interval)


class ModelTokenizers:
    def __init__(
        self,
        instances: Instances,
        default_dir: Path | None = None,
        per_model: Mapping[str, Path] | None = None,
        retry_interval: float = 1.0,
        tls: EngineTls | None = None,
    ) -> None:
        self._instances = instances
        self._tls = tls
        self._default_dir = default_dir
        self._per_model = dict(per_model or {})
        self._retry_interval = retry_interval
        self._bundles: dict[str, TokenizerBundle] = {}
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._from_dir: dict[Path, asyncio.Task[TokenizerBundle]] = {}

    def get(self, model: str) -> TokenizerBundle | None:
        return self._bundles.get(model)

    def loaded(self) -> set[str]:
        return set(self._bundles)

    def sync(self, models: Iterable[str]) -> None:
        """Start loading the tokenizer of every model not loaded or loading yet; stop
        fetching for models that are gone (a loaded tokenizer is kept for their return)."""
        wanted = set(models)
        for model, task in list(self._loading.items()):
            if model not in wanted:
                task.cancel()
                del self._loading[model]
        for model in wanted - self._bundles.keys() - self._loading.keys():
            task = asyncio.create_task(self._load(model), name=f"tokenizer:{model}")
            self._loading[model] = task
            task.add_done_callback(functools.partial(self._loaded, model))

    def _loaded(self, model: str, _task: asyncio.Task[None]) -> None:
        self._loading.pop(model, None)

    async def _load(self, model: str) -> None:
        folder = self._per_model.get(model, self._default_dir)
        if folder is None:
            bundle = await fetch_from_engines(
                self._instances, model, self._retry_interval, self._tls
            )
        else:
            try:
                bundle = await self._load_dir(folder)
            except TokenizerLoadError as exc:  # the operator's folder: it will not heal
                log.error("tokenizer of model %r not loaded: %s", model, exc)
                return
            log.info("tokenizer of model %r loaded from %s", model, folder)
        self._bundles[model] = bundle
        # The tokenizer lives as long as the process: out of full collections (freeze only,
        # a collection would hold the serving loop).
        heap.settle(collect=False)

    async def _load_dir(self, folder: Path) -> TokenizerBundle:
        task = self._from_dir.get(folder)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.ensure_future(asyncio.to_thread(TokenizerBundle.from_dir, folder))
            self._from_dir[folder] = task
        # shield: a model leaving must not cancel a load other models share
        return await asyncio.shield(task)

    async def close(self) -> None:
        tasks = list(self._loading.values()) + list(self._from_dir.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loading.clear()
