"""Schemathesis fuzzing of the OpenAPI spec against the app: no input makes the server fail (5xx).

Each generated request is sent twice: as generated (mostly unknown run ids: the refusal paths), and
with ``run`` replaced by a real, analysed run, so the fuzzed sort keys, windows, ids and filters
reach the query code.  Examples per operation are bounded to keep the test under a minute.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from _server_helpers import copy_into, wait_ready
from conftest import kineto_file
from perfsight.server import create_app

RUN = "run/trace.json.gz"
TRACE = "two_ranks_ws128/sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    base = tmp_path_factory.mktemp("fuzz")
    copy_into(base, kineto_file(TRACE), RUN)
    application = create_app(base, cache_dir=tmp_path_factory.mktemp("cache"))
    with TestClient(application) as client:
        assert wait_ready(client, RUN)["status"] == "ready"
        yield application


def test_no_request_makes_the_server_fail(app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    checks = [not_a_server_error, response_schema_conformance]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=checks)
            if case.query is not None and "run" in case.query:
                case.query = {**case.query, "run": RUN}
                case.call_and_validate(checks=checks)

        fuzz()
