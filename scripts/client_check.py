#!/usr/bin/env python3
"""Acceptance check of a running `strata serve` with the official `openai` and `anthropic` clients,
raw HTTP (SSE framing, CORS, 404s) and a batch of malformed requests.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install openai anthropic
    /tmp/venv/bin/python scripts/client_check.py --base http://127.0.0.1:8080 [--api-key KEY] [--tools]

`--tools` expects a server whose model always answers with tool calls (the scripted fake server:
`STRATA_FAKE_ADDR=127.0.0.1:8099 cargo test --test accept_server -- --ignored serve_scripted_fake`)
and checks that the clients parse them. Prints PASS/FAIL per check; exits 1 if any failed.
"""

import argparse
import http.client
import json
import sys
import time
import traceback
import urllib.parse

import anthropic
import openai

RESULTS = []


def check(name):
    def wrap(fn):
        def run():
            try:
                fn()
                RESULTS.append((name, True, ""))
                print(f"PASS {name}", flush=True)
            except Exception as e:  # noqa: BLE001 - any failure is a FAIL line
                detail = f"{type(e).__name__}: {e}"
                RESULTS.append((name, False, detail))
                print(f"FAIL {name}: {detail}", flush=True)
                if ARGS.verbose:
                    traceback.print_exc()

        run()  # a check runs where it is declared
        return run

    return wrap


def expect(cond, message):
    if not cond:
        raise AssertionError(message)


def raw(method, path, body=None, headers=None, read_body=True):
    """One HTTP request; returns (status, headers dict, body bytes)."""
    url = urllib.parse.urlparse(ARGS.base)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=120)
    hdrs = {}
    if ARGS.api_key:
        hdrs["Authorization"] = f"Bearer {ARGS.api_key}"
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    try:
        conn.request(method, path, body=body, headers=hdrs)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered (e.g. 413) before reading the whole body: read that answer
    resp = conn.getresponse()
    data = resp.read() if read_body else b""
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


USER = [{"role": "user", "content": "Say hello."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}


def openai_checks(client):
    @check("openai models.list")
    def _():
        models = client.models.list()
        expect(len(models.data) == 1 and models.data[0].id, models)

    @check("openai models.retrieve")
    def _():
        name = client.models.list().data[0].id
        expect(client.models.retrieve(name).id == name, name)
        try:
            client.models.retrieve("no-such-model")
        except openai.NotFoundError:
            return
        raise AssertionError("no 404 for an unknown model")

    @check("openai chat plain")
    def _():
        r = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=8)
        expect(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r)
        expect(r.choices[0].message.role == "assistant", r)
        expect(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r)
        expect(r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0, r.usage)
        expect(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
        expect(r.usage.prompt_tokens_details.cached_tokens is not None, r.usage)

    @check("openai chat max_tokens (legacy)")
    def _():
        r = client.chat.completions.create(model="m", messages=USER, max_tokens=3)
        expect(r.usage.completion_tokens <= 3, r.usage)

    @check("openai chat stream + include_usage")
    def _():
        stream = client.chat.completions.create(
            model="m", messages=USER, max_completion_tokens=8, stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        expect(chunks, "no chunks")
        ids = {c.id for c in chunks}
        expect(len(ids) == 1, f"chunk ids differ: {ids}")
        expect(all(c.object == "chat.completion.chunk" for c in chunks), "object")
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        expect(len(finishes) == 1, f"finish reasons: {finishes}")
        expect(chunks[-1].usage is not None and chunks[-1].choices == [], chunks[-1])
        expect(chunks[-1].usage.completion_tokens <= 8, chunks[-1].usage)

    @check("openai chat stream without usage")
    def _():
        chunks = list(client.chat.completions.create(
            model="m", messages=USER, max_completion_tokens=4, stream=True))
        expect(all(c.usage is None for c in chunks), "usage sent without include_usage")

    @check("openai seed reproducibility (temperature 1)")
    def _():
        a = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=16, seed=1234, temperature=1.0)
        b = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=16, seed=1234, temperature=1.0)
        expect(a.choices[0].message.content == b.choices[0].message.content, (a, b))
        expect((a.choices[0].message.model_extra or {}).get("reasoning_content") ==
               (b.choices[0].message.model_extra or {}).get("reasoning_content"), "reasoning differs")

    @check("openai seed stream == non-stream")
    def _():
        a = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=12, seed=7)
        text = ""
        for c in client.chat.completions.create(model="m", messages=USER, max_completion_tokens=12, seed=7, stream=True):
            if c.choices and c.choices[0].delta.content:
                text += c.choices[0].delta.content
        expect(text == (a.choices[0].message.content or ""), (text, a.choices[0].message.content))

    @check("openai stop + sampling params")
    def _():
        r = client.chat.completions.create(
            model="m", messages=USER, max_completion_tokens=8, stop=["\n", "zzz"],
            temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.2,
            extra_body={"top_k": 10, "min_p": 0.05, "repetition_penalty": 1.1},
        )
        expect("zzz" not in (r.choices[0].message.content or ""), r)

    @check("openai reasoning_effort low/none")
    def _():
        for effort in ("low", "none", "high"):
            client.chat.completions.create(model="m", messages=USER, max_completion_tokens=4, reasoning_effort=effort)

    @check("openai n=2 -> 400 BadRequestError")
    def _():
        try:
            client.chat.completions.create(model="m", messages=USER, max_completion_tokens=4, n=2)
        except openai.BadRequestError as e:
            expect(e.status_code == 400 and "n" in str(e.message), e)
            expect(isinstance(e.body, dict) and e.body.get("message"), e.body)
            return
        raise AssertionError("no error")

    for choice in ("auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}):
        @check(f"openai tools tool_choice={json.dumps(choice)}")
        def _():
            r = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                tools=[WEATHER_TOOL], tool_choice=choice, max_completion_tokens=8,
                parallel_tool_calls=False,
            )
            expect(r.choices, r)

    @check("openai tool_choice undefined tool -> 400")
    def _():
        try:
            client.chat.completions.create(
                model="m", messages=USER, tools=[WEATHER_TOOL], max_completion_tokens=4,
                tool_choice={"type": "function", "function": {"name": "nope"}})
        except openai.BadRequestError as e:
            expect("nope" in str(e), e)
            return
        raise AssertionError("no error")

    @check("openai tool history round trip")
    def _():
        msgs = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER_TOOL], max_completion_tokens=4)

    @check("openai content parts")
    def _():
        client.chat.completions.create(model="m", max_completion_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": " hi"}]}])

    @check("openai completions.create")
    def _():
        r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, seed=3)
        expect(r.object == "text_completion" and r.choices[0].text is not None, r)
        expect(r.usage.completion_tokens <= 8, r.usage)

    @check("openai completions stream")
    def _():
        chunks = list(client.completions.create(model="m", prompt="Once", max_tokens=6, stream=True,
                                                stream_options={"include_usage": True}))
        expect(chunks and chunks[-1].usage is not None, chunks[-1:])

    @check("openai stream disconnect then next request works")
    def _():
        stream = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=2000,
                                                stream=True, extra_body={"ignore_eos": True})
        for i, _chunk in enumerate(stream):
            if i >= 3:
                break
        stream.close()
        time.sleep(0.5)
        r = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=4)
        expect(r.choices, r)
        status, _, body = raw("GET", "/metrics")
        expect(status == 200, status)
        running = [l for l in body.decode().splitlines() if l.startswith("strata_requests_running ")]
        expect(not running or running[0].endswith(" 0"), running)


def openai_tool_checks(client):
    @check("openai tool calls (fake) non-stream")
    def _():
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                           tools=[WEATHER_TOOL], max_completion_tokens=300)
        calls = r.choices[0].message.tool_calls
        expect(calls and r.choices[0].finish_reason == "tool_calls", r)
        for c in calls:
            expect(c.id.startswith("call_") and c.type == "function", c)
            expect(isinstance(json.loads(c.function.arguments), dict), c)
        expect(len({c.id for c in calls}) == len(calls), "duplicate ids")

    @check("openai tool calls (fake) stream accumulate by index")
    def _():
        calls = {}
        finish = None
        for c in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                                tools=[WEATHER_TOOL], max_completion_tokens=300, stream=True):
            if not c.choices:
                continue
            finish = c.choices[0].finish_reason or finish
            for tc in c.choices[0].delta.tool_calls or []:
                expect(tc.index is not None, tc)
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["args"] += tc.function.arguments
        expect(calls and finish == "tool_calls", (calls, finish))
        for slot in calls.values():
            expect(slot["id"] and slot["name"] == "get_weather", slot)
            expect(isinstance(json.loads(slot["args"]), dict), slot)

    @check("openai chat.completions.stream helper (fake tools)")
    def _():
        with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                            tools=[WEATHER_TOOL], max_completion_tokens=300) as stream:
            for _event in stream:
                pass
            final = stream.get_final_completion()
        calls = final.choices[0].message.tool_calls
        expect(calls and all(json.loads(c.function.arguments) for c in calls), final)

    @check("openai tool calls (fake) parallel_tool_calls=false keeps one")
    def _():
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                           tools=[WEATHER_TOOL], max_completion_tokens=300, parallel_tool_calls=False)
        expect(len(r.choices[0].message.tool_calls or []) == 1, r)


RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Weather forecast for a city",
                  "parameters": WEATHER_TOOL["function"]["parameters"]}


def responses_checks(client, tools_mode):
    """The Responses API (`/v1/responses`), and the agent extras on chat: logprobs, structured output."""
    if tools_mode:
        @check("openai responses.create function_call items (fake)")
        def _():
            r = client.responses.create(model="m", input="Weather?", tools=[RESPONSES_TOOL],
                                        max_output_tokens=300)
            calls = [o for o in r.output if o.type == "function_call"]
            expect(calls, r.output)
            for c in calls:
                expect(c.name == "get_weather" and c.call_id.startswith("call_"), c)
                expect(isinstance(json.loads(c.arguments), dict), c)

        @check("openai responses.stream function_call arguments (fake)")
        def _():
            with client.responses.stream(model="m", input="Weather?", tools=[RESPONSES_TOOL],
                                         max_output_tokens=300) as stream:
                kinds = [e.type for e in stream]
                final = stream.get_final_response()
            expect("response.function_call_arguments.delta" in kinds, kinds)
            calls = [o for o in final.output if o.type == "function_call"]
            expect(calls and all(json.loads(c.arguments) for c in calls), final.output)
        return

    @check("openai responses.create text")
    def _():
        r = client.responses.create(model="m", input="Say hello.", max_output_tokens=8)
        expect(r.object == "response" and r.id.startswith("resp_"), r)
        expect(r.status in ("completed", "incomplete"), r.status)
        expect(isinstance(r.output_text, str), r)
        expect(r.usage.output_tokens <= 8 and r.usage.input_tokens > 0, r.usage)

    @check("openai responses.stream events and final text")
    def _():
        with client.responses.stream(model="m", input="Say hello.", max_output_tokens=8) as stream:
            events = list(stream)
            final = stream.get_final_response()
        kinds = [e.type for e in events]
        expect(kinds[0] == "response.created", kinds[:3])
        expect(kinds[-1] == "response.completed", kinds[-3:])
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        expect(deltas == final.output_text, (deltas, final.output_text))
        numbers = [e.sequence_number for e in events]
        expect(numbers == sorted(numbers), numbers)

    @check("openai responses previous_response_id continues the conversation")
    def _():
        first = client.responses.create(model="m", input="Say hello.", max_output_tokens=8)
        second = client.responses.create(model="m", input="Again.", previous_response_id=first.id,
                                         max_output_tokens=8)
        expect(second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage))
        try:
            client.responses.create(model="m", input="x", previous_response_id="resp_missing")
        except openai.BadRequestError:
            return
        raise AssertionError("no 400 for an unknown previous_response_id")

    @check("openai responses function_call_output input")
    def _():
        r = client.responses.create(model="m", tools=[RESPONSES_TOOL], max_output_tokens=8, input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": json.dumps({"city": "Paris"})},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
        ])
        expect(r.status in ("completed", "incomplete"), r)

    @check("openai chat logprobs + top_logprobs")
    def _():
        r = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=6,
                                           logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content
        expect(len(content) == r.usage.completion_tokens, (len(content), r.usage))
        for t in content:
            expect(t.logprob <= 0 and len(t.top_logprobs) == 2, t)
            expect(t.top_logprobs[0].logprob >= t.logprob - 1e-6, t)

    @check("openai chat response_format json_schema is enforced")
    def _():
        schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                                   "score": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["answer", "score"], "additionalProperties": False}
        r = client.chat.completions.create(
            model="m", messages=USER, max_completion_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
        value = json.loads(r.choices[0].message.content)
        expect(value["answer"] in ("yes", "no") and 0 <= value["score"] <= 9, value)


def anthropic_checks(client, tools_mode):
    msgs = [{"role": "user", "content": "Say hello."}]

    @check("anthropic messages.create plain")
    def _():
        r = client.messages.create(model="m", max_tokens=8, messages=msgs)
        expect(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), r)
        expect(r.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), r)
        expect(r.usage.output_tokens <= 8, r.usage)

    @check("anthropic system + stop_sequences + sampling")
    def _():
        client.messages.create(model="m", max_tokens=8, messages=msgs, system="be brief",
                               stop_sequences=["zzz"],
                               # newer clients dropped the sampling keywords; the API still takes them
                               extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20})
        client.messages.create(model="m", max_tokens=8, messages=msgs,
                               system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])

    @check("anthropic tools")
    def _():
        r = client.messages.create(model="m", max_tokens=300 if tools_mode else 8,
                                   messages=[{"role": "user", "content": "Weather in Paris?"}],
                                   tools=[ANTHROPIC_TOOL], tool_choice={"type": "auto"})
        if tools_mode:
            uses = [b for b in r.content if b.type == "tool_use"]
            expect(uses and r.stop_reason == "tool_use", r)
            expect(all(isinstance(u.input, dict) and u.id.startswith("toolu_") for u in uses), uses)

    @check("anthropic tool_use/tool_result history")
    def _():
        client.messages.create(model="m", max_tokens=4, tools=[ANTHROPIC_TOOL], messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "need tool", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ])

    @check("anthropic thinking enabled")
    def _():
        r = client.messages.create(model="m", max_tokens=16, messages=msgs,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
        for b in r.content:
            expect(b.type in ("thinking", "text", "tool_use"), b)

    @check("anthropic messages.stream events + get_final_message")
    def _():
        with client.messages.stream(model="m", max_tokens=300 if tools_mode else 16, messages=msgs,
                                    thinking={"type": "enabled", "budget_tokens": 1024},
                                    tools=[ANTHROPIC_TOOL] if tools_mode else anthropic.NOT_GIVEN) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        expect(kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds)
        expect(final.stop_reason is not None and final.usage.output_tokens >= 0, final)
        if tools_mode:
            uses = [b for b in final.content if b.type == "tool_use"]
            expect(uses and all(isinstance(u.input, dict) and u.input for u in uses), final)

    @check("anthropic assistant prefill is continued")
    def _():
        r = client.messages.create(model="m", max_tokens=4, messages=msgs + [
            {"role": "assistant", "content": "Hello"}])
        expect(all(b.type != "thinking" for b in r.content), r)

    @check("anthropic messages.count_tokens")
    def _():
        r = client.messages.count_tokens(model="m", messages=msgs, system="be brief", tools=[ANTHROPIC_TOOL])
        expect(r.input_tokens > 0, r)

    @check("anthropic beta.messages.create")
    def _():
        r = client.beta.messages.create(model="m", max_tokens=4, messages=msgs, betas=["interleaved-thinking-2025-05-14"])
        expect(r.type == "message", r)

    @check("anthropic error shape (bad role)")
    def _():
        try:
            client.messages.create(model="m", max_tokens=4, messages=[{"role": "system", "content": "x"}])
        except anthropic.BadRequestError as e:
            expect(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body)
            return
        raise AssertionError("no error")


def raw_checks():
    if ARGS.api_key:
        @check("wrong API key -> 401 in both formats; /health open")
        def _():
            try:
                openai.OpenAI(base_url=ARGS.base + "/v1", api_key="wrong", max_retries=0).models.list()
                raise AssertionError("openai: no 401")
            except openai.AuthenticationError:
                pass
            try:
                anthropic.Anthropic(base_url=ARGS.base, api_key="wrong", max_retries=0).messages.create(
                    model="m", max_tokens=2, messages=USER)
                raise AssertionError("anthropic: no 401")
            except anthropic.AuthenticationError as e:
                expect(e.body["error"]["type"] == "authentication_error", e.body)
            url = urllib.parse.urlparse(ARGS.base)
            conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=30)
            conn.request("GET", "/health")
            expect(conn.getresponse().status == 200, "health needs no key")

    @check("SSE framing (data lines, blank lines, [DONE], headers)")
    def _():
        status, headers, body = raw("POST", "/v1/chat/completions",
                                    {"messages": USER, "max_tokens": 4, "stream": True})
        expect(status == 200, status)
        expect(headers.get("content-type", "").startswith("text/event-stream"), headers)
        expect(headers.get("cache-control") == "no-cache", headers)
        expect(headers.get("x-accel-buffering") == "no", headers)
        text = body.decode()
        expect(text.endswith("data: [DONE]\n\n"), text[-60:])
        for block in text.split("\n\n"):
            if block:
                expect(all(l.startswith("data: ") or l.startswith(":") for l in block.split("\n")), block)

    @check("anthropic SSE framing (event + data)")
    def _():
        status, headers, body = raw("POST", "/v1/messages",
                                    {"messages": USER, "max_tokens": 4, "stream": True})
        expect(status == 200 and headers["content-type"].startswith("text/event-stream"), headers)
        blocks = [b for b in body.decode().split("\n\n") if b and not b.startswith(":")]
        for b in blocks:
            lines = b.split("\n")
            expect(lines[0].startswith("event: ") and lines[1].startswith("data: "), b)
            expect(json.loads(lines[1][6:])["type"] == lines[0][7:], b)

    @check("CORS preflight")
    def _():
        status, headers, _ = raw("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        expect(status in (200, 204), status)
        expect(headers.get("access-control-allow-origin") in ("*", "http://localhost:3000"), headers)
        status, headers, _ = raw("GET", "/v1/models", headers={"Origin": "http://localhost:3000"})
        expect(headers.get("access-control-allow-origin"), headers)

    @check("unknown routes -> 404 JSON (GET, HEAD, POST)")
    def _():
        for method in ("GET", "POST"):
            status, headers, body = raw(method, "/v1/nope")
            expect(status == 404 and json.loads(body)["error"]["message"], (method, status, body))
        status, _, _ = raw("HEAD", "/v1/nope", read_body=False)
        expect(status == 404, status)

    @check("/health and /metrics")
    def _():
        status, _, body = raw("GET", "/health")
        expect(status == 200 and json.loads(body)["status"] == "ok", body)
        status, headers, body = raw("GET", "/metrics")
        expect(status == 200 and "text/plain" in headers["content-type"] and b"# TYPE" in body, body[:200])


def malformed_checks():
    big = 2 ** 40
    oa = "/v1/chat/completions"
    an = "/v1/messages"
    good_oa = {"messages": USER, "max_tokens": 4}
    good_an = {"messages": USER, "max_tokens": 4}
    cases = [
        ("invalid JSON", oa, b"{not json", None),
        ("truncated JSON", oa, b'{"messages": [', None),
        ("JSON array body", oa, b"[1,2]", None),
        ("empty body", oa, b"", None),
        ("trailing garbage", oa, json.dumps(good_oa).encode() + b"xx", None),
        ("missing messages", oa, {"max_tokens": 4}, None),
        ("empty messages", oa, {"messages": []}, None),
        ("messages not array", oa, {"messages": "hi"}, None),
        ("message not object", oa, {"messages": [3]}, None),
        ("unknown role", oa, {"messages": [{"role": "wizard", "content": "x"}]}, None),
        ("role missing", oa, {"messages": [{"content": "x"}]}, None),
        ("content number", oa, {"messages": [{"role": "user", "content": 5}]}, None),
        ("unknown content part", oa, {"messages": [{"role": "user", "content": [{"type": "video", "x": 1}]}]}, None),
        ("image part", oa, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
        ("max_tokens 0", oa, {**good_oa, "max_tokens": 0}, None),
        ("max_tokens -5", oa, {**good_oa, "max_tokens": -5}, None),
        ("max_tokens huge", oa, {**good_oa, "max_tokens": big}, None),
        ("max_tokens string", oa, {**good_oa, "max_tokens": "10"}, None),
        ("max_tokens float", oa, {**good_oa, "max_tokens": 1.5}, None),
        ("max_completion_tokens 0", oa, {**good_oa, "max_completion_tokens": 0}, None),
        ("temperature -1", oa, {**good_oa, "temperature": -1}, None),
        ("temperature 'NaN'", oa, {**good_oa, "temperature": "NaN"}, None),
        ("temperature 1e999", oa, b'{"messages":[{"role":"user","content":"x"}],"temperature":1e999}', None),
        ("top_p 2", oa, {**good_oa, "top_p": 2}, None),
        ("top_p -0.1", oa, {**good_oa, "top_p": -0.1}, None),
        ("top_k string", oa, {**good_oa, "top_k": "x"}, None),
        ("seed string", oa, {**good_oa, "seed": "abc"}, None),
        ("stream string", oa, {**good_oa, "stream": "yes"}, None),
        ("stop number", oa, {**good_oa, "stop": 5}, None),
        ("n 0", oa, {**good_oa, "n": 0}, None),
        ("tools not array", oa, {**good_oa, "tools": {"type": "function"}}, None),
        ("tool without name", oa, {**good_oa, "tools": [{"type": "function", "function": {}}]}, None),
        ("tool_choice undefined tool", oa, {**good_oa, "tools": [WEATHER_TOOL],
                                            "tool_choice": {"type": "function", "function": {"name": "nope"}}}, None),
        ("tool_choice bad string", oa, {**good_oa, "tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, None),
        ("tool_choice required without tools", oa, {**good_oa, "tool_choice": "required"}, None),
        ("reasoning_effort bogus", oa, {**good_oa, "reasoning_effort": "ultra"}, None),
        ("tool_calls arguments not JSON", oa, {"messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, None),
        ("prompt over context", oa, {"messages": [{"role": "user", "content": "word " * 200000}], "max_tokens": 4}, None),
        ("20 MB body", oa, b'{"messages":[{"role":"user","content":"' + b"a" * (20 * 1024 * 1024) + b'"}]}', None),
        ("non-UTF-8 bytes", oa, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', None),
        ("lone surrogate escape", oa, b'{"messages":[{"role":"user","content":"\\ud800"}]}', None),
        ("temperature 1e300", oa, b'{"messages":[{"role":"user","content":"x"}],"temperature":1e300}', None),
        ("top_k -5", oa, {**good_oa, "top_k": -5.5}, None),
        ("wrong content-type", oa, json.dumps(good_oa).encode(), {"Content-Type": "text/plain"}),
        ("form content-type (curl -d)", an, json.dumps(good_an).encode(), {"Content-Type": "application/x-www-form-urlencoded"}),
        ("completions prompt missing", "/v1/completions", {"max_tokens": 4}, None),
        ("completions prompt number", "/v1/completions", {"prompt": 5}, None),
        ("completions token id out of vocab", "/v1/completions", {"prompt": [99999999], "max_tokens": 2}, None),
        ("completions empty prompt", "/v1/completions", {"prompt": ""}, None),
        ("anthropic no max_tokens", an, {"messages": USER}, None),
        ("anthropic max_tokens 0", an, {**good_an, "max_tokens": 0}, None),
        ("anthropic system role in messages", an, {**good_an, "messages": [{"role": "system", "content": "x"}]}, None),
        ("anthropic content block unknown", an, {**good_an, "messages": [{"role": "user", "content": [{"type": "weird"}]}]}, None),
        ("anthropic tools not array", an, {**good_an, "tools": "x"}, None),
        ("anthropic tool_choice bad", an, {**good_an, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "maybe"}}, None),
        ("anthropic tool_choice unknown tool", an, {**good_an, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, None),
        ("anthropic thinking bad", an, {**good_an, "thinking": {"type": "sometimes"}}, None),
        ("anthropic temperature string", an, {**good_an, "temperature": "hot"}, None),
        ("anthropic invalid JSON", an, b"{", None),
        ("count_tokens missing messages", "/v1/messages/count_tokens", {"model": "m"}, None),
    ]
    for name, path, body, headers in cases:
        @check(f"malformed: {name} -> 4xx")
        def _(name=name, path=path, body=body, headers=headers):
            status, hdrs, data = raw("POST", path, body if isinstance(body, (bytes, dict, list)) else body,
                                     headers=headers or ({"Content-Type": "application/json"} if isinstance(body, bytes) else None))
            expect(400 <= status < 500, f"status {status}: {data[:300]!r}")
            err = json.loads(data)
            if path.startswith("/v1/messages"):
                expect(err.get("type") == "error" and err["error"]["type"] and err["error"]["message"], err)
                msg = err["error"]["message"]
            else:
                expect(err["error"]["message"] and err["error"]["type"], err)
                msg = err["error"]["message"]
            expect(len(msg) > 10, msg)
            print(f"     {status} {msg[:150]}")

    @check("server still serves after malformed batch")
    def _():
        status, _, body = raw("POST", oa, good_oa)
        expect(status == 200, (status, body[:200]))


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--tools", action="store_true", help="server always emits tool calls (fake)")
    parser.add_argument("--only", default="", help="comma list of: openai,responses,anthropic,raw,malformed")
    parser.add_argument("-v", "--verbose", action="store_true")
    ARGS = parser.parse_args()
    key = ARGS.api_key or "unused"
    only = set(filter(None, ARGS.only.split(",")))
    oa = openai.OpenAI(base_url=ARGS.base + "/v1", api_key=key, max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=ARGS.base, api_key=key, max_retries=0, timeout=300)
    if ARGS.tools:
        openai_tool_checks(oa)
        responses_checks(oa, True)
        anthropic_checks(an, True)
    else:
        if not only or "openai" in only:
            openai_checks(oa)
        if not only or "responses" in only:
            responses_checks(oa, False)
        if not only or "anthropic" in only:
            anthropic_checks(an, False)
        if not only or "raw" in only:
            raw_checks()
        if not only or "malformed" in only:
            malformed_checks()
    failed = [r for r in RESULTS if not r[1]]
    print(f"\n{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


ARGS = None
if __name__ == "__main__":
    main()
