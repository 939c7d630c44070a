"""The execution graph of the parallel-strategy view (seed 000, fig. 3; issue 18 section 2).

PyTorch keeps no static graph, so the graph is built from what the job ran: per pipeline stage
and step, its ops in execution order (the stage's nodes), joined by execution order within a stage
and by each send with its receive between stages (the edges).  A node is "the same op" on every
rank of the stage -- its name and how many ops of that name ran before it in the step on that
rank (``aten::addmm#3``, ``all_reduce#0``; replicas of a stage run the same program) -- and keeps
its time on each of those ranks.

What it decides, and only here:

* ``category``: ``collective`` / ``p2p`` for the cluster's matched communication ops, else the
  rank's ``op_context`` class (``compute``, ``memory copy``, ``optimizer``);
* ``special``, the seed's three kinds of special op: ``redistribution`` -- a collective on a
  tensor-parallel group (all-gather, reduce-scatter, all-to-all, all-reduce between the shards'
  compute) or DTensor's own ``Redistribute`` op; ``gradient_aggregation`` -- an all-reduce or
  reduce-scatter on a data-parallel group; ``sharded`` -- a compute op on DTensor shards
  (``op_context.sharded``); "" otherwise.  The groups' roles are ``perfsight.cluster.parallel``'s.

Inputs: the cluster's step ops (``perfsight.cluster.execution``, on the common clock), every rank's
``op_context`` (``perfsight.analysis.op_context``), the matched communication ops and the parallel
layout.  Output: two tables written as Parquet (:data:`NODES_FILE`, :data:`EDGES_FILE`), which the
server only selects from.  Vectorised (pandas merges, Arrow grouped lists), no loop over ops.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.cluster.matching import Matched
from perfsight.cluster.parallel import ParallelLayout
from perfsight.cluster.rank import RankDigest, concat

NODES_FILE = "cluster_strategy_graph.parquet"
EDGES_FILE = "cluster_strategy_edges.parquet"
CONTEXT_TABLE = "op_context"
AGGREGATING = ("all_reduce", "reduce_scatter", "allreduce", "reduce_scatter_tensor", "all_reduce_coalesced")
"""Collectives that aggregate gradients when they run on a data-parallel group."""
LIST_COLUMNS = ("modules", "input_dims")
"""The list columns of ``op_context``: read for each node's first op only."""
SPECIALS = ("sharded", "redistribution", "gradient_aggregation")
CATEGORIES = ("compute", "collective", "p2p", "memory copy", "optimizer")

NODE_COLUMNS = [
    "step", "stage", "node", "order", "key", "name", "category", "special", "module", "modules",
    "input_dims", "collective", "group", "group_ranks", "bytes", "ranks", "starts_ns", "durations_ns",
    "mean_ns", "min_ns", "max_ns", "slowest_rank", "last_end_ns",
]  # fmt: skip
"""``node``: index of the node in its stage and step, in execution order (0, 1, ...); ``order``:
the op's smallest position among its ranks' ops of the step; ``starts_ns``: per rank (as
``ranks``), the op's start since the step's first op on the job (common clock, ns);
``last_end_ns``: the latest end of the op on any rank, on that clock (the view's span is their
maximum: a scalar column, so that drawing the graph need not read every rank's lists)."""
EDGE_COLUMNS = ["step", "kind", "src_stage", "src_node", "dst_stage", "dst_node", "pairs", "bytes"]
"""``kind``: ``order`` (the next op of the stage) or ``p2p`` (a send and its receive; ``pairs``:
the rank pairs ``"0->1"`` that exchanged it, ``bytes`` the message size)."""


OP_COLUMNS = ["step", "rank", "stage", "order", "name", "instance", "is_p2p", "start_ns", "end_ns", "slice"]
"""The columns of the cluster's step ops (``perfsight.cluster.execution``) that the graph reads."""


def strategy_graph(
    step_ops: pa.Table, digests: Mapping[int, RankDigest], matched: Matched, layout: ParallelLayout
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The graph's nodes (:data:`NODE_COLUMNS`) and edges (:data:`EDGE_COLUMNS`) of every step,
    from the cluster's step ops (:func:`perfsight.cluster.execution.step_ops`).

    Op names and keys are integer codes until the nodes are made (a key's code sorts as its text
    does): at 1,024 ranks the op rows are a million, their kernel names ~180 characters each."""
    ops, names = _op_rows(step_ops)
    if ops.empty:
        return _empty(NODE_COLUMNS), _empty(EDGE_COLUMNS)
    ops = _sorted(ops, ["step", "rank", "start_ns", "order"])
    keys, ops["key"] = _key_codes(
        ops["name"].to_numpy(), ops.groupby(["step", "rank", "name"]).cumcount(), names
    )
    t0 = ops.groupby("step")["start_ns"].transform("min")
    ops["since_ns"] = (ops["start_ns"] - t0).astype("int64")
    ops["dur_ns"] = (ops["end_ns"] - ops["start_ns"]).astype("int64")
    groups = _instance_groups(matched, layout)
    nodes = _nodes(ops, digests, groups)
    edges = pd.concat([_order_edges(nodes), _p2p_edges(ops, nodes, names, groups)], ignore_index=True)
    nodes["key"] = pd.Series(keys[nodes["key"].to_numpy()], index=nodes.index, dtype="str")
    nodes["name"] = pd.Series(names[nodes["name"].to_numpy()], index=nodes.index, dtype="str")
    return nodes[NODE_COLUMNS], edges[EDGE_COLUMNS]


def _sorted(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``frame.sort_values(by, kind="stable")`` (the same rows, labels and order) in one sort of the
    keys packed into a number per row (:func:`perfsight.columns.lexsort`): pandas sorted the
    million op rows of 1,024 ranks key by key (0.5 s for this module's two sorts)."""
    return frame.iloc[columns.lexsort([frame[column].to_numpy() for column in reversed(by)])]


def _op_rows(step_ops: pa.Table) -> tuple[pd.DataFrame, np.ndarray]:
    """The ``op`` rows of the step ops, only the columns the graph reads (:data:`OP_COLUMNS`; the
    FLOPs and memory series are a large share of the rows and no node), with ``name`` as a code
    into the returned names (the step ops' dictionary: no name is spelt per row)."""
    if not step_ops.num_rows:
        return pd.DataFrame(), np.array([], dtype=object)
    level = _coded(step_ops.column("level"))
    is_op = np.array([v == "op" for v in level.dictionary.to_pylist()] + [False])
    ops = step_ops.select(OP_COLUMNS).filter(pa.array(is_op[columns.int64(level.indices, -1)]))
    name = _coded(ops.column("name"))
    distinct = pc.dictionary_encode(name.dictionary)  # one code per distinct name
    codes = columns.int64(distinct.indices)[columns.int64(name.indices)]
    frame = ops.set_column(ops.schema.get_field_index("name"), "name", pa.array(codes)).to_pandas()
    return frame, np.array(distinct.dictionary.to_pylist(), dtype=object)


def _coded(values: pa.ChunkedArray) -> pa.DictionaryArray:
    """A text column of the step ops as one dictionary array (encoded here if it is plain text)."""
    values = columns.combined(values)
    return values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)


def _key_codes(name: np.ndarray, nth: pd.Series, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An op's key, ``name#k`` (the k-th op of that name in its step on its rank), as a code per
    row that sorts as the text does, and the texts by code (each distinct key spelt once)."""
    nth = nth.to_numpy(np.int64)
    pairs, at = np.unique(name * (int(nth.max(initial=0)) + 1) + nth, return_inverse=True)
    first = np.zeros(len(pairs), np.int64)
    first[at[::-1]] = np.arange(len(at))[::-1]  # a row of each distinct key
    text = pc.binary_join_element_wise(
        pa.array(names[name[first]], pa.string()), pa.array(nth[first]).cast(pa.string()), "#"
    )
    by_text = columns.int64(pc.sort_indices(text))
    code = np.empty(len(pairs), np.int64)
    code[by_text] = np.arange(len(pairs))
    return np.array(text.take(pa.array(by_text)).to_pylist(), dtype=object), code[at.ravel()]


def _with_context(
    ops: pd.DataFrame, digests: Mapping[int, RankDigest]
) -> tuple[pd.DataFrame, pa.Table | None]:
    """``ops`` with its ranks' ``op_context`` (module, class, DTensor flags) joined on (rank, slice).

    The list columns (``modules``, ``input_dims``) stay in the returned Arrow table, the rows
    keeping a ``context_row`` into it: only each node's first op reads them (:func:`_nodes`), and
    as pandas objects they would be a million small arrays at 1,024 ranks."""
    with_table = [digests[r] for r in sorted(digests) if CONTEXT_TABLE in digests[r].tables]
    table = concat(with_table, CONTEXT_TABLE)
    lists = None
    if table.num_rows:
        lists = table.select([c for c in LIST_COLUMNS if c in table.column_names])
        context = table.drop_columns(lists.column_names)
        context = context.append_column("context_row", pa.array(np.arange(table.num_rows))).to_pandas()
        context["rank"] = context["rank"].astype("int64")
        ops = ops.merge(context, on=["rank", "slice"], how="left")
    for column, empty in (("module", ""), ("op_class", "compute")):
        ops[column] = ops[column].fillna(empty) if column in ops else empty
    for column in ("sharded", "redistribution"):
        ops[column] = ops[column].fillna(False).astype(bool) if column in ops else False
    return ops, lists


def _list_values(first: pd.DataFrame, lists: pa.Table | None) -> pd.DataFrame:
    """``first`` (one op per node) with the ``op_context`` list columns of its rows: as the rank's
    table has them, NaN for an op without context, None where the job has no such column."""
    for column in LIST_COLUMNS:
        if lists is None or column not in lists.column_names:
            first[column] = None
            continue
        row = first["context_row"].to_numpy(np.float64)
        missing = np.isnan(row)
        at = pa.array(np.where(missing, 0, row).astype(np.int64), mask=missing)
        values = lists.column(column).take(at).to_pandas().to_numpy(dtype=object).copy()
        values[missing] = np.nan
        first[column] = values
    return first.drop(columns="context_row")


def _instance_groups(matched: Matched, layout: ParallelLayout) -> pd.DataFrame | None:
    """Per matched communication instance: its collective, group, members, bytes and the role of
    its group (decided once per instance, then joined to the rows that need it); None when the job
    matched none."""
    comm = matched.ops
    per = comm[comm["instance"] >= 0] if not comm.empty else comm
    if per.empty:
        return None
    role = {tuple(g): "data" for g in layout.groups.get("data", [])}
    role |= {tuple(g): "tensor" for g in layout.groups.get("tensor", [])}  # a shard group is tensor first
    per = per.sort_values("bytes", ascending=False, kind="stable").drop_duplicates("instance")
    members = per["members"].map(lambda m: tuple(sorted(int(r) for r in m)))  # per instance, not op
    return pd.DataFrame(
        {
            "instance": per["instance"],
            "collective": per["collective"].astype(str),
            "group": per["group"].astype(str),
            "group_ranks": members.map(list),
            "bytes": per["bytes"],
            "group_role": members.map(lambda m: role.get(m, "")),
        }
    )


def _with_groups(ops: pd.DataFrame, groups: pd.DataFrame | None) -> pd.DataFrame:
    """Each communication row's collective, group, members, bytes and group role (from
    :func:`_instance_groups`), and every row's ``category`` and ``special`` (module docstring)."""
    if groups is None:
        ops = ops.assign(collective="", group="", group_ranks=None, bytes=np.nan, group_role="")
    else:
        ops = ops.merge(groups, on="instance", how="left")
        for column in ("collective", "group", "group_role"):
            ops[column] = ops[column].fillna("")
    comm_row = (ops["instance"] >= 0).to_numpy()
    p2p = comm_row & ops["is_p2p"].astype(bool).to_numpy()
    collective = comm_row & ~p2p
    ops["category"] = np.where(p2p, "p2p", np.where(collective, "collective", ops["op_class"]))
    aggregating = ops["collective"].str.startswith(AGGREGATING).to_numpy()
    group_role = ops["group_role"].to_numpy()
    ops["special"] = np.select(
        [
            collective & (group_role == "tensor"),
            collective & (group_role == "data") & aggregating,
            ~comm_row & ops["redistribution"].to_numpy(),
            ~comm_row & ops["sharded"].to_numpy(),
        ],
        ["redistribution", "gradient_aggregation", "redistribution", "sharded"],
        "",
    )
    return ops


def _nodes(ops: pd.DataFrame, digests: Mapping[int, RankDigest], groups: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (step, stage, key), per-rank values as lists in rank order.

    A node's description (category, special, module, group, ...) is its first op's: the ranks'
    ``op_context`` and the instances' groups are joined to those rows only, a thousand at
    1,024 ranks where the ops are a million (1.0 -> 0.1 s)."""
    ops = _sorted(ops, ["step", "stage", "key", "rank"])
    frame = pd.DataFrame(
        {
            "step": ops["step"].astype("int64"),
            "stage": ops["stage"].astype("int64"),
            "key": ops["key"].astype("int64"),
            "rank": ops["rank"].astype("int64"),
            "since_ns": ops["since_ns"],
            "dur_ns": ops["dur_ns"],
            "end_ns": ops["since_ns"] + ops["dur_ns"],
            "order": ops["order"].astype("int64"),
        }
    )
    grouped = (
        pa.Table.from_pandas(frame, preserve_index=False)
        .group_by(["step", "stage", "key"], use_threads=False)
        .aggregate(
            [
                ("rank", "list"),
                ("since_ns", "list"),
                ("dur_ns", "list"),
                ("order", "min"),
                ("dur_ns", "mean"),
                ("dur_ns", "min"),
                ("dur_ns", "max"),
                ("end_ns", "max"),
            ]
        )  # fmt: skip
        .to_pandas()
    )
    grouped = grouped.rename(
        columns={
            "rank_list": "ranks", "since_ns_list": "starts_ns", "dur_ns_list": "durations_ns",
            "order_min": "order", "dur_ns_mean": "mean_ns", "dur_ns_min": "min_ns", "dur_ns_max": "max_ns",
            "end_ns_max": "last_end_ns",
        }
    )  # fmt: skip
    first, lists = _with_context(ops.drop_duplicates(["step", "stage", "key"]), digests)
    first = _with_groups(first, groups)
    rows = ["context_row"] if "context_row" in first else []
    first = first[
        ["step", "stage", "key", "name", "category", "special", "module", *rows,
         "collective", "group", "group_ranks", "bytes"]
    ]  # fmt: skip
    first = _list_values(first if rows else first.assign(context_row=np.nan), lists)
    slowest = ops.loc[
        ops.groupby(["step", "stage", "key"], sort=False)["dur_ns"].idxmax(), ["step", "stage", "key", "rank"]
    ]
    first = first.merge(slowest.rename(columns={"rank": "slowest_rank"}), on=["step", "stage", "key"])
    nodes = grouped.merge(first, on=["step", "stage", "key"], how="left")
    nodes = nodes.sort_values(["step", "stage", "order", "key"], kind="stable").reset_index(drop=True)
    nodes["node"] = nodes.groupby(["step", "stage"]).cumcount().astype("int64")
    nodes["mean_ns"] = nodes["mean_ns"].round().astype("int64")
    nodes["bytes"] = nodes["bytes"].astype("Int64")
    return nodes


def _order_edges(nodes: pd.DataFrame) -> pd.DataFrame:
    nxt = nodes.groupby(["step", "stage"])["node"].shift(-1)
    has = nxt.notna()
    return pd.DataFrame(
        {
            "step": nodes.loc[has, "step"],
            "kind": "order",
            "src_stage": nodes.loc[has, "stage"],
            "src_node": nodes.loc[has, "node"],
            "dst_stage": nodes.loc[has, "stage"],
            "dst_node": nxt[has].astype("int64"),
            "pairs": [[] for _ in range(int(has.sum()))],
            "bytes": pd.array([pd.NA] * int(has.sum()), dtype="Int64"),
        }
    )


def _p2p_edges(
    ops: pd.DataFrame, nodes: pd.DataFrame, names: np.ndarray, groups: pd.DataFrame | None
) -> pd.DataFrame:
    p2p = ops[ops["is_p2p"].astype(bool) & (ops["instance"] >= 0)]
    if groups is None:
        p2p = p2p.assign(bytes=np.nan)
    else:
        p2p = p2p.merge(groups[["instance", "bytes"]], on="instance", how="left")
    name = pd.Series(names, dtype="str")
    send = p2p[name.str.contains("send", na=False).to_numpy()[p2p["name"].to_numpy()]]
    recv = p2p[name.str.contains("recv", na=False).to_numpy()[p2p["name"].to_numpy()]]
    index = nodes[["step", "stage", "key", "node"]]
    cols = ["step", "instance", "rank", "stage", "key", "bytes"]
    pairs = send[cols].merge(recv[cols], on=["step", "instance"], suffixes=("_src", "_dst"))
    if pairs.empty:
        return _empty(EDGE_COLUMNS)
    pairs = pairs.merge(
        index.rename(columns={"stage": "stage_src", "key": "key_src", "node": "src_node"}),
        on=["step", "stage_src", "key_src"],
    ).merge(
        index.rename(columns={"stage": "stage_dst", "key": "key_dst", "node": "dst_node"}),
        on=["step", "stage_dst", "key_dst"],
    )
    pairs["pair"] = pairs["rank_src"].astype(str) + "->" + pairs["rank_dst"].astype(str)
    edges = (
        pairs.groupby(["step", "stage_src", "src_node", "stage_dst", "dst_node"], sort=True)
        .agg(pairs=("pair", lambda p: sorted(set(p))), bytes=("bytes_src", "max"))
        .reset_index()
        .rename(columns={"stage_src": "src_stage", "stage_dst": "dst_stage"})
    )
    edges["kind"] = "p2p"
    edges["bytes"] = edges["bytes"].astype("Int64")
    return edges


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
