"""The `python` reward term's worker process: `python -m align.rl.user_reward_worker module:function`.

Imports the user's function once, then answers one JSON line per request on its original stdout:
    request  {"prompt": str, "completion": str, "meta": {...}}
    reply    {"value": float} | {"error": "Type: message"}
After the import it sends {"ready": true} (or {"fatal": why} and exits 3). Anything the function prints goes to
stderr: stdout carries the protocol only. Stdlib only (the user's module brings its own imports)."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys


def load(spec: str):
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    return fn


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the user's prints go to stderr
    sys.stdout = sys.stderr

    def say(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")

    try:
        fn = load(sys.argv[1])
    except BaseException as exc:  # the function cannot be had: the stage's configuration is wrong
        say({"fatal": f"{type(exc).__name__}: {exc}"})
        return 3
    say({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        try:
            value = float(fn(req["prompt"], req["completion"], req["meta"]))
            say({"value": value} if math.isfinite(value) else {"error": f"ValueError: non-finite reward {value}"})
        except Exception as exc:  # the user's bug: counted by the parent, the sample rewarded 0
            say({"error": f"{type(exc).__name__}: {exc}"[:500]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
