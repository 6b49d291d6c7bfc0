"""The line protocol of the benchmark peers (bench/peer_process.h): one JSON request per
stdin line, one JSON reply per stdout line, flushed, until end of input or {"op": "quit"}."""
import json
import sys


def serve(handle):
    """Answers each request with handle(request). An exception becomes {"error": "..."}, so the
    caller never blocks on a missing line and one bad request does not end the worker."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("op") == "quit":
                break
            reply = handle(req)
        except Exception as e:  # report, stay alive: one bad shape must not end the run
            reply = {"error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
