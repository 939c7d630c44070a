"""Which parallel modes a job uses, and which ranks form each group of each mode.

Why: the cluster step trace reads differently per mode (data parallel: gap / forward+backward /
tail; tensor parallel: computation / pure communication; pipeline: stage / bubble / receive), so
the summary must say which modes the job really used -- from what the job recorded, never from
rank arithmetic (rank 3 of 4 says nothing about its role).  The evidence, strongest first:

1. ``parallel_layout`` metadata the job recorded (``prof.add_metadata_json("parallel_layout",
   ...)``): ``{"tensor_parallel": 2, ...}`` (sizes) or ``{"tensor": [[0, 1]], ...}`` (groups).
2. Process-group descriptions: ``DeviceMesh`` names the groups of a mesh dimension
   ``mesh_<dim>`` (``mesh_tp``, ``mesh_dp_shard``, ...), frameworks use ``tp``/``dp``/``pp`` and the
   like.  A group takes the role its name says, only when collectives ran on it.
3. Point-to-point traffic: ranks that exchange sends and receives form a pipeline (the stages
   themselves come from ``step_trace.stages``).
4. Collectives (all-reduce, all-gather, reduce-scatter) on a group with no recorded role --
   ``default_pg`` or an unnamed ``new_group`` -- are assumed to be data parallel, and the evidence
   says it was assumed; with sizes in ``parallel_layout``, such a group takes the one declared mode
   of its size instead.

The data- and tensor-parallel groups also tell stage membership (``same_stage_groups``): their
ranks belong to one pipeline stage (replicas of a stage average gradients with each other), so a
rank whose p2p traffic is missing takes its group's stage, and a group whose ranks sit on different
stages is reported (``check_stages``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest

MODES = ("data", "tensor", "pipeline", "context", "expert")
"""Canonical mode names, in the order they are listed."""

ROLE_WORDS = {
    "dp": "data", "data": "data", "ddp": "data", "fsdp": "data", "hsdp": "data", "shard": "data",
    "replicate": "data", "tp": "tensor", "tensor": "tensor", "mp": "tensor", "model": "tensor",
    "sp": "tensor", "pp": "pipeline", "pipe": "pipeline", "pipeline": "pipeline", "stage": "pipeline",
    "cp": "context", "context": "context", "ep": "expert", "expert": "expert", "moe": "expert",
}  # fmt: skip
"""Words of a process-group description (or ``parallel_layout`` key) -> the mode they name."""

ASSUMED_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
"""Collectives that, on a group without a recorded role, are taken as data-parallel traffic."""

_NOT_ROLE = ("default", "pg", "undefined", "mesh", "group", "parallel", "dim", "world", "gloo", "nccl")


@dataclasses.dataclass
class ParallelLayout:
    """The job's parallel modes: groups of global ranks per mode, and why each mode was named."""

    groups: dict[str, list[tuple[int, ...]]]
    evidence: dict[str, list[str]]
    problems: list[str]
    assumed: set[tuple[int, ...]] = dataclasses.field(default_factory=set)  # "data" by rule 4 only

    @property
    def modes(self) -> list[str]:
        return [m for m in MODES if self.groups.get(m) or self.evidence.get(m)]

    def rank_modes(self, ranks: list[int]) -> dict[int, list[str]]:
        """The modes each rank takes part in."""
        out: dict[int, list[str]] = {r: [] for r in ranks}
        for mode in self.modes:
            members = {r for group in self.groups.get(mode, []) for r in group}
            for rank in ranks:
                if rank in members:
                    out[rank].append(mode)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "modes": self.modes,
            "groups": {m: [list(g) for g in self.groups.get(m, [])] for m in self.modes},
            "evidence": {m: self.evidence.get(m, []) for m in self.modes},
            "problems": self.problems,
        }


def roles_of(description: str) -> set[str]:
    """Modes a process-group description (or layout key) names: ``mesh_tp`` -> {tensor},
    ``mesh_dp_shard_cp`` -> {data, context}, ``default_pg`` -> {}."""
    words = [w for w in re.split(r"[^a-z0-9]+|_", description.lower()) if w and w not in _NOT_ROLE]
    return {ROLE_WORDS[w] for w in words if w in ROLE_WORDS}


def detect(digests: Mapping[int, RankDigest], matched: Matched) -> ParallelLayout:
    """The job's parallel layout from metadata, process groups and traffic (module docstring).

    ``problems`` is filled by :func:`check_stages` once the stages are known."""
    groups: dict[str, list[tuple[int, ...]]] = {}
    evidence: dict[str, list[str]] = {}
    assumed: set[tuple[int, ...]] = set()
    sizes = _declared_sizes(digests, groups, evidence)

    def add(mode: str, members: tuple[int, ...], why: str) -> None:
        if members not in groups.setdefault(mode, []):
            groups[mode].append(members)
        if why not in evidence.setdefault(mode, []):
            evidence[mode].append(why)

    ops = matched.ops
    descriptions = _descriptions(digests)
    collectives = ops.loc[~ops["is_p2p"].astype(bool)] if "is_p2p" in ops else ops.iloc[:0]
    used = collectives.drop_duplicates("group")
    kinds_of = collectives.groupby("group")["collective"].agg(lambda c: sorted(set(c)))
    for group, ranks in zip(used["group"], used["members"], strict=True):
        kinds = kinds_of[group]
        description = descriptions.get(str(group), "")
        members = tuple(sorted(int(r) for r in ranks))
        roles = roles_of(description) | roles_of(str(group))
        named = f"process group {group!r} ({description or 'no description'}): {kinds}"
        for mode in sorted(roles):
            add(mode, members, named)
        if roles or not set(kinds).intersection(ASSUMED_COLLECTIVES):
            continue
        declared = [m for m, n in sizes.items() if n == len(members) and m != "pipeline"]
        if len(declared) == 1:
            add(declared[0], members, f"process group {group!r} of size {len(members)} (parallel_layout)")
        else:
            add("data", members, f"{named} with no recorded role, assumed data parallel")
            assumed.add(members)
    for chain in _p2p_components(ops):
        add("pipeline", chain, "point-to-point sends and receives between " + ", ".join(map(str, chain)))
    return ParallelLayout(groups, evidence, [], assumed)


def _declared_sizes(
    digests: Mapping[int, RankDigest],
    groups: dict[str, list[tuple[int, ...]]],
    evidence: dict[str, list[str]],
) -> dict[str, int]:
    """Read ``parallel_layout`` (first rank that has one); fills ``groups``/``evidence`` with what
    it names and returns the declared size of each mode."""
    sizes: dict[str, int] = {}
    layout = next((d.meta.extra.get("parallel_layout") for d in digests.values() if _layout(d)), None)
    if not isinstance(layout, Mapping):
        return sizes
    for key, value in layout.items():
        for mode in roles_of(str(key)):
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                sizes[mode] = value
                evidence.setdefault(mode, []).append(f"parallel_layout {key} = {value}")
            elif isinstance(value, list) and value and all(isinstance(g, list) for g in value):
                groups.setdefault(mode, []).extend(tuple(sorted(int(r) for r in g)) for g in value)
                evidence.setdefault(mode, []).append(f"parallel_layout {key}")
    return sizes


def _layout(digest: RankDigest) -> bool:
    return isinstance(digest.meta.extra.get("parallel_layout"), Mapping)


def _descriptions(digests: Mapping[int, RankDigest]) -> dict[str, str]:
    """Process-group name -> description, from every rank's metadata (run folder or Kineto)."""
    out: dict[str, str] = {}
    for digest in digests.values():
        for pg in digest.meta.process_groups:
            name = str(pg.get("name", pg.get("pg_name", "")))
            desc = pg.get("description", pg.get("pg_desc"))
            if name and desc and name not in out:
                out[name] = str(desc)
    return out


def _p2p_components(ops: pd.DataFrame) -> list[tuple[int, ...]]:
    """Sets of ranks connected by point-to-point traffic (each one pipeline), sorted."""
    if "is_p2p" not in ops or not ops["is_p2p"].any():
        return []
    pairs = ops.loc[ops["is_p2p"].astype(bool) & ops["src"].notna() & ops["dst"].notna(), ["src", "dst"]]
    pairs = pairs.astype("int64").drop_duplicates()
    root = {int(n): int(n) for n in np.unique(pairs.to_numpy())}

    def find(rank: int) -> int:
        while root[rank] != rank:
            root[rank] = root[root[rank]]  # path halving: near-constant time per lookup
            rank = root[rank]
        return rank

    for src, dst in pairs.itertuples(index=False):  # one row per linked pair of ranks, not per op
        a, b = find(src), find(dst)
        if a != b:
            root[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = {}
    for rank in root:
        components.setdefault(find(rank), []).append(rank)
    return sorted(tuple(sorted(c)) for c in components.values())


def same_stage_groups(layout: ParallelLayout) -> list[tuple[int, ...]]:
    """Groups whose ranks must share one pipeline stage: data- and tensor-parallel groups (the
    replicas of a stage, the shards of a stage's layers)."""
    return [g for mode in ("data", "tensor") for g in layout.groups.get(mode, [])]


def check_stages(layout: ParallelLayout, stage_of: Mapping[int, int]) -> None:
    """Report data- and tensor-parallel groups whose ranks sit on different pipeline stages.

    A group only *assumed* data parallel (rule 4) that spans stages is not data parallel at all
    (a pipeline's loss or gradient-norm all-reduce over every stage): it is dropped instead."""
    if not layout.groups.get("pipeline"):
        return
    for mode in ("data", "tensor"):
        for group in list(layout.groups.get(mode, [])):
            on = sorted({stage_of[r] for r in group if r in stage_of})
            if len(on) <= 1:
                continue
            if mode == "data" and group in layout.assumed:
                layout.groups[mode].remove(group)
                if not layout.assumed.intersection(layout.groups[mode]):  # no assumption left
                    layout.evidence[mode] = [e for e in layout.evidence[mode] if "assumed" not in e]
                if not layout.groups[mode] and not layout.evidence[mode]:
                    del layout.groups[mode], layout.evidence[mode]
            else:
                layout.problems.append(f"{mode}-parallel group {list(group)} spans pipeline stages {on}")
