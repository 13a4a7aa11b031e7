"""The reward worker's scoring processes: a user's reward function runs in child
processes, never in the worker's own, so that an item that hangs (a catastrophic regex
on a policy's output, an endless loop) or exhausts memory costs one child, not the
worker. Each item has a wall-clock limit; a child that passes it is killed and a fresh
one takes its place. Children run under rlimits: address space (memory_mb) and CPU time
per item (the item limit, as a backstop of the wall clock), and they die with the
worker (PR_SET_PDEATHSIG).

Each child is a fresh interpreter (python -m rlfleet._reward_pool), never a fork of the
gRPC server's threads, talking over a socket pair. It gets the function as a spec
(MODULE:NAME or PATH.py:NAME, loaded in each child) or, from Python, pickled (a
module-level function of an importable module; the child has the worker's sys.path).
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.util
import math
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from multiprocessing import connection
from typing import Callable, List, Optional, Sequence, Tuple

DEFAULT_ITEM_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 4096
START_TIMEOUT_S = 60.0  # a child's start: importing the user's module, loading the function
_POLL_S = 0.05  # how often a call waiting for a free child looks again (and at its cancellation)

# (reward, None) or (None, reason)
Result = Tuple[Optional[float], Optional[str]]


def load_function(spec: str) -> Callable:
    """`spec` is MODULE:NAME (importable) or PATH.py:NAME; ValueError naming the problem."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"--function {spec!r}: want MODULE:NAME or PATH.py:NAME")
    try:
        if where.endswith(".py"):
            loader = importlib.util.spec_from_file_location(f"rlfleet_user_{uuid.uuid4().hex}", where)
            if loader is None or not os.path.isfile(where):
                raise ValueError(f"--function {spec!r}: no file {where}")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ValueError:
        raise
    except Exception as e:  # (the user's module failed to import: say how)
        raise ValueError(f"--function {spec!r}: cannot load {where}: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--function {spec!r}: {where} has no function {name}")
    return fn


def evaluate(fn: Callable, prompt: str, completion: str, fields: dict) -> Result:
    """Calls the reward function on one item: (reward, None), or (None, reason) when it
    raised or returned something that is not a finite number."""
    try:
        value = fn(prompt, completion, **fields)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"returned {type(value).__name__} {value!r:.80}, not a number"
        if not math.isfinite(value):
            return None, f"returned {value}, not a finite number"
        return float(value), None
    except Exception as e:  # (the user's code: its failure is one item's, never the worker's)
        return None, f"raised {type(e).__name__}: {e}"


def _die_with_parent(parent: int):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # (not Linux: the pipe's EOF ends an idle child)
    if os.getppid() != parent:  # (the worker died before that took effect)
        os._exit(1)


def _child_main(argv: Sequence[str]):
    """A scoring child (python -m rlfleet._reward_pool FD PARENT_PID MEMORY_MB CPU_S):
    receives ("spec", MODULE:NAME or PATH.py:NAME) or ("pickle", bytes) on the socket
    FD, loads the function, says ("ready",), then answers each item (prompt,
    completion, fields) with a Result until the socket closes."""
    fd, parent, memory_mb, cpu_s = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the worker stops it; a ^C is the worker's)
    _die_with_parent(parent)
    conn = connection.Connection(fd)
    try:
        if memory_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        kind, payload = conn.recv()
        fn = load_function(payload) if kind == "spec" else pickle.loads(payload)
    except BaseException as e:  # (said to the worker, which logs it)
        conn.send(("fatal", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready",))
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    while True:
        try:
            prompt, completion, fields = conn.recv()
        except (EOFError, OSError):
            return
        # CPU time for this item: what the child used so far plus the item's limit
        # (SIGXCPU ends it past that, should the worker not have killed it first).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime + cpu_s) + 2
        if cpu_hard == resource.RLIM_INFINITY or soft <= cpu_hard:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
        conn.send(evaluate(fn, prompt, completion, fields))


class _Child:
    """One scoring process (a fresh interpreter: nothing of the worker's threads or
    state) and its socket; owned by the pool's lock while idle and by one call while
    busy."""

    def __init__(self, payload: tuple, memory_mb: int, cpu_s: float):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        # (the worker's import path: the child finds rlfleet and the function's module)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlfleet._reward_pool", str(theirs.fileno()), str(os.getpid()),
                 str(memory_mb), repr(cpu_s)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
                close_fds=True)
        finally:
            theirs.close()
        self.conn = connection.Connection(ours.detach())
        self.conn.send(payload)
        self.started = time.monotonic()
        self.ready = False

    def kill(self):
        try:
            self.process.kill()
            self.process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.conn.close()

    def exit_reason(self) -> str:
        try:
            code = self.process.wait(1)
        except subprocess.TimeoutExpired:
            return "the child process stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = {"SIGXCPU": " (its CPU-time limit)", "SIGKILL": " (killed: its memory?)"}.get(name, "")
            return f"the child process died of {name}{hint}"
        return f"the child process exited with code {code}"


class ScoringPool:
    """`size` scoring processes shared by every Score call. Thread-safe: calls on
    several gRPC threads take free children under one lock; a busy child belongs to
    the call that sent it an item."""

    def __init__(self, *, spec: Optional[str], fn: Optional[Callable], size: int, item_timeout_s: float,
                 memory_mb: int, log: Callable[[str], None]):
        if spec is None and fn is None:
            raise ValueError("a function spec or a function")
        self._payload = ("spec", spec) if spec is not None else ("pickle", pickle.dumps(fn))
        self._size = size
        self.item_timeout_s = item_timeout_s
        self._memory_mb = memory_mb
        self._log = log
        self._lock = threading.Condition()
        self._idle: List[_Child] = []  # (under _lock)
        self._count = 0  # children alive, idle or busy (under _lock)
        self._start_failure = ""  # the last child's failure to start, until one starts (under _lock)
        self._closed = False
        self.replaced = 0  # children killed and replaced (under _lock)

    def start(self):
        """Starts every child (they load the function meanwhile)."""
        with self._lock:
            while self._count < self._size:
                self._idle.append(self._new_child())

    def _new_child(self) -> _Child:  # (under _lock)
        self._count += 1
        return _Child(self._payload, self._memory_mb, self.item_timeout_s)

    def _check_start(self, child: _Child) -> bool:  # (under _lock)
        """Whether an idle child is ready, reading its "ready" if it came; one that
        failed to start (or took too long) is removed, killed and logged."""
        if child.ready:
            return True
        failure = None
        try:
            if child.conn.poll(0):
                message = child.conn.recv()
                if message[0] == "ready":
                    child.ready = True
                    self._start_failure = ""
                    return True
                failure = f"cannot load the reward function: {message[1]}"
            elif time.monotonic() - child.started > START_TIMEOUT_S:
                failure = f"did not start within {START_TIMEOUT_S:.0f} s"
        except (EOFError, OSError):
            failure = child.exit_reason()
        if failure is not None:
            self._idle.remove(child)
            self._count -= 1
            child.kill()
            if failure != self._start_failure:
                self._log(f"a scoring process failed to start: {failure}")
            self._start_failure = failure
        return False

    def wait_started(self, timeout_s: float = START_TIMEOUT_S):
        """Waits up to `timeout_s` until every child has started (or failed to)."""
        end = time.monotonic() + timeout_s
        while True:
            with self._lock:
                starting = [c for c in list(self._idle) if not self._check_start(c) and c in self._idle]
            left = end - time.monotonic()
            if not starting or left <= 0:
                return
            connection.wait([c.conn for c in starting], min(left, 1.0))

    def _take_ready(self) -> Optional[_Child]:
        """An idle child that is ready, replacing those that failed to start; None when
        there is none now."""
        with self._lock:
            if self._closed:
                return None
            while self._count < self._size:
                self._idle.append(self._new_child())
            for child in list(self._idle):
                if self._check_start(child):
                    self._idle.remove(child)
                    return child
            return None

    def _give_back(self, child: _Child):
        with self._lock:
            if self._closed:
                child.kill()
                self._count -= 1
                return
            self._idle.append(child)
            self._lock.notify()

    def _replace(self, child: _Child):
        """Kills a busy child (it timed out, or died) and starts another in its place."""
        child.kill()
        with self._lock:
            self._count -= 1
            self.replaced += 1
            if not self._closed:
                self._idle.append(self._new_child())
            self._lock.notify()

    def score(self, items: Sequence[tuple], deadline: Optional[float] = None,
              active: Callable[[], bool] = lambda: True) -> List[Tuple[Result, str]]:
        """Scores `items` ((prompt, completion, fields) each) on the children, in
        parallel; returns a (Result, kind) per item, kind "" when the function answered,
        "timeout" for an item that passed item_timeout_s (its child killed and
        replaced), "died" for one whose child died, "deadline" for one not scored by
        `deadline` (time.monotonic()) or before `active` said the call was gone.
        Returns by `deadline` (and within item_timeout_s of any item's start)."""
        results: List[Optional[Tuple[Result, str]]] = [None] * len(items)
        pending = list(range(len(items)))
        pending.reverse()  # (popped from the end: in order)
        inflight = {}  # conn -> (child, index, sent at)
        while pending or inflight:
            now = time.monotonic()
            if (deadline is not None and now >= deadline) or not active():
                break
            while pending:
                child = self._take_ready()
                if child is None:
                    break
                i = pending.pop()
                try:
                    child.conn.send(items[i])
                except (OSError, ValueError):
                    results[i] = ((None, child.exit_reason()), "died")
                    self._replace(child)
                    continue
                inflight[child.conn] = (child, i, time.monotonic())
            if not inflight:
                with self._lock:
                    failure = self._start_failure
                if failure and pending:  # (no child starts: answer rather than wait for ever)
                    for i in pending:
                        results[i] = ((None, f"no scoring process: {failure}"), "died")
                    pending = []
                    break
                with self._lock:
                    self._lock.wait(_POLL_S)
                continue
            now = time.monotonic()
            wait_s = min(sent + self.item_timeout_s for _, _, sent in inflight.values()) - now
            if deadline is not None:
                wait_s = min(wait_s, deadline - now)
            if pending:
                wait_s = min(wait_s, _POLL_S)  # (a child may come free or start meanwhile)
            wait_s = max(0.0, min(wait_s, 1.0))  # (and `active` is asked at least every second)
            for conn in connection.wait(list(inflight), wait_s):
                child, i, _ = inflight.pop(conn)
                try:
                    results[i] = (conn.recv(), "")
                except (EOFError, OSError):
                    results[i] = ((None, child.exit_reason()), "died")
                    self._replace(child)
                    continue
                self._give_back(child)
            now = time.monotonic()
            for conn, (child, i, sent) in list(inflight.items()):
                if now - sent >= self.item_timeout_s:
                    del inflight[conn]
                    results[i] = ((None, f"timed out after {self.item_timeout_s:g} s"), "timeout")
                    self._replace(child)
        for child, i, _ in inflight.values():  # (the call's deadline or cancellation)
            results[i] = ((None, "not scored before the call's deadline"), "deadline")
            self._replace(child)
        for i in pending:
            results[i] = ((None, "not scored before the call's deadline"), "deadline")
        return results

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for child in idle:
            child.kill()


if __name__ == "__main__":
    _child_main(sys.argv[1:])
