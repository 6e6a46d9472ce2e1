# The C extension's interface (services/preprocessor/_pretokens.c), for mypy.

def deepseek_v3(
    plain: bytes, cache: dict[str, list[int]], text: str, /
) -> list[int] | tuple[str, ...] | None: ...
