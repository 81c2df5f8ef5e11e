"""`--from-vllm FILE`: a vLLM 0.33.0 engine configuration (JSON) mapped to a kvspec geometry.

The file holds vLLM engine arguments, flat (``{"block_size": 64, "decode_context_parallel_size": 8}``)
or as the config objects' sections (``cache_config``, ``parallel_config``, ``speculative_config``,
``kv_transfer_config``, as ``VllmConfig`` prints them). vLLM learns the model's KV-cache groups from
the model itself, so the file names them in ``kv_cache_groups`` (a list of ``{"kind": ...}``, with an
optional ``block_size`` and ``eagle``), or the command line does with ``--group KIND``.

How each setting becomes a geometry field (kvspec's words for what vLLM 0.33.0 does):

| vLLM setting | kvspec |
| --- | --- |
| ``block_size`` | per-rank block of every attention group |
| ``mamba_block_size`` (unset: ``block_size`` when prefix caching is on) | block of every Mamba group |
| ``decode_context_parallel_size``, ``prefill_context_parallel_size`` | D, PCP |
| ``cp_kv_cache_interleave_size`` (or the older ``dcp_kv_cache_interleave_size`` when > 1) | interleave I |
| ``prefix_match_unit`` (unset: the gcd of the groups' spans; one group: its span) | u |
| ``prefix_cache_retention_interval``: 0 / ``null`` | retention replay / dense |
| ``speculative_config.method`` eagle, eagle3 or mtp (not ``disable_eagle_block_drop``) | EAGLE on the 1st attention group |

Refused, each with the rule it breaks: prefix caching off (nothing is hashed, so nothing matches), a
connector other than ``MooncakeStoreConnector``, a periodic retention interval (kvspec models 0 and
``null`` only), an interleave that does not divide the block (vLLM's block-size validation), and every
refusal of ``resolve_kv_cache_block_sizes`` (a unit that does not divide a group's span; one group with a
unit other than its span).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from kvspec.spec.errors import SpecError, require
from kvspec.spec.geometry import Geometry, Group, Parallel, resolve_kind
from kvspec.spec.rules import VLLM_0_33, check_config, check_single_group_unit, get_rules

RULE_VLLM_CONFIG = "vllm-config"
SECTIONS = ("cache_config", "parallel_config", "speculative_config", "kv_transfer_config", "scheduler_config")
EAGLE_DROP_METHODS = ("eagle", "eagle3", "mtp")  # drafters whose KV at p depends on token p + 1
MOONCAKE_CONNECTORS = ("MooncakeStoreConnector",)


@attrs.frozen(kw_only=True)
class GroupKind:
    """A KV-cache group as the model declares it: kind, and a block size or EAGLE flag when the file gives them."""

    kind: str = attrs.field(converter=resolve_kind)
    block_size: int | None = None
    eagle: bool | None = None


@attrs.frozen(kw_only=True)
class Mapped:
    """The geometry a vLLM configuration maps to, and where each field came from."""

    geometry: Geometry
    provenance: tuple[tuple[str, str], ...]  # (geometry field, the vLLM setting or default it came from)


def _flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the settings of a flat or sectioned configuration as one mapping (a section's keys win)."""
    out = {k: v for k, v in config.items() if k not in SECTIONS}
    for sec in ("cache_config", "parallel_config", "scheduler_config"):
        part = config.get(sec)
        if part is not None:
            require(isinstance(part, Mapping), RULE_VLLM_CONFIG, f"{sec} must be an object, got {part!r}")
            out.update(part)
    for sec in ("speculative_config", "kv_transfer_config"):
        if sec in config:
            out[sec] = config[sec]
    return out


def _int(settings: Mapping[str, Any], name: str, default: int | None) -> int | None:
    v = settings.get(name, default)
    require(v is None or (isinstance(v, int) and not isinstance(v, bool)), RULE_VLLM_CONFIG,
            f"{name} must be an integer or null, got {v!r}")
    return v  # type: ignore[no-any-return]


def read_group_kinds(config: Mapping[str, Any]) -> tuple[GroupKind, ...]:
    """Return the ``kv_cache_groups`` the file declares (empty when it declares none)."""
    raw = config.get("kv_cache_groups", [])
    require(isinstance(raw, list), RULE_VLLM_CONFIG, f"kv_cache_groups must be a list, got {raw!r}")
    out = []
    for entry in raw:
        item: Any = {"kind": entry} if isinstance(entry, str) else entry
        require(isinstance(item, Mapping) and isinstance(item.get("kind"), str), RULE_VLLM_CONFIG,
                f"each kv_cache_groups entry is a kind or {{\"kind\": ..., \"block_size\"?, \"eagle\"?}}, got {item!r}")
        eagle = item.get("eagle")
        require(eagle is None or isinstance(eagle, bool), RULE_VLLM_CONFIG, f"eagle must be a bool, got {eagle!r}")
        out.append(GroupKind(kind=item["kind"], block_size=_int(item, "block_size", None), eagle=eagle))
    return tuple(out)


def _uses_eagle_drop(spec: Any) -> tuple[bool, str]:
    if spec is None:
        return False, "no speculative_config"
    require(isinstance(spec, Mapping), RULE_VLLM_CONFIG, f"speculative_config must be an object, got {spec!r}")
    method = spec.get("method")
    if spec.get("disable_eagle_block_drop"):
        return False, f"speculative_config.method={method!r} with disable_eagle_block_drop"
    return method in EAGLE_DROP_METHODS, f"speculative_config.method={method!r}"


def _check_connector(kv: Any) -> str:
    if kv is None:
        return "no kv_transfer_config (the Mooncake store connector assumed)"
    require(isinstance(kv, Mapping), RULE_VLLM_CONFIG, f"kv_transfer_config must be an object, got {kv!r}")
    name = kv.get("kv_connector")
    names = [c.get("kv_connector") for c in kv.get("kv_connector_extra_config", {}).get("connectors", [])
             if isinstance(c, Mapping)] if name == "MultiConnector" else [name]
    require(any(n in MOONCAKE_CONNECTORS for n in names), RULE_VLLM_CONFIG,
            f"kv_connector {name!r} is not the Mooncake store connector kvspec models "
            f"({', '.join(MOONCAKE_CONNECTORS)}, alone or inside a MultiConnector)")
    return f"kv_connector={name!r}"


def compute_geometry_from_vllm(config: Mapping[str, Any], kinds: tuple[GroupKind, ...] = ()) -> Mapped:
    """Return the geometry vLLM 0.33.0 runs for a configuration; raise SpecError with the rule (and vLLM's reason)."""
    require(isinstance(config, Mapping), RULE_VLLM_CONFIG, "the vLLM configuration must be a JSON object")
    s = _flatten(config)
    kinds = kinds or read_group_kinds(config)
    require(bool(kinds), RULE_VLLM_CONFIG, "the configuration does not say the model's KV-cache groups: add "
            "\"kv_cache_groups\": [\"attention\", \"mamba\"] to the file or give --group KIND for each group")
    require(s.get("enable_prefix_caching", True) is True, RULE_VLLM_CONFIG,
            "enable_prefix_caching is off: vLLM hashes no blocks and sets mamba_cache_mode to 'none', so nothing "
            "stored can be matched")
    prov = [("store path", _check_connector(s.get("kv_transfer_config")))]
    block = _int(s, "block_size", 16)
    assert block is not None
    mamba_block = _int(s, "mamba_block_size", None)
    dcp = _int(s, "decode_context_parallel_size", 1) or 1
    pcp = _int(s, "prefill_context_parallel_size", 1) or 1
    interleave = _int(s, "cp_kv_cache_interleave_size", 1) or 1
    old = _int(s, "dcp_kv_cache_interleave_size", 1) or 1
    if old > 1:  # vLLM lets the deprecated name override the new one
        interleave = old
    prov += [("block (attention)", f"block_size={block}"),
             ("block (mamba)", f"mamba_block_size={mamba_block}" if mamba_block else f"block_size={block} (default)"),
             ("dcp", f"decode_context_parallel_size={dcp}"), ("pcp", f"prefill_context_parallel_size={pcp}"),
             ("interleave", f"cp_kv_cache_interleave_size={interleave}")]
    if dcp > 1:
        require(interleave <= block and block % interleave == 0, RULE_VLLM_CONFIG,
                f"vLLM refuses block_size={block} with cp_kv_cache_interleave_size={interleave}: the block size must "
                f"be at least the interleave and divisible by it (VllmConfig.validate_block_size)")
    interval = s.get("prefix_cache_retention_interval", 0)
    require(interval in (0, None), RULE_VLLM_CONFIG,
            f"prefix_cache_retention_interval={interval!r}: kvspec models 0 (replay checkpoints) and null (dense); "
            "a periodic interval is not modelled")
    retention = "replay" if interval == 0 else "dense"
    prov.append(("retention", f"prefix_cache_retention_interval={interval!r}"))
    eagle, why = _uses_eagle_drop(s.get("speculative_config"))
    groups, marked = [], False
    for k in kinds:
        size = k.block_size if k.block_size is not None else (block if k.kind == "attention" else (mamba_block or block))
        flag = bool(k.eagle) if k.eagle is not None else (eagle and k.kind == "attention" and not marked)
        marked |= flag
        groups.append(Group(kind=k.kind, block_size=size, eagle=flag))
    prov.append(("eagle", f"{why}: EAGLE drop {'on' if marked else 'off'}"))
    spans = [g.block_size * (dcp if g.kind == "attention" else 1) for g in groups]
    unit = _int(s, "prefix_match_unit", None)
    if unit is None:
        unit = spans[0] if len(groups) == 1 else math.gcd(*spans)
        prov.append(("unit", f"prefix_match_unit unset: {'the span' if len(groups) == 1 else 'gcd of the spans'} "
                             f"{unit}"))
    else:
        prov.append(("unit", f"prefix_match_unit={unit}"))
    require(unit >= 1 and all(sp % unit == 0 for sp in spans), RULE_VLLM_CONFIG,
            f"vLLM refuses prefix_match_unit={unit}: every KV-cache group's block size ({spans} tokens, attention "
            f"scaled by DCP) must be divisible by it (resolve_kv_cache_block_sizes)")
    if len(groups) == 1:
        check_single_group_unit(unit, spans[0])
    geometry = Geometry(unit=unit, groups=tuple(groups), parallel=Parallel(dcp=dcp, interleave=interleave, pcp=pcp),
                        retention=retention)
    check_config(get_rules(VLLM_0_33), geometry)
    return Mapped(geometry=geometry, provenance=tuple(prov))


def format_provenance(provenance: tuple[tuple[str, str], ...]) -> str:
    """Return the mapping, one line per geometry field."""
    return "\n".join(f"  {what:<18} <- {src}" for what, src in provenance)


def parse_group_kind(text: str) -> GroupKind:
    """Return a --group KIND[:BLOCK][:eagle] given with --from-vllm (the block defaults to the configuration's)."""
    parts = text.split(":")
    eagle = parts[-1] == "eagle" and len(parts) > 1
    if eagle:
        parts = parts[:-1]
    if len(parts) not in (1, 2) or (len(parts) == 2 and not parts[1].isdigit()):
        raise SpecError("group-syntax", f"with --from-vllm, --group takes KIND[:BLOCK][:eagle], got {text!r}")
    return GroupKind(kind=parts[0], block_size=int(parts[1]) if len(parts) == 2 else None,
                     eagle=True if eagle else None)
