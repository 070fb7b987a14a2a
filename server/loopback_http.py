"""One HTTP/1.1 request to a server on 127.0.0.1, on a fresh connection, for the server's
process-level tests (descriptor_limit_test.py, replica_test.py)."""
import json
import socket

HOST = "127.0.0.1"


def http_request(port, method, path, body=None, timeout=60, raw=False):
    """(status, headers, body) of the answer; (0, {}, why) when there is none. The body is text
    (UTF-8, undecodable bytes replaced), or with `raw` its bytes as sent: a chunked body's chunk
    sizes count bytes, so it must be de-chunked before it is decoded."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as conn:
            payload = json.dumps(body).encode() if body is not None else b""
            conn.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: %d\r\nConnection: close\r\n\r\n"
                          % (method, path, len(payload))).encode() + payload)
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as error:
        return 0, {}, str(error)
    if not data:
        return 0, {}, "closed without a response"
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return (int(lines[0].split(" ")[1]), headers,
            rest if raw else rest.decode("utf-8", "replace"))
