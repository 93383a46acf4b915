"""Benchmarks beside the course: scripts that measure batchlab and print numbers, never pass or fail.

Run each from the checkout's root with the course's venv, e.g. ``.venv/bin/python
benchmarks/bench_simulator.py``; ``docs/benchmarks.md`` lists them with what each measured.
``peer/`` is the peer benchmark (``python -m benchmarks.peer``: batchlab's engines against
transformers and vLLM on one workload), which ``bench_peer.py`` checks against the project's goals.
Speed goals live here, as ratios measured side by side in one run, not in timed unit tests.
"""
