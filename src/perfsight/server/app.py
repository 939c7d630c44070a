"""The FastAPI application of ``perfsight serve``: routes, parameters and error mapping.

Why routes only: discovery, analysis jobs, queries and the timeline each live in their own module;
this one turns HTTP parameters into calls and results into the response models of ``models``
(documented for people in docs/API.md).  Every route is GET: the server only reads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from perfsight import __version__
from perfsight.server import (
    compare,
    data_prep,
    findings,
    job_comm,
    job_matrix,
    job_pages,
    job_parallel,
    job_strategy,
    job_views,
    models,
    pages,
    queries,
    timeline,
)
from perfsight.server.kernel_types import op_type_kernels_page, op_type_page
from perfsight.server.registry import (
    READ_ERRORS,
    SAVED_FOLDER,
    DamagedAnalysis,
    NotReady,
    OpenedRun,
    Registry,
    UnknownRun,
)
from perfsight.server.security import SecurityMiddleware, inside
from perfsight.server.static import STATIC_DIR, static_response

RunParam = Annotated[str, Query(description="run id from /api/runs", min_length=1, max_length=4096)]
RankParam = Annotated[int | None, Query(description="rank (default: the lowest)", ge=0, le=1_000_000)]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000)]
Limit = Annotated[int, Query(ge=1, le=queries.MAX_LIMIT)]
Order = Annotated[Literal["asc", "desc"], Query()]
Fuzzy = Annotated[str | None, Query(max_length=200, description="fuzzy filter on names")]
TimeNs = Annotated[int, Query(ge=-(2**62), le=2**62, description="ns relative to the run's origin_ns")]
StepParam = Annotated[int | None, Query(ge=-1, le=2**31 - 1)]
OpName = Annotated[str | None, Query(max_length=10_000, description="an op's exact name (FP/BP point)")]
RanksParam = Annotated[str | None, Query(max_length=20_000, description="ranks shown: N,N,... (default all)")]
CommStep = Annotated[str, Query(description='"all" or a step number', max_length=32)]
ParallelStep = Annotated[
    str | None, Query(description="a step number; default the second profiled", max_length=32)
]
CommRankFilter = Annotated[int | None, Query(ge=0, le=1_000_000)]
CommText = Annotated[str | None, Query(max_length=1000)]
RankOffset = Annotated[int, Query(ge=0, le=job_pages.ALL_RANKS, description="first rank row of the page")]
RankLimit = Annotated[int, Query(ge=1, le=job_pages.ALL_RANKS, description="rank rows per page")]

ERRORS = {
    400: {"model": models.ErrorBody, "description": "parameters that contradict each other"},
    404: {"model": models.ErrorBody, "description": "unknown run, rank or event"},
    409: {"model": models.ErrorBody, "description": "run not analysed yet (its status is included)"},
}


def fast_json(body: Any) -> Response:
    """``body`` as JSON without a second validation pass: for large responses (thousands of steps,
    tracks, window columns) pydantic would take longer than the query.  Their shapes are still
    declared in OpenAPI and checked against it by the fuzzing test."""
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def documented(model: type[Any]) -> dict[str, Any]:
    """Route arguments declaring ``model`` as the 200 response of a route that returns :func:`fast_json`."""
    return {
        "response_class": JSONResponse,
        "responses": {**ERRORS, 200: {"model": model, "description": "OK"}},
    }


def check_window(start_ns: int, end_ns: int) -> None:
    """A time window must not be empty or reversed (400: the parameters contradict each other)."""
    if end_ns <= start_ns:
        raise HTTPException(400, "end_ns must be greater than start_ns")


def warm_up() -> None:
    """Start DuckDB and import what pyarrow loads lazily (pandas, datasets) now: seconds that would
    otherwise stall a user's first click."""
    import pandas  # noqa: F401  (pyarrow imports it on the first pa.array/pa.table of Python data)
    import pyarrow.dataset  # noqa: F401

    queries.database()


CACHE_DIR_ENV = "PERFSIGHT_CACHE_DIR"


def default_cache_dir() -> Path:
    """Where the server keeps the analyses it makes: ``$PERFSIGHT_CACHE_DIR``, else the XDG cache
    (``$XDG_CACHE_HOME/perfsight``, else ``~/.cache/perfsight``).  Never the served folders: the
    server only reads them (``perfsight analyse --out`` is the way to write outputs beside the data)."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "perfsight"


def create_app(
    base_dir: str | Path,
    token: str | None = None,
    *,
    cache_dir: str | Path | None = None,
    allowed_hosts: frozenset[str] | None = None,
    static_dir: Path = STATIC_DIR,
) -> FastAPI:
    """The app serving the runs under ``base_dir``; ``token`` (if given) is required on every request.

    ``allowed_hosts`` restricts the Host header (DNS-rebinding protection for a loopback server).
    """
    base = Path(base_dir).resolve()
    if not base.is_dir():
        raise ValueError(f"{base_dir}: not a folder")
    warm_up()
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    registry = Registry(base, cache_root)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        registry.jobs.stop()  # a running analysis child must not outlive the server
        queries.close()  # the table pages' spill folder goes with it

    app = FastAPI(
        lifespan=lifespan,
        title="perfsight",
        version=__version__,
        description="Read-only API of perfsight serve. Times in ns, sizes in bytes; see docs/API.md.",
        default_response_class=JSONResponse,
        docs_url=None,  # Swagger UI loads scripts from a CDN, which the CSP (rightly) forbids
        redoc_url=None,
    )
    app.state.registry = registry
    app.add_middleware(SecurityMiddleware, token=token, allowed_hosts=allowed_hosts)

    @app.exception_handler(UnknownRun)
    async def _unknown(_: Request, error: UnknownRun) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=404)

    @app.exception_handler(job_pages.NoClusterAnalysis)
    async def _no_cluster(_: Request, error: job_pages.NoClusterAnalysis) -> JSONResponse:
        return JSONResponse({"detail": registry.public(str(error))}, status_code=404)

    @app.exception_handler(findings.NoFindings)
    async def _no_findings(_: Request, error: findings.NoFindings) -> JSONResponse:
        return JSONResponse({"detail": registry.public(str(error))}, status_code=404)

    @app.exception_handler(queries.QueryTooLarge)
    async def _too_large(_: Request, error: queries.QueryTooLarge) -> JSONResponse:
        detail = f"this request needs more memory than the server may use: {error}"
        return JSONResponse({"detail": detail}, status_code=503)

    @app.exception_handler(NotReady)
    async def _not_ready(_: Request, error: NotReady) -> JSONResponse:
        return JSONResponse({"detail": str(error), "status": error.status.model_dump()}, status_code=409)

    async def _damaged(request: Request, error: Exception) -> JSONResponse:
        """A file of a run's analysis that cannot be read (a corrupt or truncated table): that
        analysis is set aside and the run analysed again (409 with the new status, which the UI
        polls), or, with no trace to analyse, the run is failed with a message naming the file."""
        run = request.query_params.get("run")
        if not request.url.path.startswith(("/api/run/", "/api/job/")) or not run:
            raise error  # not a run's files: a fault of the server itself (500)
        status = await run_in_threadpool(registry.damaged, run, error)
        detail = f"run {run!r}: its analysis could not be read; it is now {status.status}"
        return JSONResponse({"detail": detail, "status": status.model_dump()}, status_code=409)

    for damage in (*READ_ERRORS, DamagedAnalysis):
        app.add_exception_handler(damage, _damaged)

    def opened(run: str, rank: int | None = None) -> OpenedRun:
        """The analysed run; with ``rank``, once that is known to be one of its ranks (else 404)."""
        data = registry.opened(run)
        if rank is not None:
            data.rank(rank)
        return data

    def table_page(
        view: queries.TableView,
        run: str,
        rank: int | None,
        q: str | None,
        name: str | None,
        step: int | None,
        sort: str,
        order: str,
        offset: int,
        limit: int,
    ) -> dict:
        """One page of a table endpoint: the four share this, and differ only in their view."""
        data = opened(run)
        return queries.view_page(
            view, data.rank(rank).table_path(view.table), origin_ns=data.origin_ns, q=q, name=name, step=step,
            sort=sort, order=order, offset=offset, limit=limit,
        )  # fmt: skip

    # ------------------------------------------------------------------ runs
    @app.get("/api/info", response_model=models.Info)
    def info() -> models.Info:
        return models.Info(version=__version__, base_dir_name=base.name, auth=token is not None)

    @app.get("/api/runs", response_model=models.RunList)
    def runs() -> models.RunList:
        return models.RunList(runs=[registry.run_info(r) for r in registry.runs().values()])

    @app.get("/api/run/status", response_model=models.RunStatus, responses=ERRORS)
    def status(run: RunParam) -> models.RunStatus:
        """Status of a run; starts its analysis when it is new or stale (this is 'opening' it)."""
        return registry.status(registry.run(run), start=True)

    # ------------------------------------------------------------------ pages
    @app.get("/api/run/overview", **documented(models.Overview))
    def overview(run: RunParam, rank: RankParam = None) -> Response:
        data = opened(run)
        return Response(pages.overview_json(data, data.rank(rank)), media_type="application/json")

    @app.get("/api/run/step-trace", **documented(models.StepTrace))
    def step_trace(
        run: RunParam,
        rank: RankParam = None,
        step: StepParam = None,
        fp_point: OpName = None,
        bp_point: OpName = None,
    ) -> Response:
        data = opened(run)
        return fast_json(pages.step_trace(data, data.rank(rank), step, fp_point, bp_point))

    @app.get("/api/run/operator-types", response_model=models.OperatorTypePage, responses=ERRORS)
    def operator_types(
        run: RunParam,
        rank: RankParam = None,
        q: Fuzzy = None,
        sort: queries.OperatorTypeSort = "host_self_ns",
        order: Order = "desc",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> dict:
        return table_page(queries.OPERATOR_TYPES, run, rank, q, None, None, sort, order, offset, limit)

    @app.get("/api/run/operators", response_model=models.OperatorPage, responses=ERRORS)
    def operators(
        run: RunParam,
        rank: RankParam = None,
        q: Fuzzy = None,
        name: Annotated[str | None, Query(max_length=10_000, description="exact operator type")] = None,
        step: StepParam = None,
        sort: queries.OperatorSort = "dur_ns",
        order: Order = "desc",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> dict:
        return table_page(queries.OPERATORS, run, rank, q, name, step, sort, order, offset, limit)

    @app.get("/api/run/kernel-types", response_model=models.KernelTypePage, responses=ERRORS)
    def kernel_types(
        run: RunParam,
        rank: RankParam = None,
        q: Fuzzy = None,
        sort: queries.KernelTypeSort = "total_ns",
        order: Order = "desc",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> dict:
        by_type = op_type_page(opened(run).rank(rank), q, sort, order, offset, limit)
        if by_type is not None:  # Ascend / MindSpore ops: per op type and core, not per graph node
            return by_type
        return table_page(queries.KERNEL_TYPES, run, rank, q, None, None, sort, order, offset, limit)

    @app.get("/api/run/kernels", response_model=models.KernelPage, responses=ERRORS)
    def kernels(
        run: RunParam,
        rank: RankParam = None,
        q: Fuzzy = None,
        name: Annotated[str | None, Query(max_length=10_000, description="exact kernel name")] = None,
        step: StepParam = None,
        sort: queries.KernelSort = "dur_ns",
        order: Order = "desc",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> dict:
        if name is not None:  # a row of the per-op-type table (Ascend / MindSpore ops): its kernels
            data = opened(run)
            args = (data.rank(rank), data.origin_ns, q, name, step, sort, order, offset, limit)
            by_type = op_type_kernels_page(*args)
            if by_type is not None:
                return by_type
        return table_page(queries.KERNELS, run, rank, q, name, step, sort, order, offset, limit)

    @app.get("/api/run/memory", **documented(models.Memory))
    def memory(
        run: RunParam,
        rank: RankParam = None,
        points: Annotated[int, Query(ge=10, le=20_000)] = 2000,
        top: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> Response:
        data = opened(run)
        return fast_json(pages.memory(data, data.rank(rank), points, top))

    @app.get("/api/run/data-prep", **documented(models.DataPrep))
    def data_prep_page(run: RunParam, rank: RankParam = None) -> Response:
        data = opened(run)
        return fast_json(data_prep.data_prep(data, data.rank(rank)))

    @app.get(
        "/api/run/trace-view",
        responses={**ERRORS, 200: {"content": {"application/json": {}}, "description": "trace_view.json"}},
        response_class=FileResponse,
    )
    def trace_view(run: RunParam, rank: RankParam = None) -> Response:
        data = opened(run).rank(rank)
        target = inside(
            data.output_dir / "trace_view.json", [registry.discovery.base, registry.discovery.cache_dir]
        )
        if target is None or not target.is_file():
            raise HTTPException(404, f"run {run!r} rank {data.rank} has no trace_view.json")
        return FileResponse(
            target, media_type="application/json", filename=f"trace_view_rank{data.rank}.json"
        )

    # ------------------------------------------------------------------ timeline
    @app.get("/api/run/timeline/tracks", **documented(models.Tracks))
    def tracks(run: RunParam, rank: RankParam = None) -> Response:
        data = opened(run, rank)
        marks = timeline.step_marks(data, None if rank is None else {rank})
        return fast_json(
            {
                "run": data.run.id,
                "origin_ns": data.origin_ns,
                "origin_ns_text": str(data.origin_ns),
                "end_ns": data.end_ns,
                "ranks": sorted(data.ranks),
                "kinds": timeline.kind_names(),
                "tracks": timeline.track_list(data, rank),
                "steps": marks,
                "steps_span": timeline.steps_span(marks),
            }
        )

    def chosen_ranks(text: str | None) -> set[int] | None:
        try:
            return timeline.parse_ranks(text)
        except ValueError as error:
            raise HTTPException(400, str(error)) from None

    @app.get("/api/run/timeline/window", **documented(models.Window))
    def window(
        run: RunParam,
        start_ns: TimeNs,
        end_ns: TimeNs,
        width_px: Annotated[int, Query(ge=1, le=10_000)],
        rank: RankParam = None,
        tracks: Annotated[str | None, Query(max_length=100_000, description="RANK:TRACK,...")] = None,
        ranks: RanksParam = None,
    ) -> Response:
        check_window(start_ns, end_ns)
        try:
            chosen = timeline.parse_tracks(tracks)
        except ValueError as error:
            raise HTTPException(400, str(error)) from None
        data = opened(run, rank)
        return fast_json(timeline.window(data, start_ns, end_ns, width_px, rank, chosen, chosen_ranks(ranks)))

    @app.get("/api/run/timeline/event", response_model=models.EventDetail, responses=ERRORS)
    def event(run: RunParam, id: Annotated[int, Query(ge=0, le=2**62)], rank: RankParam = None) -> dict:
        data = opened(run)
        try:
            return timeline.event(data, rank, id)
        except KeyError:
            raise HTTPException(404, f"no event {id} in rank {data.rank(rank).rank}") from None

    @app.get("/api/run/timeline/search", response_model=models.SearchResult, responses=ERRORS)
    def search(
        run: RunParam,
        q: Annotated[str, Query(min_length=1, max_length=200)],
        rank: RankParam = None,
        offset: Offset = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        ranks: RanksParam = None,
    ) -> dict:
        data = opened(run, rank)
        total, hits = timeline.search(data, q, rank, offset, limit, chosen_ranks(ranks))
        return {"query": q, "total": total, "offset": offset, "limit": limit, "hits": hits}

    @app.get("/api/run/timeline/flows", **documented(models.Flows))
    def flows(
        run: RunParam,
        start_ns: TimeNs,
        end_ns: TimeNs,
        rank: RankParam = None,
        limit: Annotated[int, Query(ge=1, le=20_000)] = 2000,
        ranks: RanksParam = None,
    ) -> Response:
        check_window(start_ns, end_ns)
        data = opened(run, rank)
        total, found = timeline.flows(data, start_ns, end_ns, rank, limit, chosen_ranks(ranks))
        return fast_json({"total": total, "truncated": total > len(found), "flows": found})

    # ------------------------------------------------------------------ UI
    # ------------------------------------------------------------------ job pages
    def job_source(run: str) -> tuple[Path | None, Path]:
        data = registry.ready_job(run)  # the job's outputs only: its ranks are not opened
        return data.root, data.run.output_root / SAVED_FOLDER

    @app.get("/api/job/overview", **documented(models.JobOverview))  # a row per rank: fast_json
    def job_overview(
        run: RunParam,
        sort: Annotated[models.JobRankSort, Query()] = "duration_ns",
        order: Order = "desc",
        offset: RankOffset = 0,
        limit: RankLimit = job_pages.ALL_RANKS,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_pages.overview(run, root, saved, sort, order, offset, limit))

    @app.get("/api/job/step-trace", **documented(models.JobStepTrace))
    def job_step_trace(
        run: RunParam,
        step: Annotated[str, Query(description='"average" or a step number', max_length=32)] = "average",
        stage: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
        sort: Annotated[models.JobRankSort, Query()] = "rank",
        order: Order = "asc",
        offset: RankOffset = 0,
        limit: RankLimit = job_pages.ALL_RANKS,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_pages.step_trace(run, root, saved, step, stage, sort, order, offset, limit))

    @app.get("/api/job/heatmaps", **documented(models.JobHeatmaps))
    def job_heatmaps(run: RunParam) -> Response:
        """Seed 002's memory and FLOPs heatmaps: one cell per rank, by host (a thousand cells:
        sent without a second validation pass)."""
        root, saved = job_source(run)
        return fast_json(job_views.heatmaps(run, root, saved))

    @app.get("/api/job/time-overview", response_model=models.JobTimeOverview, responses=ERRORS)
    def job_time_overview(run: RunParam) -> dict:
        """Seed 000's time overview: per step, the ranks' step times with mean communication and wait."""
        root, saved = job_source(run)
        return job_views.time_overview(run, root, saved)

    # job communication and matrix (logic in job_comm, job_matrix)

    @app.get("/api/job/communication", **documented(models.JobCommunication))
    def job_communication(
        run: RunParam,
        step: CommStep = "all",
        sort: Annotated[models.CommRankSort, Query()] = "rank",
        order: Order = "asc",
        offset: Offset = 0,
        limit: Annotated[int, Query(ge=1, le=1_000_000)] = 1_000_000,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_comm.ranks(run, root, saved, step, sort, order, offset, limit))

    @app.get("/api/job/communication/links", **documented(models.CommLinkPage))
    def job_links(
        run: RunParam,
        step: CommStep = "all",
        rank: CommRankFilter = None,
        src: CommRankFilter = None,
        dst: CommRankFilter = None,
        link_type: CommText = None,
        op: CommText = None,
        group: CommText = None,
        sort: Annotated[models.CommLinkSort, Query()] = "bandwidth_bytes_per_s",
        order: Order = "asc",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_comm.links(
            root, saved, step=step, rank=rank, src=src, dst=dst, link_type=link_type, op=op, group=group,
            sort=sort, order=order, offset=offset, limit=limit,
        ))  # fmt: skip

    @app.get("/api/job/communication/ops", **documented(models.CommOpPage))
    def job_comm_ops(
        run: RunParam,
        step: CommStep = "all",
        rank: CommRankFilter = None,
        op: CommText = None,
        group: CommText = None,
        q: Fuzzy = None,
        sort: Annotated[models.CommOpSort, Query()] = "elapse_ns",
        order: Order = "desc",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_comm.ops(
            root, saved, step=step, rank=rank, op=op, group=group, q=q, sort=sort, order=order,
            offset=offset, limit=limit,
        ))  # fmt: skip

    @app.get("/api/job/communication/matrix", **documented(models.CommMatrix))
    def job_matrix_page(
        run: RunParam,
        metric: Annotated[models.CommMetric, Query()] = "bandwidth",
        step: CommStep = "all",
        op: CommText = None,
        group: CommText = None,
        cells: Annotated[int, Query(ge=1, le=job_matrix.MAX_CELLS, description="blocks a side to fit")] = 256,
        src_lo: CommRankFilter = None,
        src_hi: CommRankFilter = None,
        dst_lo: CommRankFilter = None,
        dst_hi: CommRankFilter = None,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_matrix.matrix(
            run, root, saved, metric=metric, step=step, op=op, group=group, cells=cells,
            src_lo=src_lo, src_hi=src_hi, dst_lo=dst_lo, dst_hi=dst_hi,
        ))  # fmt: skip

    # parallel execution views: pipeline chart and Marey view (logic in job_parallel)
    @app.get("/api/job/pipeline", **documented(models.JobPipeline))
    def job_pipeline(run: RunParam, step: ParallelStep = None) -> Response:
        root, saved = job_source(run)
        return fast_json(job_parallel.pipeline(run, root, saved, step))

    # parallel-strategy page: tree, execution graph, module table (logic in job_strategy)
    @app.get("/api/job/strategy", response_model=models.JobStrategy, responses=ERRORS)
    def job_strategy_tree(run: RunParam) -> dict:
        root, saved = job_source(run)
        return job_strategy.strategy(run, root, saved)

    @app.get("/api/job/strategy/graph", **documented(models.JobStrategyGraph))
    def job_strategy_graph(
        run: RunParam,
        step: ParallelStep = None,
        per_rank_limit: Annotated[
            int, Query(ge=0, le=100_000, description="nodes of more ranks: no per-rank lists")
        ] = (job_strategy.PER_RANK_LIMIT),
    ) -> Response:
        root, _ = job_source(run)
        return fast_json(job_strategy.graph(run, root, step, per_rank_limit))

    @app.get("/api/job/strategy/node", response_model=models.StrategyNode, responses=ERRORS)
    def job_strategy_node(
        run: RunParam, step: Annotated[str, Query(pattern=r"^\d{1,9}$")], stage: int, node: int
    ) -> dict:
        root, _ = job_source(run)
        return job_strategy.node(run, root, step, stage, node)

    @app.get("/api/job/strategy/modules", response_model=models.JobModules, responses=ERRORS)
    def job_strategy_modules(run: RunParam) -> dict:
        root, _ = job_source(run)
        return job_strategy.modules(run, root)

    @app.get("/api/job/marey", **documented(models.JobMarey))
    def job_marey(
        run: RunParam,
        step: ParallelStep = None,
        px: Annotated[
            int, Query(ge=50, le=8000, description="pixels across the window")
        ] = job_parallel.MAREY_PX,
        start_ns: Annotated[
            int | None, Query(ge=0, description="window start, ns from the step's start")
        ] = None,
        end_ns: Annotated[int | None, Query(ge=1, description="window end, ns from the step's start")] = None,
        unfold: Annotated[
            str | None, Query(max_length=4096, description="stages drawn per device: 0,2")
        ] = None,
        first: Annotated[int, Query(ge=0, description="first device row drawn")] = 0,
    ) -> Response:
        root, saved = job_source(run)
        return fast_json(job_parallel.marey(run, root, saved, step, px, start_ns, end_ns, unfold, first))

    @app.get("/api/run/findings", response_model=models.Findings, responses=ERRORS)
    def run_findings(run: RunParam, rank: RankParam = None) -> dict:
        """The advisor's findings of one rank, as its analysis wrote them (most important first)."""
        return findings.rank_findings(opened(run), rank)

    @app.get("/api/job/findings", response_model=models.Findings, responses=ERRORS)
    def job_findings(run: RunParam) -> dict:
        """The advisor's findings of a job (its job rules and its ranks'), most important first."""
        return findings.job_findings(registry.ready_job(run))

    # ------------------------------------------------------------------ run-vs-run comparison
    @app.get("/api/compare", **documented(models.Comparison))
    def compare_runs(
        base: RunParam,
        new: RunParam,
        base_rank: RankParam = None,
        new_rank: RankParam = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
    ) -> Response:
        """NEW against BASE (two runs, or two ranks of one run): docs/COMPARE.md."""
        try:
            return fast_json(compare.comparison(opened(base), base_rank, opened(new), new_rank, limit))
        except compare.CompareInputError as error:  # an analysis without the tables a comparison reads
            raise HTTPException(404, registry.public(str(error))) from None

    @app.get("/api/{rest:path}", include_in_schema=False)
    def api_not_found(rest: str) -> JSONResponse:
        return JSONResponse({"detail": "no such API endpoint"}, status_code=404)

    @app.get("/{path:path}", include_in_schema=False)
    def ui(path: str) -> Response:
        return static_response(path, static_dir)

    return app
