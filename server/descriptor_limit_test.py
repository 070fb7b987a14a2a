#!/usr/bin/env python3
"""`sieve serve` at its open files limit (server/README.md, "Connections and descriptors").

1. Started with a soft limit below its hard limit, the server raises the soft limit to the hard
   one and logs how many connections it can hold.
2. Started with a hard limit of HARD descriptors, with more idle connections open than that, a
   normal request is refused cleanly: an HTTP 503 with a JSON error, not a reset or a hang.
3. Once the idle connections close, the same request is served (200), and the server is still
   up.

Usage: descriptor_limit_test.py SIEVE_BINARY SOURCE_DIR. Traffic goes to 127.0.0.1 only.
"""
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback_http import HOST, http_request  # noqa: E402

HARD = 200  # the server's hard limit on open files in part 2
IDLE = HARD + 60  # idle connections opened against it


def start(sieve, source_dir, log_path, soft, hard):
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    command = [sieve, "serve", "--host", HOST, "--port", "0", "--device", "cpu",
               "--model", os.path.join(source_dir, "testdata", "models", "llama2_mha"),
               "--max-model-len", "256", "--kv-memory", "64M", "--threads", "1",
               "--http-threads", "2"]
    log = open(log_path, "wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, preexec_fn=limit)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        with open(log_path, "rb") as reader:
            text = reader.read()
        match = re.search(rb"on http://[^ ]+:([0-9]+)", text)
        if match and http_request(int(match.group(1)), "GET", "/health")[0] == 200:
            return server, int(match.group(1))
        time.sleep(0.1)
    raise SystemExit("FAIL: the server did not start:\n" + open(log_path).read()[-3000:])


def stop(server):
    server.terminate()
    try:
        return server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        return None


def main():
    sieve, source_dir = sys.argv[1], sys.argv[2]
    failures = []
    completion = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    with tempfile.TemporaryDirectory() as work:
        # 1. The soft limit is raised to the hard one.
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        hard = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
        log = os.path.join(work, "raise.log")
        server, port = start(sieve, source_dir, log, 128, hard)
        stop(server)
        text = open(log).read()
        match = re.search(r"open files limit (\d+): about (\d+) connections", text)
        if not match or int(match.group(1)) != hard:
            failures.append("soft limit 128 under hard %d: the log says %r" % (
                hard, match.group(0) if match else None))
        else:
            print("ok   raised: " + match.group(0))

        # 2. Past the limit, a request is refused with a 503; 3. it recovers.
        log = os.path.join(work, "limit.log")
        server, port = start(sieve, source_dir, log, HARD, HARD)
        idle = []
        for _ in range(IDLE):
            try:
                idle.append(socket.create_connection((HOST, port), timeout=5))
            except OSError:
                break
        time.sleep(0.5)  # the server accepts what it can
        status, _, body = http_request(port, "POST", "/v1/completions", completion, timeout=30)
        if status != 503 or "too many open connections" not in body:
            failures.append("with %d idle connections against %d descriptors: %r %r" % (
                len(idle), HARD, status, body[:200]))
        else:
            print("ok   refused at the limit (%d idle connections): 503 %s" % (len(idle), body[:80]))
        for conn in idle:
            conn.close()
        recovered = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            recovered = http_request(port, "POST", "/v1/completions", completion)
            if recovered[0] == 200:
                break
            time.sleep(0.2)
        if not recovered or recovered[0] != 200:
            failures.append("after the idle connections closed: %r" % (recovered,))
        else:
            print("ok   recovered: 200 once the idle connections closed")
        if server.poll() is not None:
            failures.append("the server exited: " + open(log).read()[-2000:])
        stop(server)
    for failure in failures:
        print("FAIL " + failure)
    print("%d passed, %d failed" % (3 - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
