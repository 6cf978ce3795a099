#!/usr/bin/env python3
"""Writes the committed seed corpus (corpus/<target>/seed-*): valid messages and
request targets, and invalid ones next to each rule they break. Re-run after changing
the seeds; libFuzzer's own finds stay out of git (see .gitignore)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

EVENT = {"v": 1, "ts_ms": 1764470000000, "tenant": "acme", "key": "/img/logo.png?v=2",
         "region": "eu-west", "node": "edge-1", "outcome": "miss",
         "referrer": "news.example.com", "bytes": 5120, "fill_ms": 42}
COMMAND = {"v": 1, "id": "c-1", "tenant": "acme", "key": "/live/score.json",
           "confidence": 0.91, "priority": "background",
           "issued_at_ms": 1764470000000, "expires_at_ms": 1764470030000,
           "regions": ["ap-south"],
           "reason": {"model": "default-1", "intercept": -0.2,
                      "features": [{"name": "velocity_200ms", "value": 250.0,
                                    "contribution": 0.7}]}}


def dump(v):
    return json.dumps(v, separators=(",", ":")).encode()


def variants(base, changes):
    out = [dump(base)]
    for field, value in changes:
        v = dict(base)
        if value is KeyError:
            v.pop(field, None)
        else:
            v[field] = value
        out.append(dump(v))
    return out


def events():
    seeds = variants(EVENT, [
        ("referrer", KeyError), ("fill_ms", KeyError), ("bytes", KeyError),
        ("outcome", "hit"), ("outcome", "prefetch_useful"), ("outcome", "nope"),
        ("v", 2), ("v", -1), ("ts_ms", 1.5), ("ts_ms", "1"),
        ("tenant", ""), ("tenant", "a b"), ("tenant", "t" * 65),
        ("key", "http://evil.example/x"), ("key", "//evil/x"), ("key", "/a/../b"),
        ("key", "/a/%2e%2e/b"), ("key", "/a\\b"), ("key", "/a#f"), ("key", "/" + "k" * 2048),
        ("key", "/caf\u00e9"), ("referrer", "bad_domain"), ("fill_ms", 2 ** 32),
        ("extra", {"nested": [1, 2, 3]}),
    ])
    seeds += [b"", b"{", b"null", b"[]", b'{"v":1}', b'{"v":1,"v":1}',
              dump(EVENT)[:-1], dump(EVENT) + b" trailing",
              b" \n" + dump(EVENT) + b"\n", b"{" + b" " * 4100 + b"}",
              dump(EVENT).replace(b'"acme"', b'"\\u0061cme"')]
    # The optional edge kind: known, unknown (read as "other"), null, not a string.
    seeds += variants(EVENT, [
        ("edge", "nginx"), ("edge", "varnish"), ("edge", "prefetcher"), ("edge", "haproxy"),
        ("edge", ""), ("edge", None), ("edge", 7),
    ])[1:]
    return seeds


def commands():
    seeds = variants(COMMAND, [
        ("regions", "all"), ("regions", []), ("regions", "some"), ("regions", ["bad region"]),
        ("priority", "user"), ("priority", "urgent"), ("confidence", 1.5),
        ("confidence", -0.0), ("confidence", 1), ("confidence", 1e-320),
        ("expires_at_ms", 1764470000000), ("id", ""), ("id", "i" * 65),
        ("key", "https://evil.example/"), ("key", "/a/..;/b"), ("key", "/a/.%2e/b"),
        ("v", 0), ("reason", {"model": "m", "intercept": 0, "features": []}),
        ("reason", None), ("tenant", "../etc"),
    ])
    big = dict(COMMAND)
    big["reason"] = {"model": "m", "intercept": 0,
                     "features": [{"name": "f%d" % i, "value": 0, "contribution": 0}
                                  for i in range(378)]}
    # 16 377 bytes: just under the limit, with integral floats that re-encode longer.
    seeds.append(dump(big))
    seeds += [b"", b"{}", b'{"v":1,"regions":"all"}', dump(COMMAND)[:40],
              dump(COMMAND).replace(b"0.91", b"9.1e-1"),
              dump(COMMAND).replace(b"0.91", b"1e400")]
    return seeds


def targets():
    return [t.encode() for t in [
        "/", "/img/logo.png", "/a?b=2&a=1", "/a?a=1&&b=2&", "/a?", "*",
        "http://acme.example/x?y=1", "https://h:8443/p", "//evil.example/x",
        "/a/../b", "/a/%2e%2e/b", "/a/%2E%2e/b", "/a/.%2e/b", "/a/%2e./b", "/a/./b",
        "/a/%2f../b", "/%00", "/a%20b", "/a\\b", "/" + "x" * 2100, "/?" + "&" * 50,
        "/a?z=1&a=1&m", "/caf%C3%A9", "http://[::1]:80/x", "/a/..%2f",
    ]]


def heads():
    """Request heads: every old request target in a plain GET, then the smuggling
    rows of prefetcher/tests/smuggling.rs and legitimate heads with bodies."""
    host = "edge.example"
    seeds = [b"GET " + t + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n"
             for t in targets()]

    def post(fields, body=""):
        return ("POST /upload HTTP/1.1\r\nHost: %s\r\n%s\r\n\r\n%s"
                % (host, fields, body)).encode()

    def get(fields):
        return ("GET /page HTTP/1.1\r\nHost: %s\r\n%s\r\n\r\n" % (host, fields)).encode()

    seeds += [
        post("Content-Length: 5", "hello"),
        post("Transfer-Encoding: chunked", "5\r\nhello\r\n0\r\n\r\n"),
        post("Content-Length: 5\r\nTransfer-Encoding: chunked", "0\r\n\r\n"),
        post("Transfer-Encoding: chunked\r\nContent-Length: 5", "0\r\n\r\n"),
        post("Content-Length: 5\r\nContent-Length: 5", "hello"),
        post("Content-Length: 5\r\nContent-Length: 6", "hello!"),
        post("Content-Length: 5, 5", "hello"),
        post("Content-Length: +5", "hello"),
        post("Transfer-Encoding: chunked, identity"),
        post("Transfer-Encoding: xchunked"),
        post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked"),
        post("Transfer-Encoding: chunked, chunked"),
        post("Transfer-Encoding: gzip, chunked"),
        post("Transfer-Encoding:  Chunked "),
        ("POST /upload HTTP/1.0\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % host).encode(),
        get("X-Folded: a\r\n b"),
        get("X-A: a\rb"),
        ("GET /page HTTP/1.1\nHost: %s\nX-A: 1\n\n" % host).encode(),
        get("X-A: 1\nX-B: 2"),
        get("X-A: a\0b"),
        get("X-A: a\x01b"),
        get("X-A: a\x7fb"),
        get("X-A: caf\xe9".encode("latin-1").decode("latin-1")),
        get("Content-Length : 0"),
        ("GET http://other.example/page HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode(),
        ("GET http://EDGE.example:80/page HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode(),
        ("GET https://%s/page HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode(),
        ("GET http://user@%s/page HTTP/1.1\r\nHost: %s\r\n\r\n" % (host, host)).encode(),
        ("GET http://%s/page HTTP/1.0\r\n\r\n" % host).encode(),
        b"GET /page HTTP/1.1\r\nAccept: */*\r\n\r\n",
        b"GET /page HTTP/1.0\r\n\r\n",
        get("Host: " + host),
        get("Host: other.example"),
        b"GET /page HTTP/1.1\r\nHost: edge.example@evil.example\r\n\r\n",
        b"GET /page HTTP/1.1\r\nHost: edge example\r\n\r\n",
        b"GET /page HTTP/1.1\r\nHost:\r\n\r\n",
        b"GET /page HTTP/1.1\r\nHost: edge.example:80x\r\n\r\n",
        b"GET /page HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
        ("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode(),
        ("OPTIONS * HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode(),
        b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X: y\r\n" * 120 + b"\r\n",
    ]
    return seeds


def write(target, seeds):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        # Numbered seeds are this script's; named ones (seed-array-*) were added by hand.
        if name.startswith("seed-") and name[5:].isdigit():
            os.remove(os.path.join(folder, name))
    for i, seed in enumerate(seeds):
        with open(os.path.join(folder, "seed-%02d" % i), "wb") as f:
            f.write(seed)


write("decode_access_event", events())
write("decode_prewarm_command", commands())
write("request_head", heads())
