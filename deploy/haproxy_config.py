#!/usr/bin/env python3
"""Writes an HAProxy configuration that fronts N `sieve serve` replicas (docs/deployment.md).

    deploy/haproxy_config.py --listen 127.0.0.1:8000 --replica 127.0.0.1:8001 \\
        --replica 127.0.0.1:8002 > sieve.cfg && haproxy -f sieve.cfg

Least-connections balancing (a replica's open connections are its requests in flight, so the
least busy engine gets the next one), health checks on GET /health every 500 ms (a replica that
warms up, shuts down or dies answers 503 or nothing and is taken out after 2 failures, back after
2 successes), and a connection that cannot reach a replica is sent to another. A request already
sent to a replica that dies fails with a 502: HAProxy does not resend requests that may have
started work. Timeouts allow hour-long generations and streams.
"""
import argparse


def config(listen, replicas, check_interval_ms=500, stats=None):
    lines = [
        "global",
        "  maxconn 4096",
        "",
        "defaults",
        "  mode http",
        "  timeout connect 5s",
        "  timeout client 1h",
        "  timeout server 1h",
        "  timeout http-request 60s",
        "  retries 2",
        "  option redispatch",
        "  retry-on conn-failure empty-response",
        "",
        "frontend sieve",
        "  bind %s" % listen,
        "  default_backend replicas",
        "",
        "backend replicas",
        "  balance leastconn",
        "  option httpchk GET /health",
        "  http-check expect status 200",
        "  default-server inter %dms fall 2 rise 2" % check_interval_ms,
        "  http-response set-header X-Sieve-Replica %s",
    ]
    for index, address in enumerate(replicas):
        lines.append("  server replica%d %s check" % (index, address))
    if stats:
        lines += ["", "listen stats", "  bind %s" % stats, "  stats enable", "  stats uri /stats"]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:8000", help="address:port HAProxy serves")
    parser.add_argument("--replica", action="append", required=True,
                        help="address:port of a `sieve serve` replica (repeat for each)")
    parser.add_argument("--check-interval-ms", type=int, default=500)
    parser.add_argument("--stats", help="address:port of HAProxy's stats page (/stats)")
    args = parser.parse_args()
    print(config(args.listen, args.replica, args.check_interval_ms, args.stats), end="")


if __name__ == "__main__":
    main()
