"""The flake finder (`scripts/find_flakes.py`): reading JUnit reports, tallying failures across runs, and
a real run of pytest on a test that fails every other time."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "find_flakes.py"


@pytest.fixture(scope="module")
def flakes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("find_flakes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["find_flakes"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.server.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.server.test_a" name="test_bad" time="0.2">
<failure message="AssertionError: 2 != 3">tb</failure></testcase>
<testcase classname="tests.server.test_b" name="test_err" time="0.2">
<error message="fixture broke">tb</error></testcase>
</testsuite></testsuites>
"""


def test_a_report_gives_each_case_and_its_failure(flakes: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    path.write_text(JUNIT)
    cases = flakes.read_junit(path)
    assert cases == {
        "tests.server.test_a::test_ok": None,
        "tests.server.test_a::test_bad": "AssertionError: 2 != 3",
        "tests.server.test_b::test_err": "fixture broke",
    }


def test_tally_lists_tests_that_failed_at_least_once_most_often_first(flakes: ModuleType) -> None:
    runs = [{"a": None, "b": "boom", "c": "x"}, {"a": None, "b": "boom again", "c": None}, {"a": None}]
    out = flakes.tally(runs)
    assert [(o.nodeid, o.runs, o.failures) for o in out] == [
        ("b", 2, ["boom", "boom again"]),
        ("c", 2, ["x"]),
    ]


def test_a_real_run_finds_the_test_that_fails_by_chance(
    flakes: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # a bare pytest starts quicker
    # a test that fails on its second run only: state kept in a file between the runs
    (tmp_path / "test_sometimes.py").write_text(
        "from pathlib import Path\n"
        "def test_steady():\n    pass\n"
        "def test_sometimes():\n"
        f"    mark = Path({str(tmp_path / 'count')!r})\n"
        "    n = int(mark.read_text()) if mark.exists() else 0\n"
        "    mark.write_text(str(n + 1))\n"
        "    assert n != 1, 'failed on the second run'\n"
    )
    out = tmp_path / "out"
    args = ["--runs", "2", "--out", str(out), "--", str(tmp_path / "test_sometimes.py")]
    rc = flakes.main([*args, "--rootdir", str(tmp_path), "-c", "/dev/null"])
    assert rc == 1
    report = json.loads((out / "flakes.json").read_text())
    assert report["runs"] == 2 and len(report["wall_s"]) == 2
    [failed] = report["failed"]
    assert failed["nodeid"].endswith("test_sometimes") and failed["runs"] == 2
    assert len(failed["failures"]) == 1 and "second run" in failed["failures"][0]
    assert "1 tests failed at least once" in capsys.readouterr().out
