"""`kvspec explain --svg FILE`: the block layout of one scenario as a picture.

One row per (group, rank): the group's blocks along the token axis, each coloured by what happens to
it — loaded (its key is present), missing (planned under a key that is not present: Mooncake's -704),
stored but not loaded, or absent. The unit grid is drawn on the axis; the hit length h is a vertical
line; each tail key boundary B_g is a marker on its group's rows. Plain SVG 1.1, no dependencies.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from kvspec.spec.geometry import compute_ranks, compute_span
from kvspec.spec.plan import LoadEntry
from kvspec.spec.scenario import Outcome, Scenario, compute_stored_objects
from kvspec.spec.types import GroupId

COLOURS = {"loaded": "#4caf50", "missing": "#e53935", "stored": "#90caf9", "absent": "#eeeeee"}
LEGEND = {"loaded": "loaded (key present)", "missing": "missing: -704 at load", "stored": "stored, not loaded",
          "absent": "absent"}
ROW_H, TOP, WIDTH, CHAR_W = 18, 40, 900, 7  # CHAR_W: a generous width of one 11px monospace character


def _label(kind: str, eagle: bool, gid: int, rank: int) -> str:
    return f"group {gid} {kind}{' (EAGLE)' if eagle else ''} rank {rank}"


def compute_ticks(extent: int, count: int = 8) -> list[int]:
    """Return the token-axis ticks 0, s, 2s, … ≤ extent for the smallest s ∈ {1, 2, 5}·10^k with ≤ count steps."""
    step = next(m * 10**k for k in range(40) for m in (1, 2, 5) if extent // (m * 10**k) <= count)
    return list(range(0, extent + 1, step))


def render_svg(scenario: Scenario, outcome: Outcome) -> str:
    """Return the SVG document of a scenario's block layout (see the module docstring)."""
    g = scenario.geometry
    held: dict[tuple[int, int], set[int]] = {}  # (group, rank) -> blocks holding a stored object (t in the block)
    for x_, t_, r_ in compute_stored_objects(scenario) - scenario.evicted:
        held.setdefault((x_, r_), set()).add((t_ - 1) // compute_span(g, x_))
    planned: dict[tuple[int, int], LoadEntry] = {(int(e.group), e.block): e for e in outcome.load}
    tails = dict(outcome.tails)
    extent = max(scenario.prompt, max((t for _, t, _ in compute_stored_objects(scenario)), default=0), 1)
    scale = WIDTH / extent

    def x(t: int) -> float:
        return round(LEFT + t * scale, 2)

    rows = [(gid, r) for gid in range(len(g.groups)) for r in compute_ranks(g)]
    labels = [_label(g.groups[gid].kind, g.groups[gid].eagle, gid, r) for gid, r in rows]
    LEFT = 20 + CHAR_W * max(len(t) for t in labels)  # every label fits whole
    parts: list[str] = []
    height = TOP + ROW_H * len(rows) + 100
    parts.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 60}" height="{height}" '
                 f'font-family="monospace" font-size="11">')
    parts.append(f'<title>{escape(_title(scenario, outcome))}</title>')
    parts.append(f'<text x="10" y="16">{escape(_title(scenario, outcome))}</text>')
    u = g.unit
    if extent // u <= 400:  # the unit grid, when it is readable
        for t in range(0, extent + 1, u):
            parts.append(f'<line class="unit" x1="{x(t)}" y1="{TOP - 4}" x2="{x(t)}" y2="{TOP}" stroke="#bbb"/>')
    for k, (gid, r) in enumerate(rows):
        y = TOP + k * ROW_H
        s = compute_span(g, GroupId(gid))
        parts.append(f'<text class="row" x="10" y="{y + 13}">{escape(labels[k])}</text>')
        for b in range(-(-extent // s)):
            lo, hi = b * s, min((b + 1) * s, extent)
            e = planned.get((gid, b))
            stored_here = b in held.get((gid, r), ())
            state = ("loaded" if e.present else "missing") if e is not None else ("stored" if stored_here else "absent")
            key = f" key t={e.key_boundary}" if e is not None else ""
            parts.append(f'<rect class="block {state}" data-group="{gid}" data-rank="{r}" data-block="{b}" '
                         f'x="{x(lo)}" y="{y + 2}" width="{max(round((hi - lo) * scale, 2) - 1, 1)}" '
                         f'height="{ROW_H - 4}" fill="{COLOURS[state]}" stroke="#555" stroke-width="0.5">'
                         f'<title>group {gid} rank {r} block {b} [{lo}, {hi}): {state}{key}</title></rect>')
        if gid in tails:
            bt = tails[GroupId(gid)]
            parts.append(f'<path class="tail" data-group="{gid}" d="M{x(bt)},{y + 2} l-4,-5 h8 z" fill="#000">'
                         f'<title>tail key B_{gid} = {bt}</title></path>')
    h = outcome.hit_length
    bottom = TOP + ROW_H * len(rows)
    parts.append(f'<line class="axis" x1="{x(0)}" y1="{bottom + 2}" x2="{x(extent)}" y2="{bottom + 2}" stroke="#000"/>')
    for t in compute_ticks(extent):  # the token axis
        parts.append(f'<line class="tick" x1="{x(t)}" y1="{bottom + 2}" x2="{x(t)}" y2="{bottom + 6}" stroke="#000"/>'
                     f'<text class="tick" x="{x(t)}" y="{bottom + 17}" text-anchor="middle">{t}</text>')
    parts.append(f'<text x="{x(extent)}" y="{bottom + 30}" text-anchor="end">tokens</text>')
    bottom += 20
    parts.append(f'<line class="hit" x1="{x(h)}" y1="{TOP - 8}" x2="{x(h)}" y2="{bottom + 4}" stroke="#000" '
                 f'stroke-width="2" stroke-dasharray="4,2"><title>hit length h = {h}</title></line>')
    anchor = "end" if x(h) > LEFT + 0.8 * WIDTH else "start"  # keep the label inside the picture
    parts.append(f'<text x="{x(h) + (-3 if anchor == "end" else 3)}" y="{bottom + 16}" text-anchor="{anchor}">'
                 f'h = {h}</text>')
    ly = bottom + 34
    for k, (state, colour) in enumerate(COLOURS.items()):
        parts.append(f'<rect class="legend" x="{10 + k * 190}" y="{ly}" width="12" height="12" fill="{colour}" '
                     f'stroke="#555"/><text x="{26 + k * 190}" y="{ly + 10}">{LEGEND[state]}</text>')
    ly += 20
    parts.append(f'<path class="legend" d="M16,{ly + 10} l-4,-5 h8 z" fill="#000"/>'
                 f'<text x="26" y="{ly + 10}">tail key boundary B_g (the key its tail block loads under)</text>')
    parts.append(f'<line class="legend" x1="{10 + 3 * 190}" y1="{ly}" x2="{10 + 3 * 190}" y2="{ly + 12}" '
                 f'stroke="#000" stroke-width="2" stroke-dasharray="4,2"/>'
                 f'<text x="{26 + 3 * 190}" y="{ly + 10}">hit length h</text>')
    if extent // u <= 400:
        parts.append(f'<line class="legend" x1="{10 + 4 * 190 - 40}" y1="{ly + 8}" x2="{10 + 4 * 190 - 40}" '
                     f'y2="{ly + 12}" stroke="#bbb"/><text x="{26 + 4 * 190 - 40}" y="{ly + 10}">unit grid (u)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _title(scenario: Scenario, outcome: Outcome) -> str:
    g = scenario.geometry
    return (f"rules {scenario.rules}: D={g.parallel.dcp} u={g.unit} N={scenario.prompt} "
            f"hit {outcome.hit_length}; planned keys missing: {sum(not e.present for e in outcome.load)}")
