"""Per config, a PNG of the decision rank 0 gets over DP skew, with the failures on top.

x is the smallest rank's tokens (rank 0), y the largest (every other rank), uniform decode
(one token per request), both 0..L with L = min(max_num_reqs, max_num_batched_tokens). The
decision comes from the decision layer itself (`plan_without_world`), never recomputed here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.report.logs import RunLogs, step_tokens
from harness.report.outcome import variant_order
from harness.scenario import Scenario
from harness.sut.step_plan import graph_table_for, plan_without_world
from harness.sut.thresholds import last_region_start

KINDS = ("eager", "eager-microbatched", "piecewise", "full", "full-microbatched")
LABELS = {"eager": "eager", "eager-microbatched": "eager microbatched", "piecewise": "piecewise",
          "full": "FULL", "full-microbatched": "FULL microbatched"}
COLOURS = {"eager": "#d9d9d9", "eager-microbatched": "#9ecae1", "piecewise": "#fdd0a2",
           "full": "#a1d99b", "full-microbatched": "#6a51a3"}
# Enough cells per axis to see every boundary; L = 512 samples every 2nd token.
MAX_SAMPLES = 257


def map_limit(config: HarnessConfig) -> int:
    return min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)


def map_stride(limit: int) -> int:
    return max(1, math.ceil(limit / (MAX_SAMPLES - 1)))


def config_key(config: HarnessConfig) -> str:
    """A short hash of the config's fields, stable across runs and versions of the log."""
    text = json.dumps(config.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def map_file_name(config: HarnessConfig) -> str:
    return f"decision-map-{config_key(config)}.png"


def cell_batches(config: HarnessConfig, min_tokens: int, max_tokens: int) -> list[RankBatch]:
    """Rank 0 holds the minimum, every other rank the maximum."""
    rest = [RankBatch.uniform(max_tokens, 1)] * (config.serving.dp_size - 1)
    return [RankBatch.uniform(min_tokens, 1), *rest]


def cell_kind(config: HarnessConfig, min_tokens: int, max_tokens: int) -> str | None:
    """Rank 0's plan kind; None where no step has this min and max."""
    if min_tokens > max_tokens or (config.serving.dp_size == 1 and min_tokens != max_tokens):
        return None
    return plan_without_world(config, cell_batches(config, min_tokens, max_tokens))[0].kind


def decision_grid(config: HarnessConfig, limit: int, stride: int = 1) -> list[list[str | None]]:
    """grid[i][j]: rank 0's kind at max = i * stride tokens and min = j * stride tokens."""
    values = range(0, limit + 1, stride)
    return [[cell_kind(config, x, y) for x in values] for y in values]


@dataclass(frozen=True)
class GuardBoundary:
    graph_tokens: int  # G: the size of a microbatched graph
    min_tokens: int  # last_region_start(G, k): a minimum at or below it must not replay G
    max_low: int  # the largest-rank token counts whose step is padded to G
    max_high: int


def guard_boundaries(config: HarnessConfig, limit: int) -> list[GuardBoundary]:
    table = graph_table_for(config, 0)
    k = config.num_ubatches
    sizes = {d.num_tokens for d in table.twins}
    spans: dict[int, list[int]] = {}
    for y in range(1, limit + 1):
        # The graph a uniform-decode step of y tokens on the largest rank is padded to.
        desc = table.dispatch(y, y, 1, num_ubatches=k)
        if desc.microbatched and desc.num_tokens in sizes:
            spans.setdefault(desc.num_tokens, []).append(y)
    return [GuardBoundary(g, last_region_start(g, k), ys[0], ys[-1])
            for g, ys in sorted(spans.items())]


@dataclass(frozen=True)
class DecisionMap:
    config: HarnessConfig
    variants: tuple[str, ...]
    failing: tuple[tuple[int, int], ...]  # (min, max) tokens of each failing example's step 0
    findings: tuple[tuple[int, int, str], ...]  # (min, max, checker) of each shrunk scenario

    @property
    def file_name(self) -> str:
        return map_file_name(self.config)


def decision_maps(logs: RunLogs) -> list[DecisionMap]:
    """One map per config worth looking at: each finding's shrunk config, and for a variant
    with no finding the config its examples exercised most. A fuzz run touches hundreds of
    configs; a map for each would bury the few that matter."""
    configs: dict[str, HarnessConfig] = {}
    variants: dict[str, list[str]] = {}
    failing: dict[str, list[tuple[int, int]]] = {}
    findings: dict[str, list[tuple[int, int, str]]] = {}
    for finding in logs.findings:
        if finding.scenario is None:
            continue
        key = _remember(configs, variants, finding.scenario, finding.entry.variant)
        low, high = _min_max(finding.scenario)
        findings.setdefault(key, []).append((low, high, finding.entry.checker or "found"))
    mapped_variants = {v for names in variants.values() for v in names}
    usage: dict[str, Counter[str]] = {}
    seen: dict[str, HarnessConfig] = {}
    for example in logs.examples:
        key = config_key(example.scenario.config)
        usage.setdefault(example.entry.variant, Counter())[key] += 1
        seen.setdefault(key, example.scenario.config)
    for variant, counts in usage.items():
        if variant not in mapped_variants:
            key = counts.most_common(1)[0][0]
            configs.setdefault(key, seen[key])
            variants.setdefault(key, []).append(variant)
    for example in logs.examples:
        key = config_key(example.scenario.config)
        if key in variants and (not example.entry.ok or example.entry.failed):
            failing.setdefault(key, []).append(_min_max(example.scenario))
    return [DecisionMap(configs[key], tuple(variant_order(names)),
                        tuple(failing.get(key, ())), tuple(findings.get(key, ())))
            for key, names in variants.items()]


def _remember(configs: dict[str, HarnessConfig], variants: dict[str, list[str]],
              scenario: Scenario, variant: str) -> str:
    key = config_key(scenario.config)
    configs.setdefault(key, scenario.config)
    variants.setdefault(key, []).append(variant)
    return key


def _min_max(scenario: Scenario) -> tuple[int, int]:
    first = step_tokens(scenario)[0]
    return min(first), max(first)


def map_title(dmap: DecisionMap) -> str:
    c = dmap.config
    sizes = list(c.cudagraph_capture_sizes)
    shown = str(sizes) if len(sizes) <= 8 else f"[{sizes[0]} .. {sizes[-1]}] ({len(sizes)} sizes)"
    fields = [f"dp={c.serving.dp_size}", f"k={c.num_ubatches}", f"{c.serving.cudagraph_mode.name}",
              f"capture sizes {shown}", f"decode>={c.serving.decode_threshold}",
              f"prefill>={c.serving.prefill_threshold}", f"guard={c.mutation.guard.value}",
              f"twins={c.mutation.twins.value}"]
    if c.mutation.threshold_offset_rank is not None:
        fields.append(f"threshold +{c.mutation.threshold_offset} on rank "
                      f"{c.mutation.threshold_offset_rank}")
    return f"{', '.join(dmap.variants)}\n{'  '.join(fields)}"


def draw_decision_map(dmap: DecisionMap, path: str | Path) -> Path:
    # Imported here so that a report without maps needs no matplotlib.
    try:
        import numpy as np
        from matplotlib.colors import to_rgba
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        raise ConfigError("maps", "matplotlib is not installed; pass --no-maps") from None
    config, path = dmap.config, Path(path)
    limit = map_limit(config)
    stride = map_stride(limit)
    grid = decision_grid(config, limit, stride)
    image = np.ones((len(grid), len(grid), 4))
    for i, row in enumerate(grid):
        for j, kind in enumerate(row):
            if kind is not None:
                image[i, j] = to_rgba(COLOURS[kind])
    top = (len(grid) - 1) * stride
    # A Figure without pyplot: no global backend or figure registry to leak or close.
    fig = Figure(figsize=(10, 7.5))
    ax = fig.add_subplot()
    half = stride / 2
    ax.imshow(image, origin="lower", interpolation="nearest",
              extent=(-half, top + half, -half, top + half))
    handles: list = [Patch(color=COLOURS[k], label=LABELS[k]) for k in KINDS
                     if k != "piecewise" or any("piecewise" in row for row in grid)]
    handles += _draw_guard_lines(ax, guard_boundaries(config, limit), half, Line2D)
    handles += _draw_examples(ax, dmap)
    points = [*dmap.failing, *((x, y) for x, y, _ in dmap.findings)]
    # A little room past the last cell, so markers on the edge are not clipped.
    edge = max([top, *(max(p) for p in points)]) + max(half, top / 50)
    ax.set_xlim(-half, edge)
    ax.set_ylim(-half, edge)
    sampled = f", sampled every {stride} tokens" if stride > 1 else ""
    ax.set_xlabel(f"min tokens across ranks (rank 0; uniform decode{sampled})")
    ax.set_ylabel("max tokens across ranks (every other rank)")
    ax.set_title(map_title(dmap), fontsize=9)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8,
              title="rank 0's step")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _draw_guard_lines(ax, boundaries, half: float, line_cls) -> list:
    """Each microbatched graph's guard boundary as a dashed line; its legend handle."""
    # Label a handful of graphs; the default ladder has dozens.
    label_every = math.ceil(len(boundaries) / 8) if boundaries else 1
    for i, b in enumerate(boundaries):
        # On the cell edge: the column of the last region start is still on the eager side.
        x = b.min_tokens + 0.5
        # Below the diagonal no step exists (the minimum exceeds the maximum).
        low = max(b.max_low, b.min_tokens)
        ax.vlines(x, low - half, b.max_high + half, colors="black", linestyles="--",
                  linewidth=1.2)
        if i % label_every == 0 or i == len(boundaries) - 1:
            ax.annotate(f"G={b.graph_tokens}", (x, b.max_high), fontsize=7, xytext=(-3, -8),
                        textcoords="offset points", ha="right")
    if not boundaries:
        return []
    return [line_cls([], [], color="black", linestyle="--",
                     label="guard of graph G: a min at or left of the line\n"
                           "(<= G/k*(k-1)) must not replay G")]


def _draw_examples(ax, dmap: DecisionMap) -> list:
    """The failing examples and the shrunk findings, marked; their legend handles."""
    handles = []
    if dmap.failing:
        xs, ys = zip(*sorted(set(dmap.failing)), strict=True)
        handles.append(ax.scatter(xs, ys, marker="x", c="red", s=25, linewidths=1.2,
                                  label=f"failing example ({len(dmap.failing)})"))
    if dmap.findings:
        xs, ys, _ = zip(*dmap.findings, strict=True)
        handles.append(ax.scatter(xs, ys, marker="o", s=160, facecolors="none",
                                  edgecolors="black", linewidths=2, label="finding (shrunk)"))
        for x, y, checker in dmap.findings:
            # Up and right: the graph labels sit left of and below the top of their line.
            ax.annotate(checker, (x, y), xytext=(9, 5), textcoords="offset points",
                        fontsize=8, bbox={"boxstyle": "round", "fc": "white", "alpha": 0.8})
    return handles


def draw_decision_maps(logs: RunLogs, out_dir: str | Path) -> tuple[Path, ...]:
    return tuple(draw_decision_map(m, Path(out_dir) / m.file_name) for m in decision_maps(logs))
