"""The openai SDK, as an application uses it, against batchlab's server: vLLM's sampling fields
through ``extra_body``, log-probabilities, a field the server does not know, a stream with usage,
and ``n=2`` refused with a 400 the SDK raises as ``BadRequestError``.

The SDK runs from vLLM's venv (``.venv-vllm/``, where vLLM's own OpenAI client lives; the course's
venv does not need it), in its own process. Skipped without that venv; a failure in CI.
"""

from __future__ import annotations

import json
import subprocess


from batchlab.launch import start_server, vllm_python

SCRIPT = r'''
import json, sys
from openai import BadRequestError, OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
model = client.models.list().data[0].id
out = {}
r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0.7, seed=1,
                              logprobs=3, presence_penalty=0.5, frequency_penalty=0.3,
                              extra_body={"top_k": 20, "min_p": 0.05, "min_tokens": 12, "repetition_penalty": 1.2,
                                          "a_field_from_the_future": 1})
out["completion"] = {"tokens": r.usage.completion_tokens, "logprob_tokens": len(r.choices[0].logprobs.tokens),
                     "top": [len(t) for t in r.choices[0].logprobs.top_logprobs]}
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=10,
                                   logprobs=True, top_logprobs=2, extra_body={"top_k": 5, "min_tokens": 4})
out["chat"] = {"tokens": r.usage.completion_tokens, "top": [len(t.top_logprobs) for t in r.choices[0].logprobs.content]}
chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}],
                                             max_tokens=6, stream=True, stream_options={"include_usage": True}))
out["stream"] = {"usage": chunks[-1].usage.completion_tokens}
try:
    client.completions.create(model=model, prompt="x", max_tokens=4, n=2)
    out["n2"] = "accepted"
except BadRequestError as err:
    out["n2"] = str(err)
print(json.dumps(out))
'''


def test_the_openai_sdk_sends_vllms_fields_and_reads_the_answers(vllm_ready):
    with start_server(max_num_seqs=4, max_model_len=256, threads=1) as server:
        done = subprocess.run([str(vllm_python()), "-c", SCRIPT, server.url], capture_output=True, text=True,
                              timeout=300)
        log = server.log()
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    completion = out["completion"]      # min_tokens 12 = max_tokens: exactly 12, each with its logprobs
    assert completion["tokens"] == completion["logprob_tokens"] == 12
    assert all(n in (3, 4) for n in completion["top"])             # the sampled token and the 3 most likely
    assert 4 <= out["chat"]["tokens"] <= 10 and out["chat"]["top"] == [2] * out["chat"]["tokens"]
    assert 1 <= out["stream"]["usage"] <= 6
    assert "400" in out["n2"] and "n=2" in out["n2"]
    assert "present in the request but ignored: ['a_field_from_the_future']" in log
    assert "POST /v1/completions refused 400: n=2" in log
