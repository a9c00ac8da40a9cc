#!/usr/bin/env python3
"""The real `openai` Python client against a running `octoflow serve`.

Usage: openai_client.py BASE_URL MODEL   (BASE_URL like http://127.0.0.1:8080/v1)
Run by crates/octoflow/tests/serve.rs. Exits non-zero on the first failed check; prints
'N passed, N failed' at the end. Token counts are small: the CI server runs the CPU reference.
"""

import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
passed = 0


def check(cond, what):
    global passed
    if not cond:
        print(f"FAILED: {what}", flush=True)
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1


models = client.models.list()
check(any(m.id == model for m in models.data), f"models.list has {model}: {models}")

messages = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
text = r.choices[0].message.content
check(r.object == "chat.completion", f"object: {r.object}")
check(isinstance(text, str) and text, f"chat text: {r}")
check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason: {r}")
check(r.usage.completion_tokens <= 4 and r.usage.prompt_tokens > 0, f"usage: {r.usage}")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")

stream = client.chat.completions.create(
    model=model,
    messages=messages,
    max_tokens=4,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
parts, usage, finish = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(parts) == text, f"streamed chat {''.join(parts)!r} == {text!r}")
check(finish in ("stop", "length"), f"streamed finish_reason {finish}")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"usage {usage}")

c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0)
check(c.object == "text_completion" and c.choices[0].text, f"completion: {c}")
streamed = "".join(
    ch.choices[0].text
    for ch in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=3, temperature=0, stream=True
    )
    if ch.choices
)
check(streamed == c.choices[0].text, f"streamed completion {streamed!r} == {c.choices[0].text!r}")

lp = client.chat.completions.create(
    model=model, messages=messages, max_tokens=2, temperature=0, logprobs=True, top_logprobs=2
)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens and len(content[0].top_logprobs) == 2, f"logprobs {lp}")

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=1)
    check(False, "unknown model accepted")
except openai.NotFoundError as e:
    check(e.status_code == 404, f"404: {e}")
try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=7)
    check(False, "temperature 7 accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "temperature" in str(e), f"400: {e}")

print(f"{passed} passed, 0 failed")
