#!/usr/bin/env python3
"""Soak a running `strata serve`: many concurrent streaming clients for a while, then report
errors, throughput and latency; or (--ttft) time to first token of turn 1 and turn 2 of a long
conversation, to see the prompt cache at work. Standard library only.

    strata serve --parallel 8 &
    python3 scripts/soak.py --base http://127.0.0.1:8080 --clients 32 --seconds 120

After the soak, --verify N of the answered requests (default 64, spread over the run) are sent
again one at a time: each must give the same text and token count as it did among the others
(requests are seeded, so a stream mixed with another request's or cut short shows up here).
    python3 scripts/soak.py --base http://127.0.0.1:8080 --ttft
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse


def stream_chat(base, messages, max_tokens, seed):
    """One streaming chat request: (ok, error, time to first token, total time, text, tokens,
    prompt tokens). `messages` as a string: a raw /v1/completions prompt instead (for models
    without a chat template)."""
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=600)
    raw = isinstance(messages, str)
    body = {"max_tokens": max_tokens, "stream": True, "temperature": 0.8, "seed": seed,
            "stream_options": {"include_usage": True}}
    body["prompt" if raw else "messages"] = messages
    start = time.monotonic()
    path = "/v1/completions" if raw else "/v1/chat/completions"
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return False, f"status {resp.status}: {resp.read()[:200]!r}", None, None, "", 0, 0
    first = None
    text = ""
    tokens = 0
    prompt = 0
    done = False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            return False, str(chunk["error"]), first, None, text, tokens, prompt
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
            prompt = chunk["usage"].get("prompt_tokens", 0)
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            piece += choice.get("text") or ""
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                piece += (function.get("name") or "") + (function.get("arguments") or "")
            if piece and first is None:
                first = time.monotonic() - start
            text += piece
    conn.close()
    if not done:
        return False, "stream ended without [DONE]", first, None, text, tokens, prompt
    return True, "", first, time.monotonic() - start, text, tokens, prompt


def soak(args):
    deadline = time.monotonic() + args.seconds
    lock = threading.Lock()
    results = []
    requests = []

    def client(i):
        rng = random.Random(i)
        while time.monotonic() < deadline:
            msg = [{"role": "user", "content": f"client {i} question {rng.randrange(1000)}"}]
            seed = rng.randrange(1 << 31)
            try:
                r = stream_chat(args.base, msg, args.max_tokens, seed)
            except Exception as e:  # noqa: BLE001 - every failure counts
                r = (False, f"{type(e).__name__}: {e}", None, None, "", 0, 0)
            with lock:
                results.append(r)
                requests.append((msg, seed))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    ok = [r for r in results if r[0]]
    errors = [r[1] for r in results if not r[0]]
    ttft = sorted(r[2] for r in ok if r[2] is not None)
    tokens = sum(r[5] for r in ok)
    pct = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
    print(f"{args.clients} clients, {wall:.0f} s: {len(results)} requests, {len(ok)} ok, "
          f"{len(errors)} errors")
    print(f"generated {tokens} tokens = {tokens / wall:.1f} tok/s aggregate")
    if ttft:
        print(f"time to first token: p50 {pct(ttft, 0.5) * 1000:.0f} ms, "
              f"p95 {pct(ttft, 0.95) * 1000:.0f} ms, max {ttft[-1] * 1000:.0f} ms")
    for e in sorted(set(errors))[:5]:
        print("error:", e)
    mismatches = verify(args, [(req, r) for req, r in zip(requests, results) if r[0]])
    return 1 if errors or mismatches else 0


def verify(args, answered):
    """Send up to args.verify answered requests again, one at a time; count the differences."""
    if args.verify <= 0 or not answered:
        return 0
    step = max(1, len(answered) // args.verify)
    picked = answered[::step][: args.verify]
    mismatches = 0
    for (msg, seed), r in picked:
        alone = stream_chat(args.base, msg, args.max_tokens, seed)
        if not alone[0] or alone[4] != r[4] or alone[5] != r[5]:
            mismatches += 1
            print(f"mismatch: seed {seed}: among others {r[5]} tokens {r[4][:60]!r}, "
                  f"alone {alone[5]} tokens {alone[4][:60]!r} {alone[1]}")
    print(f"verified {len(picked)} responses against the same request alone: "
          f"{len(picked) - mismatches} equal, {mismatches} different")
    return mismatches


def ttft(args):
    long_text = " ".join(f"fact {i}: the river number {i} flows north." for i in range(args.words // 8))
    if args.raw:
        messages = long_text + "\nSummarise.\n"
    else:
        messages = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": long_text + "\nSummarise."}]
    ok, err, first1, _, text, _, prompt1 = stream_chat(args.base, messages, 16, 1)
    if not ok:
        print("turn 1 failed:", err)
        return 1
    if args.raw:
        messages += text + "\nShorter, please.\n"
    else:
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "Shorter, please."}]
    ok, err, first2, _, _, _, prompt2 = stream_chat(args.base, messages, 16, 2)
    if not ok:
        print("turn 2 failed:", err)
        return 1
    print(f"turn 1 time to first token: {first1 * 1000:.0f} ms ({prompt1} prompt tokens, all computed)")
    print(f"turn 2 time to first token: {first2 * 1000:.0f} ms ({prompt2} prompt tokens, the conversation so far from the prompt cache)")
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="http://127.0.0.1:8080")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--verify", type=int, default=64,
                        help="answered requests to send again alone and compare (0: none)")
    parser.add_argument("--ttft", action="store_true", help="measure turn-2 time to first token")
    parser.add_argument("--words", type=int, default=800, help="length of the --ttft prompt")
    parser.add_argument("--raw", action="store_true",
                        help="--ttft through /v1/completions (models without a chat template)")
    args = parser.parse_args()
    raise SystemExit(ttft(args) if args.ttft else soak(args))


if __name__ == "__main__":
    main()
