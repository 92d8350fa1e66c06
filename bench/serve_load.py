"""Load on ``planner serve``, loopback only, bounded in count and time.

    python bench/serve_load.py [--cpus 0,1] [--estimates 500 --estimate-concurrency 50]
                               [--plans 40 --plan-concurrency 8] [--runs 3]

Starts the server in its own process (pinned to ``--cpus`` with taskset where given), then per run:
``--estimates`` estimate requests ``--estimate-concurrency`` at a time, ``--plans`` plan requests
``--plan-concurrency`` at a time (a few different scenarios), and a malformed-request storm
(truncated JSON, wrong types, unknown keys, 10 MB bodies). Prints latency p50/p95/p99 per kind
(medians over the runs), errors (non-2xx on good requests, anything but 413/422 on bad ones), the
server's peak resident memory (VmHWM), and whether it still answers after the storm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time

import httpx

ESTIMATE = {"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 4096, "micro_batch": 1},
            "layout": {"gpu": "h100", "gpus": 1}}
PLANS = [
    {"model": "llama-3.1-70b", "workload": {"method": "qlora", "seq_len": 4096, "tokens": 2e8}, "top": 3},
    {"model": "llama-3.1-8b", "workload": {"method": "full", "seq_len": 4096, "tokens": 1e9}, "top": 3},
    {"model": "qwen2.5-32b", "workload": {"method": "lora", "seq_len": 8192, "tokens": 5e8},
     "search": {"max_gpus": 16}, "objective": "time", "top": 3},
    {"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 2048, "tokens": 1e8}, "objective": "gpus"},
]
#: Bad requests of the storm: (body bytes, content type, how many).
STORM = [
    (b'{"model": "llama-3.1-8b", "workload": {', "application/json", 50),
    (b'{"model": 5, "workload": []}', "application/json", 50),
    (b'{"model": "llama-3.1-8b", "wrkload": {}}', "application/json", 50),
    (b"[" * 5000, "application/json", 20),
    (b"a: [" * 2000, "application/yaml", 20),
    (b" " * 10_000_000, "application/json", 5),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def _fire(port: int, bodies: list, concurrency: int, kind: str) -> tuple[list[float], int]:
    """``bodies`` posted to /api/KIND over ``concurrency`` keep-alive connections, each sending its
    next request when the last is answered. A lean HTTP/1.1 client over asyncio streams: on a
    2-core machine that also runs the server, httpx's own CPU time would be most of the latency."""
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(json.dumps(body).encode())
    latencies, errors = [], 0

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not queue.empty():
                payload = queue.get_nowait()
                head = (f"POST /api/{kind} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                        f"content-length: {len(payload)}\r\n\r\n").encode()
                t0 = time.perf_counter()
                writer.write(head + payload)
                await writer.drain()
                status = int((await reader.readline()).split()[1])
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                errors += status != 200
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return latencies, errors


async def _storm(client: httpx.AsyncClient) -> int:
    wrong = 0
    for body, ctype, count in STORM:
        for _ in range(count):
            try:
                r = await client.post("/api/estimate", content=body, headers={"content-type": ctype})
                wrong += r.status_code not in (413, 422)
            except httpx.HTTPError:
                wrong += 1
    return wrong


async def _run(base: str, port: int, args) -> dict:
    bodies = [{**ESTIMATE, "workload": {**ESTIMATE["workload"], "micro_batch": 1 + i % 8,
                                        "seq_len": (2048, 4096, 8192)[i % 3]}} for i in range(args.estimates)]
    est, est_err = await _fire(port, bodies, args.estimate_concurrency, "estimate")
    plans = [PLANS[i % len(PLANS)] for i in range(args.plans)]
    pln, pln_err = await _fire(port, plans, args.plan_concurrency, "plan")
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        storm_wrong = await _storm(client)
        alive = (await client.get("/api/version")).status_code == 200 and \
            (await client.post("/api/estimate", json=ESTIMATE)).status_code == 200
    return {"estimate": est, "estimate_errors": est_err, "plan": pln, "plan_errors": pln_err,
            "storm_wrong": storm_wrong, "alive": alive}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpus", help="taskset CPU list for the server, e.g. 0,1")
    ap.add_argument("--estimates", type=int, default=500)
    ap.add_argument("--estimate-concurrency", type=int, default=50)
    ap.add_argument("--plans", type=int, default=40)
    ap.add_argument("--plan-concurrency", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    port = _free_port()
    cmd = [sys.executable, "-m", "planner", "serve", "--port", str(port)]
    if args.cpus and shutil.which("taskset"):
        cmd = ["taskset", "-c", args.cpus, *cmd]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/api/version", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            print("the server did not start:", server.stderr.read().decode()[-500:] if server.stderr else "")
            return 1
        runs = [asyncio.run(_run(base, port, args)) for _ in range(args.runs)]
        peak = _peak_rss_bytes(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"server pinned to CPUs {args.cpus or 'all'}; {args.runs} runs; medians over runs")
    for kind, n, conc in (("estimate", args.estimates, args.estimate_concurrency), ("plan", args.plans, args.plan_concurrency)):
        p = {q: statistics.median(_pct(r[kind], q) for r in runs) for q in (0.5, 0.95, 0.99)}
        errors = sum(r[f"{kind}_errors"] for r in runs)
        print(f"{kind:8s} {n} requests, {conc} at a time: p50 {p[0.5]:.3f} s  p95 {p[0.95]:.3f} s  "
              f"p99 {p[0.99]:.3f} s  errors {errors}")
    storm = sum(c for *_, c in STORM)
    print(f"malformed storm: {storm} bad requests per run, answered other than 413/422: "
          f"{sum(r['storm_wrong'] for r in runs)}; still answering after it: {all(r['alive'] for r in runs)}")
    print(f"server peak resident memory: {peak / 2**20:.0f} MiB" if peak else "server peak memory: unknown")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
