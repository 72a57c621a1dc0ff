"""Both front ends, one verdict: the hostile-artifact cases of tests/test_hostile_files.py and
tests/test_hostile_plans.py, run again with each refusal Python gives held against the C++
front end's (samples/cpp's aotc_run on the same artifact): the same error class, and no payload
run (tests/hostile.py assert_same_verdict). No case is expected to differ: the C++ front end
checks each entry's plan (plans/<entry>.json) and manifest entry by the rules Python's schema
defines (runtime/cpp/frontend/plan_check.cpp, tables generated into rules.h) and holds the
runner file it runs against that plan (runner_match.cpp).
"""
from __future__ import annotations

import shutil

import pytest

import hostile
from test_hostile_files import *  # noqa: F401,F403 - the same cases, collected again here
from test_hostile_plans import *  # noqa: F401,F403

pytestmark = [pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake"),
              pytest.mark.slow]


@pytest.fixture(autouse=True)
def _parity(aotc_run, monkeypatch):
    monkeypatch.setattr(hostile, "CPP_FRONT_END", aotc_run)
