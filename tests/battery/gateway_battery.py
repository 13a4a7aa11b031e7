#!/usr/bin/env python3
"""The gateway's bad-input and heavy-traffic battery (issue 43): hostile HTTP against a
live rlfleet-gateway, classifying each answer, with a health check after every case.

    python3 tests/battery/gateway_battery.py --gateway=127.0.0.1:PORT [--out=FILE]
        [--streams=70] [--only=TEXT]

Each case sends raw bytes (malformed ones included) and expects an outcome:
  refused   a 4xx answer in OpenAI's error shape (or, for a broken request line, a 4xx
            or a closed connection)
  served    a 2xx answer
  limited   some answers 2xx, the overflow 429 (the concurrency cases)
A case is BAD when the answer is not the expected one, a 5xx, no answer within its
deadline (hung), or /health does not answer 200 within 5 s afterwards (the gateway
died or is wedged). Exit status 1 on any BAD case; the table goes to --out (default
bench/results/gateway_battery.md). Only the Python standard library is used.
"""

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time

DEADLINE_S = 20.0


def connect(addr, timeout=DEADLINE_S):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    return s


def read_answer(s, deadline_s=DEADLINE_S, whole=True):
    """(status, head, body) of one answer; status 0 when the connection closed first,
    -1 when nothing came before the deadline. Reads a chunked body through its end
    when `whole`; otherwise returns once the head is in."""
    s.settimeout(deadline_s)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return (0, "", b"")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        head = head.decode("latin-1")
        try:
            status = int(head[9:12])
        except ValueError:
            status = 0
        if not whole:
            return (status, head, rest)
        lower = head.lower()
        if "content-length:" in lower:
            n = int(lower.split("content-length:")[1].split("\r\n")[0].strip())
            while len(rest) < n:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
            return (status, head, rest[:n])
        while True:  # chunked (or until close)
            if "transfer-encoding: chunked" in lower and rest.endswith(b"0\r\n\r\n"):
                break
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return (status, head, rest)
    except socket.timeout:
        return (-1, "", b"")
    except (ConnectionResetError, BrokenPipeError):
        return (0, "", b"")


def request(method, path, body=b"", headers=None, host="127.0.0.1"):
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    h = {"Host": host, "Connection": "close", "Content-Type": "application/json"}
    h.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in h.items() if v is not None]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def exchange(addr, raw, deadline_s=DEADLINE_S):
    try:
        s = connect(addr)
    except OSError:
        return (0, "", b"")
    try:
        s.sendall(raw)
    except OSError:
        pass
    answer = read_answer(s, deadline_s)
    s.close()
    return answer


def healthy(addr):
    status, _, _ = exchange(addr, request("GET", "/health"), deadline_s=5.0)
    return status == 200


def is_error_shape(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and e["message"] != ""
    except Exception:
        return False


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class Case:
    def __init__(self, name, run, expect):
        self.name, self.run, self.expect = name, run, expect


def simple(name, raw, expect="refused", deadline_s=DEADLINE_S, status=None):
    def run(ctx):
        st, head, body = exchange(ctx.addr, raw(ctx) if callable(raw) else raw, deadline_s)
        detail = f"{st} {body[:120].decode('utf-8', 'replace')}"
        if st == -1:
            return ("hung", detail)
        if status is not None:
            return ("ok" if st == status else "wrong", detail)
        if expect == "refused":
            if 400 <= st < 500 and (is_error_shape(body) or st in (400, 404, 405, 413, 414, 415)):
                return ("ok", detail)
            return ("wrong" if st < 500 else "internal", detail)
        if expect == "refused_or_closed":
            return ("ok" if st == 0 or 400 <= st < 500 else ("internal" if st >= 500 else "wrong"), detail)
        if expect == "served":
            return ("ok" if 200 <= st < 300 else "wrong", detail)
        return ("wrong", detail)

    return Case(name, run, expect)


def model_name(ctx):
    st, _, body = exchange(ctx.addr, request("GET", "/v1/models"))
    try:
        return json.loads(body)["data"][0]["id"]
    except Exception:
        return "rlfleet"


def chat_cases():
    def chat(name, body, **kw):
        return simple(name, lambda ctx: request("POST", CHAT, body.replace("MODEL", ctx.model)), **kw)

    msgs = '"messages":[{"role":"user","content":"x"}]'
    out = [
        chat("chat: content part with a numeric type (the crash)", '{"model":"MODEL","messages":[{"role":"user","content":[{"type":1}]}]}'),
        chat("chat: content part text is a number", '{"model":"MODEL","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}'),
        chat("chat: tool type is a number", '{"model":"MODEL",' + msgs + ',"tools":[{"type":7}]}'),
        chat("chat: tool function name is a number", '{"model":"MODEL",' + msgs + ',"tools":[{"type":"function","function":{"name":1}}]}'),
        chat("chat: role is a number", '{"model":"MODEL","messages":[{"role":7}]}'),
        chat("chat: message is a number", '{"model":"MODEL","messages":[1]}'),
        chat("chat: messages is an object", '{"model":"MODEL","messages":{}}'),
        chat("chat: model is a list", '{"model":["MODEL"],' + msgs + '}'),
        chat("chat: stop holds a number", '{"model":"MODEL",' + msgs + ',"stop":[1]}'),
        chat("chat: n is a string", '{"model":"MODEL",' + msgs + ',"n":"2"}'),
        chat("chat: n is 1e9", '{"model":"MODEL",' + msgs + ',"n":1000000000}'),
        chat("chat: max_tokens 1e400", '{"model":"MODEL",' + msgs + ',"max_tokens":1e400}'),
        chat("chat: temperature NaN-ish string", '{"model":"MODEL",' + msgs + ',"temperature":"NaN"}'),
        chat("chat: include_usage is a number", '{"model":"MODEL",' + msgs + ',"stream":true,"stream_options":{"include_usage":1}}'),
        chat("chat: tool_choice is an object", '{"model":"MODEL",' + msgs + ',"tool_choice":{"type":"function"}}'),
        chat("chat: tool call arguments nested 10k deep",
             '{"model":"MODEL","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"'
             + "[" * 10000 + '"}}]}]}'),
        chat("chat: body nested 100k deep", '{"model":"MODEL","messages":' + "[" * 100000 + "]" * 100000 + "}"),
        chat("chat: tools nested 5k deep", '{"model":"MODEL",' + msgs + ',"tools":' + "[" * 5000 + "]" * 5000 + "}"),
        chat("chat: invalid UTF-8 in content", '{"model":"MODEL","messages":[{"role":"user","content":"\udcff\udcfe"}]}'),
        chat("chat: unknown key", '{"model":"MODEL",' + msgs + ',"frobnicate":1}'),
        chat("chat: body is an array", "[]"),
        chat("chat: body is null", "null"),
        chat("chat: truncated body", '{"model":'),
        chat("chat: 3 MB of messages", '{"model":"MODEL","messages":[' + ",".join(['{"role":"user","content":"' + "a" * 1000 + '"}'] * 3000) + "]}"),
    ]
    return out


def completion_cases():
    def comp(name, body, **kw):
        return simple(name, lambda ctx: request("POST", COMPLETIONS, body.replace("MODEL", ctx.model)), **kw)

    return [
        comp("completions: prompt of token ids out of range", '{"model":"MODEL","prompt":[1,2147483648]}'),
        comp("completions: negative token id", '{"model":"MODEL","prompt":[-1]}'),
        comp("completions: several prompts", '{"model":"MODEL","prompt":["a","b"]}'),
        comp("completions: logprobs 5", '{"model":"MODEL","prompt":"reverse:1","logprobs":5}'),
        comp("completions: best_of 3", '{"model":"MODEL","prompt":"reverse:1","best_of":3}'),
        comp("completions: wrong model", '{"model":"other","prompt":"reverse:1"}'),
        # 100,000 letters: tokenized (the built-in tokenizer refuses them) or refused, fast
        comp("completions: 100,000-letter prompt answered within 5 s", '{"model":"MODEL","prompt":"' + "a" * 100000 + '","max_tokens":1}',
             expect="refused", deadline_s=5.0),
    ]


def http_cases():
    return [
        simple("http: garbage request line", b"BAD\r\n\r\n", expect="refused_or_closed"),
        simple("http: 9000-byte path", ("GET /" + "a" * 9000 + " HTTP/1.1\r\nHost: x\r\n\r\n").encode(), expect="refused_or_closed"),
        simple("http: Content-Length not a number", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n"),
        simple("http: Content-Length negative", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n"),
        simple("http: Content-Length and Transfer-Encoding", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        simple("http: body over the 4 MiB limit", request("POST", COMPLETIONS, b"x" * (5 << 20)), status=413),
        simple("http: a head announcing 1 GB and no body", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n", expect="refused_or_closed"),
        simple("http: unknown path", request("GET", "/v1/embeddings")),
        simple("http: wrong method", request("DELETE", COMPLETIONS)),
        simple("http: 200 headers", ("GET /health HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{i}: {i}\r\n" for i in range(200)) + "\r\n").encode(),
               expect="served"),
        simple("http: an 8200-byte header", ("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + "b" * 8200 + "\r\n\r\n").encode(),
               expect="refused_or_closed"),
        simple("http: foreign Host on a keyless gateway (DNS rebinding)",
               lambda ctx: request("POST", COMPLETIONS, '{"model":"%s","prompt":"reverse:1"}' % ctx.model, host="evil.example")),
        simple("http: text/plain POST on a keyless gateway (a web form)",
               lambda ctx: request("POST", COMPLETIONS, '{"model":"%s","prompt":"reverse:1"}' % ctx.model,
                                   headers={"Content-Type": "text/plain"})),
        simple("http: a NUL in the path", b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n", expect="refused_or_closed"),
    ]


def slowloris_case():
    def run(ctx):
        socks = []
        for _ in range(40):
            try:
                s = connect(ctx.addr)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
                socks.append(s)
            except OSError:
                break
        t0 = time.time()
        ok = healthy(ctx.addr)
        dt = time.time() - t0
        for s in socks:
            s.close()
        return ("ok" if ok else "hung", f"{len(socks)} half-sent heads held; /health in {dt:.2f} s")

    return Case("load: 40 connections holding half-sent heads; /health still answers", run, "served")


def abandon_case():
    def run(ctx):
        body = json.dumps({"model": ctx.model, "prompt": "reverse:12345", "max_tokens": 4096, "ignore_eos": True})
        for _ in range(10):
            s = connect(ctx.addr)
            s.sendall(request("POST", COMPLETIONS, body))
            time.sleep(0.05)
            s.close()  # gone before the answer: the generation must be cancelled
        return ("ok" if healthy(ctx.addr) else "hung", "10 whole-response requests abandoned")

    return Case("load: clients that leave before their whole response", run, "served")


def streams_case(n):
    def run(ctx):
        body = json.dumps({"model": ctx.model, "prompt": "reverse:12345", "max_tokens": 512, "ignore_eos": True,
                           "stream": True})
        results = [None] * n
        socks = [None] * n

        def one(i):
            try:
                s = connect(ctx.addr, timeout=60)
                socks[i] = s
                s.sendall(request("POST", COMPLETIONS, body))
                st, _, rest = read_answer(s, 60.0, whole=False)
                if st == 200:  # the first event: tokens, not an error
                    s.settimeout(60.0)
                    while b"data: " not in rest or not rest.split(b"data: ", 1)[1].count(b"\n"):
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        rest += chunk
                    if b'"error"' in rest.split(b"data: ", 1)[-1].split(b"\n", 1)[0]:
                        st = "stream error"
                results[i] = st
            except OSError:
                results[i] = 0

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        time.sleep(ctx.hold_s)  # the streams run beside the training run
        health = healthy(ctx.addr)
        for s in socks:
            if s is not None:
                s.close()
        counts = {}
        for st in results:
            counts[st] = counts.get(st, 0) + 1
        ok = health and set(counts) <= {200, 429} and counts.get(200, 0) > 0 and (n <= 64 or counts.get(429, 0) > 0)
        return ("ok" if ok else "wrong", f"{counts}; /health {'200' if health else 'FAILED'}")

    return Case(f"load: {n} concurrent heavy streams (512 tokens each, the replicas' limit) from one client", run, "limited")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--out", default="bench/results/gateway_battery.md")
    ap.add_argument("--streams", type=int, default=70)
    ap.add_argument("--hold_s", type=float, default=20.0, help="how long the heavy streams stay open")
    ap.add_argument("--only", default="")
    args = ap.parse_args()

    class Ctx:
        pass

    ctx = Ctx()
    ctx.addr = args.gateway
    ctx.hold_s = args.hold_s
    if not healthy(ctx.addr):
        print(f"gateway_battery: {ctx.addr} does not answer /health", file=sys.stderr)
        return 2
    ctx.model = model_name(ctx)
    cases = chat_cases() + completion_cases() + http_cases() + [slowloris_case(), abandon_case(),
                                                                  streams_case(args.streams)]
    cases = [c for c in cases if args.only in c.name]
    rows, bad = [], 0
    for c in cases:
        t0 = time.time()
        try:
            verdict, detail = c.run(ctx)
        except Exception as e:  # the battery's own failure is a bad case too
            verdict, detail = "error", repr(e)
        dt = time.time() - t0
        alive = healthy(ctx.addr)
        ok = verdict == "ok" and alive
        bad += not ok
        rows.append((c.name, c.expect, "ok" if ok else ("DEAD" if not alive else verdict.upper()), f"{dt:.2f}",
                     detail.replace("|", "/").replace("\n", " ")[:140]))
        print(f"{'ok  ' if ok else 'BAD '} {c.name} ({dt:.2f} s): {detail[:160]}", flush=True)
    cpu = platform.processor() or "cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(f"# Gateway battery\n\n`python3 tests/battery/gateway_battery.py --gateway=... --streams={args.streams}`"
                    f" on {time.strftime('%Y-%m-%d %H:%M')} UTC, commit {commit}, {cpu}, {os.cpu_count()} cores.\n\n")
            f.write(f"{len(rows)} cases, {len(rows) - bad} as expected, {bad} bad.\n\n")
            f.write("| case | expected | outcome | s | answer |\n|---|---|---|---|---|\n")
            for r in rows:
                f.write("| " + " | ".join(r) + " |\n")
    print(f"gateway_battery: {len(rows)} cases, {len(rows) - bad} as expected, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
