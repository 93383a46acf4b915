"""vLLM's own dashboards read batchlab's ``/metrics`` unmodified.

``tests/data/vllm_dashboards/`` holds the Grafana and Perses dashboards vLLM 0.32.0 ships under
``examples/observability/`` (its README says where from; Apache-2.0, with vLLM's LICENSE). The
test takes every PromQL query of every panel and template variable, starts a small simulated
server (no model weights: the real engine, scheduler and paged KV cache with prefix caching), sends
a few requests, scrapes ``/metrics`` and asks that every series a query names is there, with the
labels its matchers use. Then the new families are checked against each other: each number is
the engine's, not a constant standing in for one.

Against the installed vLLM (skipped without it): the histogram buckets and label values are
the ones in vLLM 0.32's source, read as text (vLLM is never imported here).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchlab.engine_args import EngineArgs
from batchlab.serve import ServerConfig, ServerThread
from batchlab.serve import metrics as m

DATA = Path(__file__).parent / "data" / "vllm_dashboards"
MODEL = "SmolLM2-135M-Instruct"
PROMPT = list(range(1000, 1000 + 64))      # 4 blocks of 16: a repeat finds 3 of them cached
# labels Prometheus or Kubernetes service discovery put on every scraped series, not the target
TARGET_LABELS = {"job", "instance", "namespace", "service", "pod"}
PROMETHEUS_OWN = {"up"}                    # series Prometheus makes itself for each target
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "le", "inf", "nan"}


# --- the dashboards' queries ---------------------------------------------------------------------
def _strings(node, keys: set[str]):
    """Every string value under one of ``keys``, anywhere in a parsed JSON or YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in keys and isinstance(v, str):
                yield v
            else:
                yield from _strings(v, keys)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, keys)


def dashboard_queries() -> dict[str, list[str]]:
    """{file: its PromQL}: Grafana panels' ``expr`` and variables' ``query`` / ``definition``
    (``label_values(...)``); Perses' ``query``."""
    out = {}
    for path in sorted(DATA.rglob("*.json")) + sorted(DATA.rglob("*.yaml")):
        doc = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
        found = [q for q in _strings(doc, {"expr", "query", "definition"})
                 if re.search(r"[a-z_:]+\s*[{(\[]", q)]        # PromQL, not a variable's option list
        out[str(path.relative_to(DATA))] = found
    return out


def series_named(query: str) -> dict[str, set[str]]:
    """{series: label names its matchers use} for every series ``query`` reads."""
    query = re.sub(r'"(?:[^"\\]|\\.)*"', '""', query)                  # label values are not names
    out: dict[str, set[str]] = {}
    for name in re.findall(r"\bvllm:[A-Za-z0-9_:]+", query):
        out.setdefault(name, set())
    for name, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", query):
        out.setdefault(name, set()).update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*[=!~]", matchers))
    for name, label in re.findall(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*([A-Za-z_]+)", query):
        out.setdefault(name, set()).add(label)
    return {k: v for k, v in out.items() if k.lower() not in PROMQL_WORDS}


def test_the_dashboards_are_there_and_name_series():
    queries = dashboard_queries()
    assert set(queries) == {"dashboards/grafana/performance_statistics.json",
                            "dashboards/grafana/query_statistics.json",
                            "dashboards/perses/performance_statistics.yaml",
                            "dashboards/perses/query_statistics.yaml",
                            "prometheus_grafana/grafana.json"}
    assert all(queries.values()), queries
    assert (DATA / "LICENSE").read_text().lstrip().startswith("Apache License")
    named = {n for qs in queries.values() for q in qs for n in series_named(q)}
    assert {"vllm:iteration_tokens_total_count", "vllm:request_max_num_generation_tokens_sum",
            "vllm:request_success_total", "up"} <= named
    assert {"finished_reason", "le", "model_name"} <= {g for qs in queries.values() for q in qs for g in grouped_by(q)}


# --- a server under a short load -----------------------------------------------------------------
@pytest.fixture(scope="module")
def scraped():
    """(samples: {sample name: [labels, ...]}, values: {(sample name, sorted label items): value})
    after 4 requests (3 of one prompt, one chat) to a simulated server with prefix caching."""
    config = ServerConfig(engine=EngineArgs(enable_prefix_caching=True, max_num_seqs=4, max_model_len=256), simulate="L4",
                          paged=True, model_name=MODEL)
    with ServerThread(config, None) as s:
        for _ in range(3):
            r = httpx.post(f"{s.url}/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": PROMPT, "max_tokens": 5})
            assert r.status_code == 200, r.text
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200, r.text
        text = httpx.get(f"{s.url}/metrics", timeout=10).text
    samples: dict[str, list[dict]] = {}
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.labels)
            values[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples, values


def value(values: dict, name: str, **labels) -> float:
    """The one sample ``name`` whose labels include ``labels`` (model_name and engine aside)."""
    found = [v for (n, ls), v in values.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def grouped_by(query: str) -> set[str]:
    """The labels ``query`` aggregates by (``sum by (le, model_name) (...)``)."""
    return {label.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", query)
            for label in group.split(",") if label.strip()}


def test_every_series_the_dashboards_query_is_on_metrics(scraped):
    """... with the labels their matchers filter on and their sums group by (``finished_reason``,
    ``le``, ``model_name``), besides those Prometheus adds to every target."""
    samples, _ = scraped
    missing, unlabelled = [], []
    for path, queries in dashboard_queries().items():
        for query in queries:
            found = set()
            for name, labels in series_named(query).items():
                if name in PROMETHEUS_OWN:
                    continue
                if name not in samples:
                    missing.append(f"{path}: {name}")
                    continue
                have = set().union(*(set(ls) for ls in samples[name])) | TARGET_LABELS
                found |= have
                if not labels <= have:
                    unlabelled.append(f"{path}: {name} lacks {sorted(labels - have)}")
            if found and not grouped_by(query) <= found:
                unlabelled.append(f"{path}: {query!r} groups by {sorted(grouped_by(query) - found)}")
    assert not missing, missing
    assert not unlabelled, unlabelled


def test_the_series_vllms_newer_panels_use_are_there_too(scraped):
    """The issue's list (vLLM's later dashboards read them; every one is in vLLM 0.32's logger)."""
    samples, values = scraped
    reasons = {ls["finished_reason"] for ls in samples["vllm:request_success_total"]}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}     # the success-rate panel's divisor
    assert {ls["sleep_state"] for ls in samples["vllm:engine_sleep_state"]} == {"awake", "weights_offloaded",
                                                                                "discard_all"}
    assert value(values, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert {ls["reason"] for ls in samples["vllm:num_requests_waiting_by_reason"]} == {"capacity", "deferred"}
    for name in ("vllm:prompt_tokens_cached_total", "vllm:iteration_tokens_total_bucket",
                 "vllm:request_max_num_generation_tokens_bucket", "vllm:prompt_tokens_by_source_total",
                 "vllm:prompt_tokens_cached_by_source_total", "vllm:admission_rejections_total"):
        assert name in samples, name
    assert [ls["reason"] for ls in samples["vllm:admission_rejections_total"]] == ["max_waiting"]


def test_the_new_numbers_are_the_engines(scraped):
    """4 requests, no preemption: every step's tokens add up to the prompts' computed tokens plus
    every output token but each request's last (sampled, never fed back)."""
    _, values = scraped
    prompt, generated = value(values, "vllm:prompt_tokens_total"), value(values, "vllm:generation_tokens_total")
    cached = value(values, "vllm:prompt_tokens_cached_total")
    finished = value(values, "vllm:request_success_total", finished_reason="length")
    assert finished == 4 and generated == 3 * 5 + 3
    assert cached == 2 * 48 == value(values, "vllm:prefix_cache_hits_total")      # 3 of 4 blocks, twice
    assert value(values, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached
    assert value(values, "vllm:prompt_tokens_by_source_total", source="local_compute") == prompt - cached
    assert value(values, "vllm:prompt_tokens_cached_by_source_total", source="device") == cached
    assert value(values, "vllm:iteration_tokens_total_sum") == prompt - cached + generated - finished
    assert value(values, "vllm:iteration_tokens_total_count") == generated      # one at a time: a token a step
    assert value(values, "vllm:request_max_num_generation_tokens_count") == 4
    assert value(values, "vllm:request_max_num_generation_tokens_sum") == generated
    assert value(values, "vllm:num_requests_waiting_by_reason", reason="capacity") == value(
        values, "vllm:num_requests_waiting") == 0
    for reason in ("error", "repetition", "abort"):
        assert value(values, "vllm:request_success_total", finished_reason=reason) == 0


def test_a_failed_engine_counts_its_requests_in_error():
    """The engine thread fails mid-request: the client gets 500, and ``finished_reason="error"``
    counts the request (vLLM's meaning: a request-level internal error, always a 500)."""
    config = ServerConfig(engine=EngineArgs(max_num_seqs=2, max_model_len=128), simulate="L4", model_name=MODEL)
    with ServerThread(config, None) as s:
        backend, calls = s.runner.backend, []
        run = backend.run

        def fail_on_third_step(plan, requests):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("the device fell over (a test)")
            return run(plan, requests)
        backend.run = fail_on_third_step
        r = httpx.post(f"{s.url}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": PROMPT[:8], "max_tokens": 6, "stream": False})
        assert r.status_code == 500 and "the device fell over" in r.json()["error"]["message"]
        text = httpx.get(f"{s.url}/metrics", timeout=10).text
    values = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
              for family in text_string_to_metric_families(text) for sample in family.samples}
    assert value(values, "vllm:request_success_total", finished_reason="error") == 1
    assert value(values, "vllm:iteration_tokens_total_count") == 2 == value(values, "vllm:generation_tokens_total")


# --- against vLLM's source ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_source(vllm_ready) -> Path:
    """The installed vLLM's package folder (found without importing it)."""
    from batchlab.launch.vllm import _clean_env
    from batchlab.launch import vllm_python
    out = subprocess.run([str(vllm_python()), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
                         capture_output=True, text=True, timeout=60, env=_clean_env(), check=True)
    return Path(out.stdout.strip()).parent


def _assigned(path: Path) -> dict:
    """Module-level constants of a source file, as literals."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
            try:
                out[target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def test_buckets_and_labels_are_vllms(vllm_source):
    buckets = _assigned(vllm_source / "v1" / "metrics" / "buckets.py")
    for name in ("REQUEST_LATENCY_BUCKETS", "TIME_TO_FIRST_TOKEN_BUCKETS", "INTER_TOKEN_LATENCY_BUCKETS",
                 "ITERATION_TOKENS_BUCKETS"):
        assert tuple(getattr(m, name)) == tuple(buckets[name]), name
    assert m.request_tokens_buckets(1024) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    loggers = (vllm_source / "v1" / "metrics" / "loggers.py").read_text()
    flat = re.sub(r'"\s*\n\s*"', "", loggers)                          # help texts split over lines, joined
    for _, name, doc, _ in m.HISTOGRAMS:
        assert re.search(rf'name="{re.escape(name)}",\s*documentation="{re.escape(doc)}"', loggers), name
    for doc in (m.WAITING_REASON_DOC, m.SLEEP_STATE_DOC, m.CACHED_BY_SOURCE_DOC):
        assert doc in flat, doc
    assert _assigned(vllm_source / "v1" / "metrics" / "loggers.py")["ADMISSION_REASONS"] == (
        "max_num_queued_reqs", "max_num_queued_tokens")                    # neither is batchlab's rule
    engine = (vllm_source / "v1" / "engine" / "__init__.py").read_text()
    assert all(f"{r.upper()} = " in engine for r in m.FINISH_REASONS)
    stats = (vllm_source / "v1" / "metrics" / "stats.py").read_text()
    assert all(f'"{s}"' in stats for s in m.PROMPT_TOKEN_SOURCES)
    assert all(f'"{r}"' in loggers for r in m.WAITING_REASONS)
    assert re.search(r"sleep_state = \[\s*" + r",\s*".join(f'"{s}"' for s in m.SLEEP_STATES) + r"\s*\]", loggers)
    sources = (vllm_source / "v1" / "metrics" / "cache_hit_source.py").read_text()
    assert re.findall(r'^\s+[A-Z0-9_]+ = "([a-z_0-9]+)"', sources, re.M) == list(m.CACHE_HIT_SOURCES)
