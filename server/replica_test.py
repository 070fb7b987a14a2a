#!/usr/bin/env python3
"""Two `sieve serve` replicas behind HAProxy (deploy/haproxy_config.py, docs/deployment.md).

1. `sieve bench serve` through HAProxy: every request succeeds, and both replicas served some.
2. 16 concurrent requests through HAProxy; one replica is killed while they run: no more fail
   than were in flight on the killed replica (HAProxy's X-Sieve-Replica header names the replica
   of each answered one; the failures must number no more than the killed replica's
   share: its requests in flight when it died), the rest are served, and requests sent after it
   are all served by the survivor.
3. The killed replica restarts on its port: HAProxy's health checks put it back, and it serves
   requests again.

Usage: replica_test.py SIEVE_BINARY SOURCE_DIR. Skipped (77) without haproxy. Traffic goes to
127.0.0.1 only; every loop is bounded.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback_http import HOST, http_request as http  # noqa: E402

SKIP = 77


def free_port():
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def wait_until(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def start_replica(sieve, model, port, log_path):
    command = [sieve, "serve", "--host", HOST, "--port", str(port), "--device", "cpu",
               "--model", model, "--max-model-len", "256", "--kv-memory", "64M", "--threads", "1",
               "--served-model-name", "sieve-test", "--no-progress"]
    log = open(log_path, "ab")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    if not wait_until(lambda: process.poll() is None and http(port, "GET", "/health")[0] == 200,
                      120):
        raise SystemExit("FAIL: replica on %d did not start:\n%s" % (port, open(log_path).read()[-3000:]))
    return process


def served(port):
    """Requests the replica on `port` finished (its sieve:request_success_total, all reasons)."""
    status, _, body = http(port, "GET", "/metrics")
    if status != 200:
        return -1
    return sum(float(match) for match in
               re.findall(r"^sieve:request_success_total\{[^}]*\} ([0-9.e+]+)$", body, re.M))


def main():
    sieve, source_dir = sys.argv[1], sys.argv[2]
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        print("SKIP: no haproxy (scripts/bootstrap.sh installs it)")
        return SKIP
    sys.path.insert(0, os.path.join(source_dir, "deploy"))
    import haproxy_config  # noqa: E402 (the recipe's own generator)

    model = os.path.join(source_dir, "testdata", "models", "llama2_mha")
    failures = []
    passed = 0
    with tempfile.TemporaryDirectory() as work:
        ports = [free_port(), free_port()]
        front = free_port()
        logs = [os.path.join(work, "replica%d.log" % index) for index in range(2)]
        replicas = [start_replica(sieve, model, port, log) for port, log in zip(ports, logs)]
        cfg = os.path.join(work, "haproxy.cfg")
        with open(cfg, "w") as out:
            out.write(haproxy_config.config("%s:%d" % (HOST, front),
                                            ["%s:%d" % (HOST, port) for port in ports]))
        proxy = subprocess.Popen([haproxy, "-db", "-f", cfg], stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(work, "haproxy.log"), "wb"))
        try:
            if not wait_until(lambda: http(front, "GET", "/health")[0] == 200, 30):
                raise SystemExit("FAIL: HAProxy does not answer /health")
            # 1. sieve bench serve through HAProxy.
            result_path = os.path.join(work, "bench.json")
            bench = subprocess.run(
                [sieve, "bench", "serve", "--base-url", "http://%s:%d" % (HOST, front),
                 "--input-len", "64", "--output-len", "16", "--num-prompts", "24",
                 "--max-concurrency", "8", "--ignore-eos", "--no-progress",
                 "--result-json", result_path], capture_output=True, text=True, timeout=300)
            result = json.load(open(result_path)) if os.path.exists(result_path) else {}
            completed = result.get("metrics", {}).get("completed", result.get("completed"))
            counts = [served(port) for port in ports]
            if bench.returncode != 0 or completed != 24 or min(counts) <= 0:
                failures.append("bench serve through HAProxy: exit %d, completed %r, per replica "
                                "%r\n%s" % (bench.returncode, completed, counts, bench.stdout[-1500:]))
            else:
                passed += 1
                print("ok   bench serve through HAProxy: 24 of 24 completed, replicas served %r"
                      % counts)

            # 2. Kill replica 1 while 16 requests run.
            outcomes = [None] * 16
            body = {"model": "sieve-test", "prompt": "The grass is green. " * 4,
                    "max_tokens": 96, "temperature": 0, "ignore_eos": True}

            def send(index):
                outcomes[index] = http(front, "POST", "/v1/completions", body, timeout=120)

            threads = [threading.Thread(target=send, args=(index,)) for index in range(16)]
            for thread in threads:
                thread.start()
            # Both replicas have requests running, then replica 1 dies.
            wait_until(lambda: all(in_flight(port) > 0 for port in ports), 20)
            killed_in_flight = in_flight(ports[1])
            replicas[1].send_signal(signal.SIGKILL)
            replicas[1].wait()
            for thread in threads:
                thread.join(180)
            answered = [outcome for outcome in outcomes if outcome and outcome[0] == 200]
            by_replica = {}
            for outcome in answered:
                name = outcome[1].get("x-sieve-replica", "?")
                by_replica[name] = by_replica.get(name, 0) + 1
            failed = [outcome for outcome in outcomes if not outcome or outcome[0] != 200]
            after = [http(front, "POST", "/v1/completions", dict(body, max_tokens=4))
                     for _ in range(6)]
            after_ok = [outcome for outcome in after if outcome[0] == 200]
            if len(failed) > killed_in_flight or len(after_ok) != 6 or any(
                    outcome[1].get("x-sieve-replica") != "replica0" for outcome in after_ok):
                failures.append(
                    "killing replica1 with %d requests in flight on it: %d failed (%r), answered "
                    "by replica %r; after it %d of 6 served" % (
                        killed_in_flight, len(failed),
                        [outcome[:1] + outcome[2:] for outcome in failed][:3], by_replica,
                        len(after_ok)))
            else:
                passed += 1
                print("ok   replica1 killed with %d requests in flight on it: %d failed, %d served "
                      "(%r); the 6 after it all served by replica0" % (
                          killed_in_flight, len(failed), len(answered), by_replica))

            # 3. It restarts and rejoins.
            replicas[1] = start_replica(sieve, model, ports[1], logs[1])
            rejoined = wait_until(
                lambda: http(front, "POST", "/v1/completions", dict(body, max_tokens=2))[1]
                .get("x-sieve-replica") == "replica1" and served(ports[1]) > 0, 30)
            if not rejoined:
                failures.append("replica1 restarted but HAProxy sent it nothing in 30 s")
            else:
                passed += 1
                print("ok   replica1 restarted and serves again")
        finally:
            proxy.terminate()
            proxy.wait(10)
            for replica in replicas:
                if replica.poll() is None:
                    replica.terminate()
                    try:
                        replica.wait(30)
                    except subprocess.TimeoutExpired:
                        replica.kill()
    for failure in failures:
        print("FAIL " + failure)
    print("%d passed, %d failed" % (passed, len(failures)))
    return 1 if failures else 0


def in_flight(port):
    """The replica's requests running or waiting (its gauges), -1 when it does not answer."""
    status, _, body = http(port, "GET", "/metrics", timeout=5)
    if status != 200:
        return -1
    total = 0.0
    for name in ("sieve:num_requests_running", "sieve:num_requests_waiting"):
        match = re.search(r"^%s\{[^}]*\} ([0-9.e+]+)$" % name, body, re.M)
        total += float(match.group(1)) if match else 0.0
    return total


if __name__ == "__main__":
    sys.exit(main())
