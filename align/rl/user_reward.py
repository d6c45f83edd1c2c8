"""`UserFunction`: a user's reward function (`module:function`) called in a worker process, bounded in time.

    value, status = fn(prompt, completion, meta)      value None: the call failed (status says how)

The worker (align.rl.user_reward_worker) imports the function once and serves calls over pipes. A call that
raises, returns a non-number or a non-finite number comes back as status "error"; one that runs past `timeout_s`
gets its worker's process group killed (status "timeout") and the next call starts a fresh worker; a worker that
died is "crash". None of them reaches the training step: the `python` term counts them and rewards 0. A worker that
cannot import the function on its first start is a configuration error (`ConfigError` naming the function).
The worker runs with the trainer's sys.path and environment: it is the user's own trusted code, bounded in time,
not sandboxed (untrusted code goes to align.sandbox)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

from align.exceptions import ConfigError
from align.rl import user_reward_worker  # run with -m in the worker; imported so that it counts in code digests

START_TIMEOUT_S = 60.0  # the import of the user's module (it may import torch)


class UserFunction:
    def __init__(self, spec: str, timeout_s: float = 2.0):
        self.spec, self.timeout_s = spec, timeout_s
        self.proc: subprocess.Popen | None = None
        self.started = 0  # workers started (1 + restarts)
        self._buf = b""

    # ------------------------------------------------------------------------------------------------ calls
    def __call__(self, prompt: str, completion: str, meta: dict) -> tuple[float | None, str]:
        if self.proc is None or self.proc.poll() is not None:
            try:
                self._start()
            except RuntimeError:  # a restart that failed: this call fails, the next one tries again
                return None, "crash"
        line = json.dumps({"prompt": prompt, "completion": completion, "meta": meta}, default=str) + "\n"
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill()
            return None, "crash"
        reply = self._read_line(self.timeout_s)
        if reply is None:
            crashed = self.proc.poll() is not None
            self._kill()
            return None, "crash" if crashed else "timeout"
        if "value" in reply:
            return float(reply["value"]), "ok"
        return None, "error"

    def start(self) -> None:
        """Start the worker now (the stage does, so that a function that cannot be imported stops it at once)."""
        if self.proc is None:
            self._start()

    def close(self) -> None:
        self._kill()

    # ------------------------------------------------------------------------------------------------ worker
    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        self.proc = subprocess.Popen([sys.executable, "-m", user_reward_worker.__name__, self.spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True)
        self._buf = b""
        self.started += 1
        first = self._read_line(START_TIMEOUT_S)
        if first is None or not first.get("ready"):
            why = (first or {}).get("fatal", "no answer from the worker")
            self._kill()
            if self.started == 1:
                raise ConfigError(f"[reward] python term: cannot load {self.spec!r}: {why}")
            raise RuntimeError(f"python reward worker for {self.spec!r} failed to restart: {why}")

    def _read_line(self, timeout_s: float) -> dict | None:
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self.proc = None
