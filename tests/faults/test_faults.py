"""The fault suite as tests: one test per case of tests/faults (scripts/faults.py prints the same cases
as a table). Each case injects one fault and checks the outcome: a clear error or a recovery, and
no document lost or duplicated against an uninterrupted run."""

from __future__ import annotations

import pytest

from faults import cases_local, cases_ray, cases_s3, fuzz  # noqa: F401 - they register the cases
from faults.harness import CASES, Env, run_case


@pytest.fixture(scope="module")
def env(tmp_path_factory, s3_server):
    e = Env(tmp_path_factory.mktemp("faults"), s3_server)
    yield e
    e.close()


def _cases():
    for cid, c in CASES.items():
        yield pytest.param(cid, marks=[pytest.mark.faults, *(getattr(pytest.mark, m) for m in c.marks)], id=cid)


@pytest.mark.parametrize("case_id", list(_cases()))
def test_fault(env, case_id, request):
    if "ray" in CASES[case_id].marks:
        request.getfixturevalue("ray_session")  # one Ray per test session: the in-process cases join it
    row = run_case(CASES[case_id], env)
    print(f"{row.fault}\n  observed: {row.observed}\n  lost {row.lost}, duplicated {row.duplicated}, {row.seconds:.1f}s")
    assert row.ok, "\n".join(row.problems)
