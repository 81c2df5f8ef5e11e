"""The hash chain over u-token units and the store-key grammar (injective, round-tripping).

Grammar (fields joined by '@', string fields escaped so they never contain '@'):

    [ESC(cache_prefix)@]ESC(model)@tp_rank:T@pcp P@dcp D@pp_rank:R@group:G@HEX

``ESC`` replaces '%' by '%25' and '@' by '%40' and nothing else; an empty cache prefix is
absent (so the unprefixed form is byte-identical to vLLM's).  Distinct field tuples render
to distinct strings because the '@' count fixes the field positions and ESC is injective;
``parse`` accepts exactly the canonical renderings, so parse(render(k)) == k and
render(parse(s)) == s.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import attrs

from .errors import SpecError, require
from .types import Boundary

RULE_KEY = "key-grammar"
_HEX = re.compile(r"[0-9a-f]+")
_DEC = re.compile(r"0|[1-9][0-9]*")


def compute_seed_hash(seed: int = 0) -> bytes:
    """Return H_0, the seeded root of every hash chain."""
    return hashlib.sha256(b"kvspec-root:" + str(seed).encode()).digest()


def compute_unit_hash(parent: bytes, tokens: Sequence[int], extra: Sequence[str] = ()) -> bytes:
    """Return H_k = sha256(H_{k-1}, the unit's tokens, its extra keys)."""
    h = hashlib.sha256(parent)
    h.update(b"T" + ",".join(map(str, map(int, tokens))).encode())
    for e in extra:
        h.update(b"X" + e.encode("utf-8", "surrogatepass") + b"\x00")
    return h.digest()


def compute_hash_chain(tokens: Sequence[int], unit: int, seed: int = 0,
                       extra_keys: Sequence[str] = ()) -> tuple[bytes, ...]:
    """Return (H_u, H_2u, ...) for the full units of tokens; extra keys (e.g. a cache salt) enter unit 1 only."""
    require(unit >= 1, "unit-positive", f"unit must be >= 1, got {unit}")
    out: list[bytes] = []
    parent = compute_seed_hash(seed)
    for k in range(len(tokens) // unit):
        parent = compute_unit_hash(parent, tokens[k * unit:(k + 1) * unit], extra_keys if k == 0 else ())
        out.append(parent)
    return tuple(out)


def compute_lookahead_chain(tokens: Sequence[int], unit: int, lookahead: int, seed: int = 0,
                            extra_keys: Sequence[str] = ()) -> tuple[bytes, ...]:
    """Return (H'_u, H'_2u, ...): H'_t = the unit hash of H_t over the λ tokens after t (it names [0, t + λ)), for every
    t with t + λ <= len(tokens); λ = 0 gives compute_hash_chain."""
    chain = compute_hash_chain(tokens, unit, seed, extra_keys)
    if lookahead == 0:
        return chain
    # the "lookahead" extra key separates H'_t from a legacy hash H_{t+λ} when λ = u (same parent, same tokens)
    return tuple(compute_unit_hash(h, tokens[(k + 1) * unit:(k + 1) * unit + lookahead], ("lookahead",))
                 for k, h in enumerate(chain) if (k + 1) * unit + lookahead <= len(tokens))


def compute_hash_at(chain: Sequence[bytes], unit: int, boundary: Boundary) -> bytes:
    """Return H_t = chain[t/u - 1], defined for t a positive multiple of u within the chain."""
    require(boundary > 0 and boundary % unit == 0 and boundary // unit <= len(chain), "hash-index",
            f"H_{boundary} is undefined (unit {unit}, {len(chain)} hashes)")
    return chain[boundary // unit - 1]


def _nonneg(inst: object, attribute: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, RULE_KEY,
            f"{attribute.name} must be a non-negative integer, got {value!r}")


def _text(inst: object, attribute: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    require(isinstance(value, str), RULE_KEY, f"{attribute.name} must be a string, got {value!r}")


def _hex(inst: object, attribute: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    require(isinstance(value, str) and _HEX.fullmatch(value) is not None, RULE_KEY,
            f"hash must be lowercase hex, got {value!r}")


@attrs.frozen(kw_only=True)
class StoreKey:
    """The namespace fields and the block hash that name one stored object."""

    model: str = attrs.field(validator=_text)
    tp_rank: int = attrs.field(validator=_nonneg)
    pcp_rank: int = attrs.field(validator=_nonneg)
    dcp_rank: int = attrs.field(validator=_nonneg)
    pp_rank: int = attrs.field(validator=_nonneg)
    group: int = attrs.field(validator=_nonneg)
    hash_hex: str = attrs.field(validator=_hex)
    cache_prefix: str = attrs.field(default="", validator=_text)


def _escape(s: str) -> str:
    return s.replace("%", "%25").replace("@", "%40")


def _unescape(s: str) -> str:
    require(re.fullmatch(r"(?:[^%]|%25|%40)*", s, flags=re.DOTALL) is not None, RULE_KEY,
            f"non-canonical escape in {s!r}")
    return re.sub(r"%(25|40)", lambda m: "%" if m.group(1) == "25" else "@", s)


def render_key(key: StoreKey) -> str:
    """Return the canonical string of a store key."""
    body = (f"{_escape(key.model)}@tp_rank:{key.tp_rank}@pcp{key.pcp_rank}@dcp{key.dcp_rank}"
            f"@pp_rank:{key.pp_rank}@group:{key.group}@{key.hash_hex}")
    return f"{_escape(key.cache_prefix)}@{body}" if key.cache_prefix else body


def _field(part: str, prefix: str) -> int:
    require(part.startswith(prefix) and _DEC.fullmatch(part[len(prefix):]) is not None, RULE_KEY,
            f"expected {prefix}<decimal>, got {part!r}")
    return int(part[len(prefix):])


def parse_key(text: str) -> StoreKey:
    """Return the StoreKey whose canonical rendering is text; raise SpecError otherwise."""
    require(isinstance(text, str), RULE_KEY, "a key is a string")
    parts = text.split("@")
    require(len(parts) in (7, 8), RULE_KEY, f"expected 7 or 8 '@'-separated fields, got {len(parts)}")
    prefix = ""
    if len(parts) == 8:
        prefix = _unescape(parts.pop(0))
        require(prefix != "", RULE_KEY, "an empty cache prefix is written as no prefix")
    try:
        return StoreKey(model=_unescape(parts[0]), tp_rank=_field(parts[1], "tp_rank:"),
                        pcp_rank=_field(parts[2], "pcp"), dcp_rank=_field(parts[3], "dcp"),
                        pp_rank=_field(parts[4], "pp_rank:"), group=_field(parts[5], "group:"),
                        hash_hex=parts[6], cache_prefix=prefix)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - pragma: no cover; any other failure is a grammar error
        raise SpecError(RULE_KEY, str(exc)) from None


def render_key_vllm(key: StoreKey) -> str:
    """Return the key as vLLM 0.33.0 writes it: the same fields joined by '@' with no escaping (not injective)."""
    body = (f"{key.model}@tp_rank:{key.tp_rank}@pcp{key.pcp_rank}@dcp{key.dcp_rank}"
            f"@pp_rank:{key.pp_rank}@group:{key.group}@{key.hash_hex}")
    return f"{key.cache_prefix}@{body}" if key.cache_prefix else body


# The named key grammars: kvspec's own (escaped, injective, parseable) and vLLM 0.33.0's (PoolKey / KeyMetadata).
# vLLM's is not injective: cache_prefix "a" with model "m" and cache_prefix "" with model "a@m" both render
# "a@m@tp_rank:…"; they coincide with kvspec's whenever no field contains '@' or '%'.
GRAMMAR_KVSPEC = "kvspec"
GRAMMAR_VLLM = "vllm-0.33.0"  # the key grammar vLLM's Mooncake connector writes (0.33.0 and 0.34.0 alike)
KEY_GRAMMARS = {GRAMMAR_KVSPEC: render_key, GRAMMAR_VLLM: render_key_vllm}


# ---------------------------------------------------------------- SGLang 0.5.23's page hashes and Mooncake keys

U32_MAX = (1 << 32) - 1
SGLANG_POOLS = ("mla-k", "mha-k", "mha-v", "mamba-temporal", "mamba-conv", "draft-mla-k", "draft-mha-k", "draft-mha-v")


def compute_sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """Return SHA-256("sglang-cache-namespace-v1" ‖ each part as 0x00 when absent, else 0x01 ‖ its UTF-8 length as 8
    little-endian bytes ‖ its bytes) in hex, or None when both are absent (an unseeded chain)."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
        else:
            data = part.encode("utf-8")
            digest.update(b"\x01" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def compute_sglang_page_hashes(tokens: Sequence[int], page: int, seed_hex: str | None = None,
                               bigram: bool = False) -> list[str]:
    """Return the hex page hashes of the whole pages: H_k = SHA-256(H_{k−1} (32 bytes; the seed's for k = 1, none when
    unseeded) ‖ page k's words), the words the page's tokens as little-endian u32 — with bigram keys the pairs
    (t_i, t_{i+1}) for i in the page (n tokens give n − 1 bigrams) — or, when a page holds a token above 2³² − 1,
    the byte 0xff ‖ the same values as little-endian u64."""
    require(page >= 1, RULE_KEY, f"page size must be >= 1, got {page}")
    n = max(len(tokens) - 1, 0) if bigram else len(tokens)
    prior = bytes.fromhex(seed_hex) if seed_hex else b""
    out = []
    for start in range(0, n // page * page, page):
        values = [v for i in range(start, start + page)
                  for v in ((tokens[i], tokens[i + 1]) if bigram else (tokens[i],))]
        require(all(0 <= v < 1 << 63 for v in values), RULE_KEY, "token ids must be non-negative int64")
        wide = any(v > U32_MAX for v in values)
        body = (b"\xff" + b"".join(v.to_bytes(8, "little") for v in values) if wide
                else b"".join(v.to_bytes(4, "little") for v in values))
        prior = hashlib.sha256(prior + body).digest()
        out.append(prior.hex())
    return out


@attrs.frozen(kw_only=True)
class SglangKey:
    """The fields of one SGLang 0.5.23 Mooncake object: the store's prefix parts, the rank fields, the pool, the page."""

    page_hash: str = attrs.field(validator=_hex)
    pool: str = attrs.field(validator=attrs.validators.in_(SGLANG_POOLS))
    tag: str | None = None  # extra_backend_tag
    model: str | None = None  # model_name ('/' becomes '-')
    tp_size: int = 1
    tp_rank: int = 0  # the local (attention TP) rank: Mamba and MHA objects are keyed by it
    dcp_size: int = 1
    dcp_rank: int = 0
    cp_size: int = 1
    cp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    page: int = 1  # logical page size (in the prefix under DCP)
    conv: int = 0  # which conv buffer (pool "mamba-conv")


# str(PoolName.DRAFT): SGLang's `class PoolName(str, Enum)` defines __str__ as its value, so the f-string in
# _get_hybrid_page_component_keys writes "draft" (checked on SGLang's own code: tests/test_sglang.py)
SGLANG_DRAFT_NAME = "draft"


def render_key_sglang(key: SglangKey) -> str:
    """Return the key as SGLang 0.5.23's MooncakeStore writes it:
    [tag_][model_][tp{T}_dcp{D}_page{P}_pp{PP}_cp{CP}_]HASH_SUFFIX (the topology part only under DCP), the suffix
    per pool from mla = "" | "{pp}" (PP) | "dcp{r}_cp{c}[_{pp}]" (DCP) and mha = "{tp}[_{pp}]": "_{mla}_k",
    "_{mha}_k" / "_{mha}_v", "_{mha}_temporal", "_{mha}_conv_{i}", draft "_{mla}_{DRAFT}_k" or "_{mha}_{DRAFT}_k/_v".
    Not injective: there is no escaping ('_' separates fields and may occur inside the tag and the model name)."""
    parts = [p for p in (key.tag, None if key.model is None else "-".join(key.model.split("/"))) if p is not None]
    if key.dcp_size > 1:
        parts.append(f"tp{key.tp_size}_dcp{key.dcp_size}_page{key.page}_pp{key.pp_size}_cp{key.cp_size}")
    pp = f"_{key.pp_rank}" if key.pp_size > 1 else ""
    mla = f"dcp{key.dcp_rank}_cp{key.cp_rank}{pp}" if key.dcp_size > 1 else pp[1:]
    mha = f"{key.tp_rank}{pp}"
    suffix = {"mla-k": f"_{mla}_k", "mha-k": f"_{mha}_k", "mha-v": f"_{mha}_v", "mamba-temporal": f"_{mha}_temporal",
              "mamba-conv": f"_{mha}_conv_{key.conv}", "draft-mla-k": f"_{mla}_{SGLANG_DRAFT_NAME}_k",
              "draft-mha-k": f"_{mha}_{SGLANG_DRAFT_NAME}_k", "draft-mha-v": f"_{mha}_{SGLANG_DRAFT_NAME}_v"}[key.pool]
    body = f"{key.page_hash}{suffix}"
    return f"{'_'.join(parts)}_{body}" if parts else body
