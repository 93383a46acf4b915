"""scripts/test.sh's two passes: the modules named to run two at a time are real test modules, and
the test command runs both passes and reports them."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    """A module by its file: `import conftest` names whichever conftest.py pytest loaded last
    (notebooks/ has one too when both folders are collected)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PARALLEL_MODULES = _load("tests_conftest", ROOT / "tests" / "conftest.py").PARALLEL_MODULES


def test_every_module_named_to_run_two_at_a_time_exists():
    modules = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    assert PARALLEL_MODULES <= modules, sorted(PARALLEL_MODULES - modules)
    # the tests that start servers on the wall clock and compare latencies stay in the second pass
    assert not {"test_router_loopback", "test_serve_simulated", "test_vllm_tuning", "test_vllm_bench"} & PARALLEL_MODULES


def test_the_test_command_runs_both_passes_and_reports_the_slowest():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert '-m parallel -n "${BATCHLAB_TEST_WORKERS:-2}"' in script and '-m "not parallel" --nbval-lax' in script
    assert "scripts/slowest_tests.py" in script and "--top 25 --files 10" in script


def test_the_report_lists_the_slowest_across_passes(tmp_path, capsys):
    report = _load("slowest_tests", ROOT / "scripts" / "slowest_tests.py")
    (tmp_path / "a.xml").write_text('<testsuites><testsuite><testcase classname="tests.test_x" name="fast" time="1.5"/>'
                                    '<testcase classname="tests.test_x" name="slow" time="9.0"><failure/></testcase>'
                                    "</testsuite></testsuites>")
    (tmp_path / "b.xml").write_text('<testsuite><testcase classname="nb" name="Cell 3" time="4.0"/></testsuite>')
    assert report.main([str(tmp_path / "a.xml"), str(tmp_path / "b.xml"), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "a.xml: 2 tests, 10 s of test time, 1 passed, 1 failed" in out
    lines = out.splitlines()
    assert lines[-2].endswith("tests.test_x::slow  (failed)") and lines[-1].endswith("nb::Cell 3")
    assert report.main([str(tmp_path / "a.xml"), str(tmp_path / "b.xml"), "--files", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "the 1 test files that took longest:" and lines[-1] == "    10.5 s  tests.test_x  (2 tests)"
    assert report.main([str(tmp_path / "missing.xml")]) == 2
