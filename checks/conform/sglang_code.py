"""SGLang 0.5.23's own code, loaded from its unpacked wheel for the `sglang-0.5.23` oracle (issue 32).

Nothing here restates an SGLang rule: every decision the oracle compares comes from the wheel's files, run as they
are. What cannot be imported on a CPU machine is loaded *by definition*: `load_definitions` parses an SGLang file and
compiles the named functions or classes from its own source (line numbers kept, so a traceback points into SGLang's
file), into a namespace that supplies what their bodies use. Why not a plain import: the cache controllers
(`managers/cache_controller.py`, `mem_cache/hybrid_cache/hybrid_cache_controller.py`) import `layers.dp_attention`,
which imports triton, and `sglang.srt.utils` (zmq, starlette, pydantic, orjson, pybase64, msgspec, psutil) — the
whole server; the package `__init__`s import it too. The methods the oracle runs use none of that.

What runs from the wheel (`SGLANG_CODE` lists it, the report prints it):
* imported: `mem_cache/hicache_storage.py` (PoolName, PoolTransfer, PoolHitPolicy, PoolTransferResult,
  HiCacheStorageExtraInfo), `mem_cache/storage/mooncake_store/mooncake_store.py` (`MooncakeStore`: key building,
  `batch_set_v1`, `batch_set_v2`, `batch_exists_v2`), `mem_cache/cpp_utils/native_hash.py`;
* SGLang's page hash, `mem_cache/cpp_utils/hash_binding.cpp`, compiled from the wheel by `build_native_hash` (g++,
  OpenSSL's libcrypto, pybind11 from torch's headers: what SGLang's own JIT build uses) — `make sglang-src`;
* by definition: `mem_cache/utils.py` (get_hash_str, storage_namespace_seed, get_storage_hash_str),
  `mem_cache/radix_cache.py` (RadixKey), `managers/cache_controller.py` (HiCacheController._page_backup,
  _page_set_zero_copy), `mem_cache/hybrid_cache/hybrid_cache_controller.py` (_trailing_chain_groups,
  HybridCacheController._page_backup_with_stable_layout, should_backup, _storage_hit_query,
  _sync_prefetch_hit_query, _resolve_sidecar_* ), `mem_cache/unified_cache/components/mamba.py`
  (MambaComponent.build_hicache_transfers).

The shims (`SHIMS`) replace no decision: empty packages for the `__init__`s, stub modules for imports the loaded code
never calls, the store client (a dict of keys per rank), the host pools (buffer addresses), the collective (a barrier
that MIN-reduces the ranks' tensors in place, as gloo's all_reduce does) and the wheel's JIT build of the hash.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import threading
import types
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

from kvspec.spec.errors import SpecError

HASH_MODULE = "hicache_hash_cpp"
PACKAGES = ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.storage",
            "sglang.srt.mem_cache.storage.mooncake_store", "sglang.srt.mem_cache.cpp_utils")
SGLANG_CODE = (
    "imported: mem_cache/hicache_storage.py; mem_cache/storage/mooncake_store/mooncake_store.py (MooncakeStore); "
    "mem_cache/cpp_utils/native_hash.py",
    "compiled from the wheel: mem_cache/cpp_utils/hash_binding.cpp (the page hash)",
    "by definition: mem_cache/utils.py get_hash_str, storage_namespace_seed, get_storage_hash_str",
    "by definition: mem_cache/radix_cache.py RadixKey",
    "by definition: managers/cache_controller.py HiCacheController._page_backup, _page_set_zero_copy, backup_skip",
    "by definition: mem_cache/hybrid_cache/hybrid_cache_controller.py _trailing_chain_groups, HybridCacheController."
    "_page_backup_with_stable_layout, should_backup, _storage_hit_query, _sync_prefetch_hit_query, "
    "_resolve_sidecar_kv_derived_pool_transfers, _resolve_sidecar_nonkv_derived_pool_transfers",
    "by definition: mem_cache/unified_cache/components/mamba.py MambaComponent.build_hicache_transfers",
)
SHIMS = (
    "empty packages instead of the sglang package __init__s (they import the whole server)",
    "stub modules for imports the loaded code never calls: sglang.srt.environ, hybrid_cache.linker_pool_assembler, "
    "pool_host, pool_host.mla, observability.metrics_collector, distributed.parallel_state (no shared transfer engine)",
    "the Mooncake client: one key set per rank (batch_is_exist, batch_put_from, batch_get_into answer from it); "
    "MooncakeStore's connection, config file and warm-up (its __init__ runs otherwise)",
    "the host pools: page_size and a buffer address per object (get_page_buffer_meta)",
    "the collective: torch.distributed.all_reduce(MIN) over the ranks' threads, a barrier reducing in place",
    "native_hash._load_native_hash_module returns the module built from the wheel's hash_binding.cpp (SGLang "
    "JIT-builds the same file with torch's cpp_extension)",
    "the radix tree's node shapes (where a writer's nodes end, which carries a Mamba value) and the prefetch's token "
    "range: kvspec's statement (spec/store.py, _compute_max_prefix_len), not driven from the tree",
)


def load_definitions(root: str, relpath: str, names: tuple[str, ...], namespace: dict[str, Any],
                     cls: str | None = None, bases: tuple[type, ...] = ()) -> dict[str, Any]:
    """Return the named top-level definitions of an SGLang file compiled from its source into `namespace` (with cls:
    a class of that name holding only those methods of SGLang's class `cls`, on `bases`)."""
    path = Path(root, "sglang", "srt", relpath)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    body = tree.body
    if cls is not None:
        body = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    found = {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names}
    missing = [n for n in names if n not in found]
    if missing:
        raise SpecError("sglang-code", f"{relpath} has no {', '.join(missing)} (is this SGLang 0.5.23's wheel?)")
    defs: list[ast.stmt] = [found[n] for n in names]
    if cls is not None:
        namespace["__kvspec_bases__"] = bases
        star = ast.Starred(value=ast.Name(id="__kvspec_bases__", ctx=ast.Load()), ctx=ast.Load())
        extra: dict[str, Any] = {"type_params": []} if sys.version_info >= (3, 12) else {}
        defs = [ast.copy_location(ast.ClassDef(name=cls, bases=[star], keywords=[], body=defs, decorator_list=[],
                                               **extra), defs[0])]
    module = ast.fix_missing_locations(ast.Module(body=defs, type_ignores=[]))
    exec(compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True),
         namespace)
    return {cls: namespace[cls]} if cls is not None else {n: namespace[n] for n in names}


def find_native_hash(root: str) -> Path | None:
    """Return the page-hash module built from the wheel's hash_binding.cpp (None: not built)."""
    path = Path(root, HASH_MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    return path if path.is_file() else None


def build_native_hash(root: str) -> Path:
    """Return the page-hash module compiled from the wheel's hash_binding.cpp (built once, next to the wheel)."""
    out = Path(root, HASH_MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    src = Path(root, "sglang", "srt", "mem_cache", "cpp_utils", "hash_binding.cpp")
    import torch.utils.cpp_extension as cpp  # pybind11's headers, as SGLang's JIT build finds them
    includes = [sysconfig.get_paths()["include"], *cpp.include_paths()]
    with open("/proc/cpuinfo", encoding="utf-8", errors="ignore") as f:  # SGLang adds -mavx2 where the CPU has it
        avx2 = ["-mavx2"] if "avx2" in f.read().lower() else []
    cmd = ["g++", "-O3", "-std=c++17", "-DNDEBUG", *avx2, "-shared", "-fPIC", f"-DTORCH_EXTENSION_NAME={HASH_MODULE}",
           "-Wno-deprecated-declarations", *(f"-I{p}" for p in includes), str(src), "-lcrypto", "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


class Collective:
    """D ranks' threads meeting at torch.distributed.all_reduce(MIN): each hands in its tensor, all get the minimum."""

    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks)
        self.slots: list[Any] = [None] * ranks

    def all_reduce(self, rank: int, tensor: Any, op: Any) -> None:
        """Reduce `tensor` in place to the element-wise minimum over every rank's tensor (MIN only)."""
        import torch
        if op != torch.distributed.ReduceOp.MIN:
            raise SpecError("sglang-code", f"the oracle's collective reduces by MIN only, SGLang asked {op}")
        self.slots[rank] = tensor.clone()
        self.barrier.wait()  # every rank's tensor is in
        low = torch.stack(self.slots).min(dim=0).values
        self.barrier.wait()  # every rank has read them all
        tensor.copy_(low)


def run_ranks(ranks: int, body: Any) -> list[Any]:
    """Return body(rank, collective) for every rank, each rank in its own thread (an exception is re-raised)."""
    coll = Collective(ranks)
    out: list[Any] = [None] * ranks
    errors: list[BaseException] = []

    def one(r: int) -> None:
        try:
            out[r] = body(r, coll)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
            coll.barrier.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def load_sglang(root: str) -> types.SimpleNamespace:
    """Return SGLang's code the oracle drives (see the module docstring), loaded from the unpacked wheel at `root`."""
    if not Path(root, "sglang").is_dir():
        raise SpecError("sglang-code", f"no unpacked sglang 0.5.23 wheel at {root}: make sglang-src")
    built = find_native_hash(root)
    if built is None:
        raise SpecError("sglang-code", f"SGLang's hash_binding.cpp is not built under {root}: make sglang-src "
                                       "(python -m kvspec.checks.conform.sglang_code --build ROOT)")
    for name in PACKAGES:  # empty packages: the real __init__s import the whole server
        mod = types.ModuleType(name)
        mod.__path__ = [str(Path(root, *name.split(".")))]
        sys.modules[name] = mod

    def stub(name: str, **attrs: Any) -> None:
        mod = types.ModuleType(name)
        mod.__path__ = []
        mod.__dict__.update(attrs)
        sys.modules[name] = mod

    class _Env:
        def __getattr__(self, key: str) -> Any:
            return types.SimpleNamespace(is_set=lambda: False, get=lambda: None, default=None, name=key)

    stub("sglang.srt.environ", envs=_Env())
    stub("sglang.srt.mem_cache.hybrid_cache")
    stub("sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler", DevicePoolEntry=type("DevicePoolEntry", (), {}))
    stub("sglang.srt.mem_cache.pool_host", HostKVCache=type("HostKVCache", (), {}),
         HostTensorAllocator=type("HostTensorAllocator", (), {}))
    stub("sglang.srt.mem_cache.pool_host.mla", MLATokenToKVPoolHost=type("MLATokenToKVPoolHost", (), {}))
    stub("sglang.srt.distributed")  # MooncakeStore.__init__ asks for a shared transfer engine: none here
    stub("sglang.srt.distributed.parallel_state", get_mooncake_transfer_engine=lambda: None)
    stub("sglang.srt.observability")
    stub("sglang.srt.observability.metrics_collector", StorageMetrics=type("StorageMetrics", (), {}))
    hs = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    ms = importlib.import_module("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store")
    nh = importlib.import_module("sglang.srt.mem_cache.cpp_utils.native_hash")
    native = _load_native(built)
    setattr(nh, "_load_native_hash_module", lambda: native)  # noqa: B010 - the wheel's JIT build, replaced
    import torch

    ns: dict[str, Any] = {"hashlib": importlib.import_module("hashlib"), "get_native_hash": nh.get_native_hash,
                          "Any": Any, "Optional": Any, "List": list}
    code = types.SimpleNamespace(hs=hs, ms=ms, native_hash=nh, torch=torch)
    code.__dict__.update(load_definitions(root, "mem_cache/utils.py",
                                          ("get_hash_str", "storage_namespace_seed", "get_storage_hash_str"), ns))
    rk = {"array": array, "Iterator": Iterator, "Tuple": tuple, "Union": Union, "Optional": Any, "torch": torch}
    code.RadixKey = load_definitions(root, "mem_cache/radix_cache.py", ("RadixKey",), rk)["RadixKey"]
    base_ns = {"HiCacheStorageExtraInfo": hs.HiCacheStorageExtraInfo, "STORAGE_BATCH_SIZE": hs.STORAGE_BATCH_SIZE,
               "logger": _Logger(), "List": list, "Optional": Any}
    base = load_definitions(root, "managers/cache_controller.py", ("_page_backup", "_page_set_zero_copy", "backup_skip"),
                            base_ns, cls="HiCacheController")["HiCacheController"]
    hy_ns = {"torch": torch, "PoolHitPolicy": hs.PoolHitPolicy, "PoolName": hs.PoolName,
             "PoolTransferResult": hs.PoolTransferResult, "HiCacheStorageExtraInfo": hs.HiCacheStorageExtraInfo,
             "get_storage_hash_str": code.get_storage_hash_str, "_NO_POOL_VERDICT": -1, "List": list,
             "Optional": Any, "MHATokenToKVPoolHost": type("MHATokenToKVPoolHost", (), {}),
             "count_pool_hits": hs.count_pool_hits}
    code.trailing_chain_groups = load_definitions(root, "mem_cache/hybrid_cache/hybrid_cache_controller.py",
                                                  ("_trailing_chain_groups",), hy_ns)["_trailing_chain_groups"]
    hy_ns["_trailing_chain_groups"] = code.trailing_chain_groups
    code.Controller = load_definitions(
        root, "mem_cache/hybrid_cache/hybrid_cache_controller.py",
        ("_page_backup_with_stable_layout", "should_backup", "_storage_hit_query", "_sync_prefetch_hit_query",
         "_resolve_sidecar_kv_derived_pool_transfers", "_resolve_sidecar_nonkv_derived_pool_transfers"),
        hy_ns, cls="HybridCacheController", bases=(base,))["HybridCacheController"]
    mamba_ns = {"PoolTransfer": hs.PoolTransfer, "PoolName": hs.PoolName, "PoolHitPolicy": hs.PoolHitPolicy,
                "CacheTransferPhase": _Phase, "Optional": Any, "Sequence": Any, "UnifiedTreeNode": Any}
    code.MambaComponent = load_definitions(root, "mem_cache/unified_cache/components/mamba.py",
                                           ("build_hicache_transfers",), mamba_ns,
                                           cls="MambaComponent")["MambaComponent"]
    code.Phase = _Phase
    return code


_NATIVE: dict[Path, types.ModuleType] = {}


def _load_native(path: Path) -> types.ModuleType:
    """Return the built page-hash module (loaded once per process: an extension module is not re-initialised)."""
    if path not in _NATIVE:
        spec = importlib.util.spec_from_file_location(HASH_MODULE, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _NATIVE[path] = module
    return _NATIVE[path]


class _Phase:
    """The transfer phases' names (SGLang's CacheTransferPhase enum lives in a module importing the tree core)."""

    BACKUP_HOST = "backup_host"
    LOAD_BACK = "load_back"
    BACKUP_STORAGE = "backup_storage"
    PREFETCH = "prefetch"


class _Logger:
    """Collects what SGLang's code would log (a failed write is a warning there, a finding here)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args if args else msg)

    exception = info = debug = warning


def main(argv: list[str] | None = None) -> int:
    """Build SGLang's page hash from the unpacked wheel at ROOT (make sglang-src)."""
    p = argparse.ArgumentParser(prog="python -m kvspec.checks.conform.sglang_code")
    p.add_argument("--build", metavar="ROOT", required=True, help="the unpacked sglang==0.5.23 wheel")
    args = p.parse_args(argv)
    print(build_native_hash(os.fspath(args.build)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
