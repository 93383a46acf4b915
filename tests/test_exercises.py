"""Every exercise checker accepts its worked solution and rejects a wrong answer."""

import importlib.util
from pathlib import Path

import pytest

from batchlab.exercises import all_exercises, verdict

ROOT = Path(__file__).resolve().parent.parent


def _solutions():
    table = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        spec = importlib.util.spec_from_file_location(f"solutions_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, solve in module.SOLUTIONS.items():
            table[name] = (solve, module.WRONG[name])
    return table


SOLUTIONS = _solutions()


def test_every_exercise_has_a_solution():
    assert set(all_exercises()) == set(SOLUTIONS), "checkers and solutions must match one to one"


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_passes_and_wrong_answer_fails(name):
    solve, wrong = SOLUTIONS[name]
    assert verdict(name, solve()).ok
    assert not verdict(name, wrong).ok
    assert verdict(name, None).status == "not attempted"
