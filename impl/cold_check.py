"""The byte check of a load: what a rank loaded against a cold prefill of the same tokens on the same rank.

The harness's check, not the connector's: a rank engine (impl/engine.py) stores, looks up and loads; this module
recomputes the reader's own KV and Mamba state and counts the bytes that differ. `RankPipeline.load_and_check`
(impl/pipeline.py) and the stateful tests call it after the failure closure has chosen the safe boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .engine import RankEngine, RequestKV


def compare_with_cold(engine: RankEngine, tokens: Sequence[int], hit: int, loaded: RequestKV,
                      plan: Sequence[Sequence[int]], ok: Sequence[bool],
                      mamba: bool = True) -> tuple[int, int, int]:
    """Return (bytes compared, bytes wrong, draft-lookahead bytes wrong) of [0, hit) of the rank's loaded cache against
    a cold prefill of `tokens` by the same engine.

    Only blocks `ok` marks loaded are compared, and the Mamba state of the hit's block only when `mamba` (a closed
    load below the hit restarts the Mamba groups). For an EAGLE (draft) group the KV at position k − 1 of a block
    keyed at boundary k <= hit depends on token k, which the key H_k does not cover: a mismatch there is the
    draft-lookahead hazard, counted apart; any other mismatch is wrong. With lookahead keys (λ >= 1) the key covers
    token k: every mismatch is wrong.
    """
    if hit <= 0:
        return 0, 0, 0
    g = engine.g
    ok_blocks = {(int(i), int(b)) for (i, b, _), good in zip(plan, ok) if good}
    cold = RequestKV(g, len(tokens), engine.width, engine.device)
    engine.prefill(tokens, cold)
    compared = wrong = lookahead = 0
    row_bytes = engine.width * 4
    for i, gr in enumerate(g.groups):
        if gr.kind == "attention":
            pos, blk, slot = engine.owned_rows(hit, i)
            keep = torch.tensor([(i, int(b)) in ok_blocks for b in blk.tolist()], dtype=torch.bool)
            pos, blk, slot = pos[keep], blk[keep].to(engine.device), slot[keep].to(engine.device)
            mine, theirs = loaded.tensors[i][blk, slot], cold.tensors[i][blk, slot]
            hazard = torch.zeros(len(pos), dtype=torch.bool)
            if gr.eagle and engine.lookahead == 0:
                edges = {int(k) - 1 for x, _, k in plan if x == i and k <= hit}
                hazard = torch.tensor([int(p) in edges for p in pos.tolist()], dtype=torch.bool)
            row_bad = (mine.view(torch.int32) != theirs.view(torch.int32)).any(dim=1).cpu()
            compared += len(pos) * row_bytes
            wrong += int((row_bad & ~hazard).sum()) * row_bytes
            lookahead += int((row_bad & hazard).sum()) * row_bytes
        else:
            c = (hit + gr.block_size - 1) // gr.block_size - 1
            if not mamba or (i, c) not in ok_blocks:
                continue
            state = loaded.tensors[i][c]
            want = engine.model.mamba_state(tokens, i, hit).to(engine.device)
            compared += state.numel() * 4
            wrong += state.numel() * 4 if bool((state.view(torch.int32) != want.view(torch.int32)).any()) else 0
    return compared, wrong, lookahead
