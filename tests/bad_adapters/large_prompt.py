"""A large-prompt-only bug: the lookup probes only the first 2^17 tokens (a fixed-size probe buffer)."""

from tests.bad_adapters import Injected

RULES = "vllm-0.33.0"
LIMIT = 1 << 17
ADAPTER = Injected(name="lookup-capped-at-128k", when=lambda g, n: n > LIMIT, lookup_prompt=lambda n: min(n, LIMIT))


def WHERE(sc):
    return sc.prompt > LIMIT
