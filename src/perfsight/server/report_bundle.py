"""What a self-contained HTML report carries: the API answers its pages need, within a size budget.

Why answers of the API: the report is the web UI in a static mode (``web/src/api.ts`` answers each
request from the embedded answers when the page holds them), so a report equals the server by
construction -- every number comes from the same route the server runs (:mod:`report_client`).
This module only decides *which* requests to embed: the ones each page makes when it opens
(:func:`job_pages`, :func:`rank_pages`, which mirror ``web/src/pages/*``), then, while the budget
lasts, the answers a user reaches by clicking (other sort orders, later table pages, single steps,
drill-downs, other ranks), most useful first.  What does not fit is listed in the report
(``omitted``), and the UI says "not in this report" where a user asks for it.

It must not compute or change any number, nor read an analysis table itself.

Size: an answer that differs from an embedded one only in the order of one list (the job tables
sorted by another column) is stored as that order (``like``/``field``/``order``), a few bytes per
rank, so sorting a 1,024-rank table costs kilobytes, not megabytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, get_args

import orjson

from perfsight.server import models, queries
from perfsight.server.report_client import Answer, AppClient, Params, clean

FORMAT = 1
"""Version of the embedded document (``web/src/api.ts`` ``ReportData``)."""
TABLE_PAGE = 25
"""Rows per page of the UI's tables (web/src/components/table.ts ``pageSize``)."""
DEFAULT_PAGES = 4
"""Pages of each table embedded in its default order (the later ones only while the budget lasts)."""
JOB_RANK_PAGE = 64
"""Ranks per page of the job tables (web/src/pages/job.ts ``RANK_PAGE``)."""
TOP_DRILLS = 10
"""Operator types and kernels whose instances are embedded (the top ones by the default order)."""
RUN_PAGES = ("overview", "findings", "steps", "operators", "memory")
"""The rank pages a report carries (web/src/router.ts ``RUN_PAGES`` without the timeline, which
asks the server for every window it draws)."""
JOB_PAGES = ("job", "job-steps", "job-findings")
OTHER_RANKS = "the pages of other ranks"


class ReportTooLarge(RuntimeError):
    """The pages a report cannot do without exceed the size limit."""


def escaped(raw: bytes) -> bytes:
    """JSON bytes safe inside an HTML ``<script>`` element: every ``<`` written ``\\u003c`` (the same
    string to ``JSON.parse``), so no name can close the element or open a comment."""
    return raw.replace(b"<", b"\\u003c")


@dataclasses.dataclass
class Entry:
    """One embedded answer: its body, or how it derives from an earlier entry."""

    answer: Answer
    body: bytes | None  # escaped JSON, or None when derived
    like: int | None = None
    field: str | None = None
    order: list[int] | None = None

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.answer.path, "params": self.answer.params}
        out["status"] = self.answer.status
        if self.body is not None:
            out["body"] = orjson.Fragment(self.body)
        else:
            out["like"] = self.like
            if self.field is not None:
                out["field"], out["order"] = self.field, self.order
        return out

    def size(self) -> int:
        return len(orjson.dumps(self.document()))


def _permutation(base: Any, other: Any) -> tuple[str, list[int]] | None:
    """(field, order) when ``other`` equals ``base`` but for the order of one list field, else None."""
    if not isinstance(base, dict) or not isinstance(other, dict) or base.keys() != other.keys():
        return None
    differing = [k for k in base if base[k] != other[k]]
    if len(differing) != 1:
        return None
    field = differing[0]
    old, new = base[field], other[field]
    if not isinstance(old, list) or not isinstance(new, list) or len(old) != len(new):
        return None
    where: dict[bytes, list[int]] = {}
    for i, item in enumerate(old):
        where.setdefault(orjson.dumps(item, option=orjson.OPT_SORT_KEYS), []).append(i)
    order = []
    for item in new:
        slots = where.get(orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
        if not slots:
            return None
        order.append(slots.pop(0))
    return field, order


ORDER_PARAMS = ("sort", "order")


def _reorders(base: Answer, other: Answer) -> bool:
    """``other`` asks what ``base`` asked, but maybe in another order: the same endpoint and parameters
    but for the sort column and direction (only such answers are tried as reorderings)."""
    if base.path != other.path:
        return False
    kept = [{k: v for k, v in a.params.items() if k not in ORDER_PARAMS} for a in (base, other)]
    return kept[0] == kept[1]


class Bundle:
    """The answers chosen so far, their size, and what was left out."""

    def __init__(self, client: AppClient, run: str, budget_bytes: int) -> None:
        self.client, self.run, self.budget = client, run, budget_bytes
        self.entries: list[Entry] = []
        self.used = 0
        self._keys: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._fetched: dict[tuple[str, tuple[tuple[str, str], ...]], Answer] = {}
        self._by_body: dict[bytes, int] = {}
        self.omitted: dict[str, int] = {}
        self._closed: set[str] = set()

    @staticmethod
    def _key(path: str, params: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
        return path, tuple(sorted(params.items()))

    def fetch(self, path: str, params: Params) -> Answer:
        """The server's answer (asked once per request)."""
        key = self._key(path, clean(params))
        if key not in self._fetched:
            self._fetched[key] = self.client.get(path, params)
        return self._fetched[key]

    def closed(self, group: str) -> bool:
        """True once an ask of ``group`` has not fitted (its later asks are left out unasked)."""
        return group in self._closed

    def leave_out(self, group: str) -> None:
        """Note one more ask of ``group`` left out."""
        self.omitted[group] = self.omitted.get(group, 0) + 1

    def _entry(self, answer: Answer, pending: list[Entry]) -> Entry:
        """``answer`` as an entry: a reference to an identical earlier body, a reordering of an
        earlier answer of the same endpoint, or its own body (``pending`` precede it, uncommitted)."""
        raw = escaped(answer.raw)
        every = self.entries + pending
        same = self._by_body.get(raw)
        if same is None:
            same = next((len(self.entries) + i for i, e in enumerate(pending) if e.body == raw), None)
        if same is not None:
            return Entry(answer, None, like=same)
        if answer.status == 200 and len(raw) > 256:
            body = answer.data
            for index in range(len(every) - 1, -1, -1):
                entry = every[index]
                if entry.body is None or entry.answer.status != 200 or not _reorders(entry.answer, answer):
                    continue
                found = _permutation(entry.answer.data, body)
                if found is not None:
                    return Entry(answer, None, like=index, field=found[0], order=found[1])
        return Entry(answer, raw)

    def include(self, answers: list[Answer], group: str, required: bool = False) -> bool:
        """Embed ``answers`` together when they fit the budget (all or none); else note ``group`` as
        left out.  Once a group has not fitted, later asks of it are left out without trying (they are
        of the same kind and size).  ``required`` answers that do not fit raise :class:`ReportTooLarge`."""
        fresh = [a for a in answers if self._key(a.path, a.params) not in self._keys]
        if not required and self.closed(group):
            self.leave_out(group)
            return False
        pending: list[Entry] = []
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for answer in fresh:
            key = self._key(answer.path, answer.params)
            if key not in seen:
                seen.add(key)
                pending.append(self._entry(answer, pending))
        size = sum(e.size() + 1 for e in pending)
        if self.used + size > self.budget:
            if required:
                raise ReportTooLarge(
                    f"{group} alone take {(self.used + size) / 1e6:.1f} MB, over the limit of "
                    f"{self.budget / 1e6:.1f} MB left for data (raise it with --max-size)"
                )
            self._closed.add(group)
            self.leave_out(group)
            return False
        for entry in pending:
            self._keys[self._key(entry.answer.path, entry.answer.params)] = len(self.entries)
            if entry.body is not None:
                self._by_body.setdefault(entry.body, len(self.entries))
            self.entries.append(entry)
        self.used += size
        return True

    def ask(
        self, requests: list[tuple[str, Params]], group: str, required: bool = False
    ) -> list[Answer] | None:
        """Fetch and :meth:`include` ``requests``; their answers, or None when left out."""
        if not required and self.closed(group):
            self.leave_out(group)
            return None
        answers = [self.fetch(path, params) for path, params in requests]
        return answers if self.include(answers, group, required) else None


# ---------------------------------------------------------------------------------------- the pages
def _sorts(literal: Any) -> tuple[str, ...]:
    return tuple(get_args(literal))


OPERATOR_TYPE_SORTS = _sorts(queries.OperatorTypeSort)
OPERATOR_SORTS = _sorts(queries.OperatorSort)
KERNEL_TYPE_SORTS = _sorts(queries.KernelTypeSort)
KERNEL_SORTS = _sorts(queries.KernelSort)
JOB_SORTS = _sorts(models.JobRankSort)


def table(
    path: str, base: dict[str, Any], sort: str, order: str = "desc", offset: int = 0
) -> tuple[str, Params]:
    """A page request of a server table as web/src/pages/operators.ts ``pager`` sends it."""
    return path, {**base, "offset": offset, "limit": TABLE_PAGE, "sort": sort, "order": order}


@dataclasses.dataclass
class RankPlan:
    """What a rank's pages showed when they opened: what its later asks depend on."""

    rank: int
    top_by: str
    kernels: bool
    steps: list[int]
    top_types: list[str]
    top_kernels: list[str]


def rank_pages(bundle: Bundle, rank: int, required: bool) -> RankPlan | None:
    """The requests of a rank's pages as they open (web/src/pages/{overview,findings,steps,
    operators,memory}.ts), embedded together; None when they do not fit."""
    run = bundle.run
    at = {"run": run, "rank": rank}
    overview = bundle.fetch("run/overview", at)
    top_kinds = {**at, "limit": 20, "sort": "total_ns", "order": "desc"}  # as operators.ts asks
    kinds = bundle.fetch("run/kernel-types", top_kinds)
    ov = overview.data if overview.status == 200 else {}
    top_by = ov.get("top_by", "host_self_ns")
    other = "host_self_ns" if top_by == "device_total_ns" else "device_total_ns"
    has_kernels = kinds.status == 200 and (kinds.data or {}).get("total", 0) > 0
    asks: list[tuple[str, Params]] = [
        ("run/findings", at),
        ("run/overview", at),
        ("run/step-trace", at),
        ("run/memory", at),
        ("run/kernel-types", top_kinds),
        table("run/operator-types", at, top_by),
        ("run/operator-types", {**at, "limit": 20, "sort": other, "order": "desc"}),
        table("run/operators", at, "dur_ns"),
    ]
    if has_kernels:
        asks += [table("run/kernel-types", at, "total_ns"), table("run/kernels", at, "dur_ns")]
    answers = bundle.ask(asks, f"the pages of rank {rank}" if required else OTHER_RANKS, required)
    if answers is None:
        return None
    steps = answers[2].data.get("steps", []) if answers[2].status == 200 else []
    types = answers[5].data.get("rows", []) if answers[5].status == 200 else []
    kernels = answers[-2].data.get("rows", []) if has_kernels and answers[-2].status == 200 else []
    return RankPlan(
        rank=rank,
        top_by=top_by,
        kernels=has_kernels,
        steps=[int(s["step"]) for s in steps if s.get("step") is not None],
        top_types=[str(r["name"]) for r in types[:TOP_DRILLS]],
        top_kernels=[str(r["name"]) for r in kernels[:TOP_DRILLS]],
    )


def rank_extras(bundle: Bundle, plan: RankPlan) -> None:
    """What a user reaches by clicking on a rank's pages, most useful first: single steps, the
    tables' later pages and other sort orders, the instances of the top operator types and kernels."""
    at = {"run": bundle.run, "rank": plan.rank}
    for step in plan.steps:
        bundle.ask([("run/step-trace", {**at, "step": step})], "single steps of the step trace")
    tables = [
        ("run/operator-types", plan.top_by, OPERATOR_TYPE_SORTS),
        ("run/operators", "dur_ns", OPERATOR_SORTS),
    ]
    if plan.kernels:
        tables += [
            ("run/kernel-types", "total_ns", KERNEL_TYPE_SORTS),
            ("run/kernels", "dur_ns", KERNEL_SORTS),
        ]
    for path, default, _ in tables:
        for page in range(1, DEFAULT_PAGES):
            bundle.ask([table(path, at, default, offset=page * TABLE_PAGE)], "later pages of the tables")
    for path, default, sorts in tables:
        for sort in sorts:
            for order in ("desc", "asc"):
                if (sort, order) != (default, "desc"):
                    bundle.ask([table(path, at, sort, order)], "the tables sorted by other columns")
    for name in plan.top_types:
        bundle.ask(
            [table("run/operators", {**at, "name": name}, "dur_ns")], "the instances of operator types"
        )
    for name in plan.top_kernels:
        bundle.ask([table("run/kernels", {**at, "name": name}, "dur_ns")], "the instances of kernels")


def job_pages(bundle: Bundle) -> dict[str, Any]:
    """The job pages as they open (web/src/pages/{job,job-steps,findings}.ts); returns the job
    overview (its slow ranks order the rank pages)."""
    run = bundle.run
    asks: list[tuple[str, Params]] = [
        ("job/findings", {"run": run}),
        ("job/overview", {"run": run, "limit": JOB_RANK_PAGE}),
        ("job/step-trace", {"run": run, "step": "average", "limit": JOB_RANK_PAGE}),
    ]
    answers = bundle.ask(asks, "the job pages", required=True)
    assert answers is not None
    whole = bundle.fetch("job/overview", {"run": run})  # every rank: which ranks a reader needs
    return whole.data if whole.status == 200 else {}


def _job_table(path: str, at: Params, sort: str, order: str, offset: int = 0) -> tuple[str, Params]:
    """A job table's page as the UI asks for it after a sort or a page change (job.ts, job-steps.ts)."""
    return path, {**at, "sort": sort, "order": order, "offset": offset, "limit": JOB_RANK_PAGE}


OPTIONAL_JOB_PAGES: tuple[tuple[str, tuple[tuple[str, Params], ...]], ...] = (
    ("job-time", (("job/time-overview", {}),)),
    ("job-comm", (
        ("job/communication", {"step": "all"}),
        ("job/communication",
         {"step": "all", "sort": "elapse_ns", "order": "desc", "offset": 0, "limit": 50}),
        ("job/communication/links",
         {"step": "all", "sort": "bandwidth_bytes_per_s", "order": "asc", "offset": 0, "limit": 50}),
        ("job/communication/ops",
         {"step": "all", "sort": "elapse_ns", "order": "desc", "offset": 0, "limit": 50}),
    )),
    ("job-heatmaps", (("job/heatmaps", {}),)),
)  # fmt: skip
"""Job pages carried while the budget lasts, each with the requests it makes on opening
(web/src/pages/job-time.ts, job-comm.ts's three tabs as they open, job-heatmaps.ts).  The
communication page's filters, sorts and link dialog, the matrix (its cell count follows the
window) and the card comparison ask per filter, zoom and pair of ranks as the user goes: they need
the server (a note where they would be)."""


def optional_job_pages(bundle: Bundle) -> list[str]:
    """The pages of :data:`OPTIONAL_JOB_PAGES` whose opening answers fitted and are answers, not
    errors (a job without communication has no communication page in its report)."""
    pages = []
    for page, requests in OPTIONAL_JOB_PAGES:
        asks = [(path, {"run": bundle.run, **params}) for path, params in requests]
        answers = bundle.ask(asks, f"the {page} page")
        if answers is not None and all(a.status == 200 for a in answers):
            pages.append(page)
    return pages


def job_extras(bundle: Bundle) -> None:
    """The job tables' later pages and other orders, single steps and pipeline stages of the
    cluster step trace -- each asked as the UI asks it (job.ts, job-steps.ts: a first page of
    :data:`JOB_RANK_PAGE` ranks; a sort or a page change asks with sort, order, offset and limit)."""
    run = bundle.run
    first = bundle.fetch("job/step-trace", {"run": run, "step": "average", "limit": JOB_RANK_PAGE})
    trace = first.data if first.status == 200 else {}
    total = int(trace.get("ranks_total") or 0)
    average = {"run": run, "step": "average"}
    defaults = (
        ("job/overview", {"run": run}, "duration_ns", "desc"),
        ("job/step-trace", average, "rank", "asc"),
    )
    for offset in range(JOB_RANK_PAGE, total, JOB_RANK_PAGE):
        for path, at, sort, order in defaults:
            bundle.ask([_job_table(path, at, sort, order, offset)], "later pages of the job tables")
    for sort in JOB_SORTS:
        for order in ("desc", "asc"):
            for path, at, default, default_order in defaults:
                if (sort, order) != (default, default_order):
                    bundle.ask([_job_table(path, at, sort, order)], "the job tables in other orders")
    for stage in trace.get("stages", []) if trace.get("pipeline") else []:
        at = {"run": run, "step": "average", "stage": stage, "limit": JOB_RANK_PAGE}
        bundle.ask([("job/step-trace", at)], "the cluster step trace of one stage")
    for step in trace.get("steps", []):
        if step != "average":
            at = {"run": run, "step": step, "limit": JOB_RANK_PAGE}
            bundle.ask([("job/step-trace", at)], "single steps of the cluster step trace")


def ranks_of_interest(ranks: list[int], overview: dict[str, Any]) -> list[int]:
    """The ranks in the order a reader needs their pages: the lowest, then the ranks the job pages
    point at (slow ranks, the longest step, the slowest link's ends), then the others."""
    first: list[int] = [min(ranks)]
    first += [r["rank"] for r in overview.get("slowest_ranks", []) if r.get("slow")]
    spread = overview.get("step_spread") or {}
    if spread.get("slowest_rank") is not None:
        first.append(spread["slowest_rank"])
    first += [
        r["rank"] for r in sorted(overview.get("ranks", []), key=lambda r: -(r.get("duration_ns") or 0))[:4]
    ]
    ordered = list(dict.fromkeys(r for r in first if r in ranks))
    return ordered + [r for r in ranks if r not in ordered]


@dataclasses.dataclass
class Report:
    """The embedded document of one run's report (``web/src/api.ts`` ``ReportData``)."""

    run: str
    title: str
    pages: list[str]
    ranks: list[int]
    all_ranks: list[int]
    entries: list[Entry]
    omitted: dict[str, int]

    def document(self, generated: str, version: str) -> bytes:
        doc = {
            "format": FORMAT,
            "kind": "run",
            "run": self.run,
            "title": self.title,
            "generated": generated,
            "perfsight": version,
            "pages": self.pages,
            "ranks": self.ranks,
            "all_ranks": self.all_ranks,
            "omitted": [{"what": what, "count": n} for what, n in self.omitted.items()],
            "answers": [e.document() for e in self.entries],
        }
        return escaped(orjson.dumps(doc))


def build_report(
    client: AppClient,
    run: str,
    title: str,
    status: Answer,
    budget_bytes: int,
    ranks: list[int] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Report:
    """The answers of ``run``'s report (its ``status`` answer already ready), within ``budget_bytes``
    of JSON.  ``ranks`` chooses the ranks whose pages are embedded (default: as many as fit, the
    ranks of interest first)."""
    bundle = Bundle(client, run, budget_bytes)
    bundle.include([status], "the run's status", required=True)
    all_ranks = sorted(status.data["ranks"]) or [0]
    # the document's own fields: its rank lists (a thousand ranks take kilobytes), title, left-out list
    bundle.used += 2 * len(orjson.dumps(all_ranks)) + len(escaped(orjson.dumps([run, title]))) + 2048
    job = len(all_ranks) > 1
    overview = job_pages(bundle) if job else {}
    extra_pages = optional_job_pages(bundle) if job else []
    order = [r for r in ranks if r in all_ranks] if ranks else ranks_of_interest(all_ranks, overview)
    if ranks and not order:
        raise ValueError(f"none of ranks {ranks} is a rank of this run (its ranks: {all_ranks})")
    say(f"embedding the pages of rank {order[0]}")
    plans = [rank_pages(bundle, order[0], required=True)]
    if job:
        job_extras(bundle)
    for rank in order[1:]:
        if bundle.closed(OTHER_RANKS):
            bundle.leave_out(OTHER_RANKS)  # not even asked: a thousand ranks cost no time here
            continue
        plans.append(rank_pages(bundle, rank, required=False))
    kept = [p for p in plans if p is not None]
    say(f"embedding what the pages of {len(kept)} rank(s) reach by clicking")
    for plan in kept:
        rank_extras(bundle, plan)
    pages = [*(JOB_PAGES if job else ()), *extra_pages, *RUN_PAGES]
    return Report(
        run=run,
        title=title,
        pages=pages,
        ranks=sorted(p.rank for p in kept),
        all_ranks=all_ranks,
        entries=bundle.entries,
        omitted=bundle.omitted,
    )


def compare_document(
    comparison: dict[str, Any], base: str, new: str, title: str, generated: str, version: str
) -> bytes:
    """The embedded document of ``perfsight compare BASE NEW --html``: the compare page
    (web/src/pages/compare.ts) and the one answer it asks for, ``/api/compare?base=..&new=..``,
    which is ``comparison`` (``Comparison.to_dict``, the same document the server sends), so the
    page shows what ``compare.json`` holds.  It opens on that page (``start``)."""
    params = clean({"base": base, "new": new})
    doc = {
        "format": FORMAT,
        "kind": "compare",
        "run": "",
        "title": title,
        "generated": generated,
        "perfsight": version,
        "pages": ["compare"],
        "start": {"page": "compare", "params": params},
        "ranks": [],
        "all_ranks": [],
        "omitted": [],
        "answers": [{"path": "compare", "params": params, "status": 200, "body": comparison}],
    }
    return escaped(orjson.dumps(doc))
