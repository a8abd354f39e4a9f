#!/usr/bin/env python3
# Measures mitigation-bit propagation in a running `edgelimit demo`: pushes a key over its global limit
# at one PoP and times until every other PoP lists the bit in GET /v1/mitigations.
import json, time, urllib.request
import sys
# Usage: python3 propagation.py FIRST_PORT [N_POPS]  (against `edgelimit demo --base-port FIRST_PORT`
# with a per-minute global limit of 3 on api_key, e.g. deploy/scripts/propagation-rules.yaml)
first = int(sys.argv[1]) if len(sys.argv) > 1 else 8081
ports = list(range(first, first + (int(sys.argv[2]) if len(sys.argv) > 2 else 6)))
def check(port, key):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/check", data=json.dumps({"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":key}]}]}).encode())
    try:
        urllib.request.urlopen(req).read(); return 200
    except urllib.error.HTTPError as e:
        return e.code
def has_bit(port, key):
    d = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/mitigations"))
    return any(f"api_key={key} " in m["key"] for m in d["mitigations"])
delays = []
for i in range(20):
    key = f"prop{i}-{time.time_ns()}"
    for _ in range(3): check(ports[0], key)
    time.sleep(0.3)            # let every PoP learn the 3 counts
    src = ports[i % len(ports)]
    t0 = time.perf_counter()
    code = check(src, key)       # the 4th hit: over the limit, a bit is issued here
    pending = [p for p in ports if p != src]
    seen = {}
    while pending and time.perf_counter() - t0 < 5:
        for p in list(pending):
            if has_bit(p, key):
                seen[p] = time.perf_counter() - t0; pending.remove(p)
    if pending: print("missing at", pending)
    delays += list(seen.values())
delays.sort()
print(f"bits observed: {len(delays)}; p50 {delays[len(delays)//2]*1000:.0f} ms; p99 {delays[int(len(delays)*0.99)-1]*1000:.0f} ms; max {delays[-1]*1000:.0f} ms")
