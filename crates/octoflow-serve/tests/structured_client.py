#!/usr/bin/env python3
"""Structured output, tool calls and the API key, through the real `openai` Python client.

Usage: structured_client.py BASE_URL MODEL API_KEY   (BASE_URL like http://127.0.0.1:8080/v1)
Run by crates/octoflow/tests/serve_structured.rs against `octoflow serve --api-key API_KEY`.
Outputs are checked with the `jsonschema` package; token counts are small (CI runs on 2 cores).
Prints 'N passed, N failed' at the end and exits non-zero on the first failed check.
"""

import concurrent.futures
import json
import sys
import urllib.request

import jsonschema
import openai

base_url, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)
passed = 0


def check(cond, what):
    global passed
    if not cond:
        print(f"FAILED: {what}", flush=True)
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1


# --- the API key -------------------------------------------------------------------------
for wrong in ("wrong-key", None):
    anon = openai.OpenAI(base_url=base_url, api_key=wrong or "x", max_retries=0, timeout=60)
    if wrong is None:
        anon = openai.OpenAI(
            base_url=base_url, api_key="x", max_retries=0, timeout=60,
            default_headers={"Authorization": ""},
        )
    try:
        anon.models.list()
        check(False, f"models.list with key {wrong!r} was served")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"status {e.status_code}")
        err = e.body if isinstance(e.body, dict) else {}
        check(err.get("code") == "invalid_api_key", f"error body {e.body}")
        check(err.get("type") == "invalid_request_error", f"error type {e.body}")
health = urllib.request.urlopen(base_url.removesuffix("/v1") + "/health", timeout=30)
check(health.status == 200, "/health needs no key")
check(any(m.id == model for m in client.models.list().data), "models.list with the key")

# --- response_format: json_schema (strict) -----------------------------------------------
person = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Invent a person. Reply in JSON."}],
    max_tokens=40,
    temperature=0.7,
    seed=3,
    response_format={
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": person, "strict": True},
    },
)
text = r.choices[0].message.content
check(r.choices[0].finish_reason == "stop", f"json_schema finished: {r}")
doc = json.loads(text)
jsonschema.validate(doc, person)
check(True, "json_schema output validates")

# Streamed, the same holds for the assembled text.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Another person, as JSON."}],
    max_tokens=40,
    temperature=0.9,
    seed=5,
    stream=True,
    response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": person}},
)
parts = [c.delta.content or "" for chunk in stream for c in chunk.choices]
jsonschema.validate(json.loads("".join(parts)), person)
check(True, "streamed json_schema output validates")

# Several at once, beside an unconstrained request: the constrained draws share steps (their
# masks given while a step runs, where the engine takes late masks), each still validates.
def one(seed):
    kw = {} if seed == 0 else {
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person}},
    }
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Person number {seed}, as JSON."}],
        max_tokens=40,
        temperature=0.8,
        seed=seed,
        **kw,
    )
    return seed, r.choices[0].message.content


with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
    for seed, text in pool.map(one, [0, 11, 12]):
        if seed:
            jsonschema.validate(json.loads(text), person)
check(True, "concurrent json_schema outputs validate")

# A grammar (llguidance's Lark) on /v1/completions.
c = client.completions.create(
    model=model,
    prompt="Is the sky blue? Answer:",
    max_tokens=5,
    temperature=1.0,
    extra_body={"grammar": 'start: " yes" | " no"'},
)
check(c.choices[0].text in (" yes", " no"), f"grammar output {c.choices[0].text!r}")

# A schema llguidance cannot compile is a 400 naming response_format.
try:
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "bad", "schema": {"type": "frobnicate"}},
        },
    )
    check(False, "a bad schema was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "response_format" in str(e.body), f"bad schema: {e.body}")

# --- tools -------------------------------------------------------------------------------
weather = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": weather,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 16}},
                "required": ["city"],
            },
        },
    },
]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat.completions.create(
    model=model, messages=ask, tools=tools, tool_choice="required", max_tokens=60, temperature=0
)
msg = r.choices[0].message
check(r.choices[0].finish_reason == "tool_calls", f"finish_reason: {r}")
check(msg.tool_calls and len(msg.tool_calls) >= 1, f"tool_calls: {msg}")
call = msg.tool_calls[0]
check(call.type == "function" and call.id, f"call: {call}")
check(call.function.name in ("get_weather", "get_time"), f"name: {call}")
args = json.loads(call.function.arguments)
jsonschema.validate(args, tools[0 if call.function.name == "get_weather" else 1]["function"]["parameters"])
check(True, "required tool call's arguments validate")

# Named: the call is of that function.
r = client.chat.completions.create(
    model=model,
    messages=ask,
    tools=tools,
    tool_choice={"type": "function", "function": {"name": "get_time"}},
    max_tokens=40,
    temperature=0,
)
named = r.choices[0].message.tool_calls
check(named and named[0].function.name == "get_time", f"named call: {r}")
jsonschema.validate(json.loads(named[0].function.arguments), tools[1]["function"]["parameters"])

# Streamed: the deltas assemble into the same kind of call.
stream = client.chat.completions.create(
    model=model,
    messages=ask,
    tools=tools,
    tool_choice="required",
    max_tokens=60,
    temperature=0,
    stream=True,
)
calls, finish = {}, None
for chunk in stream:
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                slot["id"] = d.id
            if d.function and d.function.name:
                slot["name"] += d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
        if c.finish_reason:
            finish = c.finish_reason
check(finish == "tool_calls", f"streamed finish_reason {finish}")
check(calls and calls[0]["id"] and calls[0]["name"] == call.function.name, f"streamed calls {calls}")
check(json.loads(calls[0]["arguments"]) == args, f"streamed arguments {calls}")

# The call and its result go back through the template as assistant and tool messages.
history = ask + [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
        ],
    },
    {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
]
r = client.chat.completions.create(
    model=model, messages=history, tools=tools, tool_choice="none", max_tokens=6, temperature=0
)
check(isinstance(r.choices[0].message.content, str), f"reply after the tool result: {r}")
check(not r.choices[0].message.tool_calls, f"tool_choice none makes no call: {r}")

try:
    client.chat.completions.create(
        model=model, messages=ask, tools=tools,
        tool_choice={"type": "function", "function": {"name": "nope"}}, max_tokens=4,
    )
    check(False, "an unknown named tool was accepted")
except openai.BadRequestError as e:
    check("tool_choice" in str(e.body), f"unknown tool: {e.body}")

print(f"{passed} passed, 0 failed")
