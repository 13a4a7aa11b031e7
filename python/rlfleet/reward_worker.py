"""Rewards written in Python: a reward service (the rlfleet.v1.RewardService contract)
that scores with a user's function and registers with the controller like any reward
service, for the tasks it names. A run sends the items of those tasks here and every
other item to the fleet's reward service.

The function:

    def reward(prompt: str, completion: str, **fields) -> float

`fields` holds `task`, `answer` (the item's reference answer, "" when none), `item_id`
and the item's metadata entries. A function that raises, or returns something that is
not a finite number, gives that item `error_reward` (0.0 by default), the component
{"error": 1.0} and parsed=False, and the reason is logged with the item's id: the
worker goes on.

The function runs in child processes (--threads of them, rlfleet/_reward_pool.py), not
in the worker: an item that runs past --item_timeout_s (wall clock, 10 s by default;
a catastrophic regex on a policy's output, say) scores the same way, its child is
killed and a fresh one takes its place; children run with an address-space limit
(--item_memory_mb) and a CPU-time limit per item. A Score call answers by its gRPC
deadline: items not scored by then get error_reward too.

    python3 -m rlfleet.reward_worker --function my_rewards.py:reward --tasks mytask \\
        --controller 127.0.0.1:7000 [--port 0] [--token_file F] [--max_message_bytes N] \\
        [--item_timeout_s 10] [--item_memory_mb 4096]

A Score call carries at most --max_message_bytes (the fleet's flag of that name, 16 MiB
by default as every rlfleet service's): the controller splits a step's batch into calls
of at most that many bytes and MAX_ITEMS items, so give the worker the fleet's value.

or from Python: RewardWorker(fn, ["mytask"]).serve(controller="127.0.0.1:7000").
"""
from __future__ import annotations

import argparse
import math
import pickle
import signal
import sys
import threading
import time
import uuid
from concurrent import futures
from typing import Callable, List, Optional, Sequence

import grpc

from rlfleet._reward_pool import (DEFAULT_ITEM_TIMEOUT_S, DEFAULT_MEMORY_MB, ScoringPool, evaluate,
                                  load_function)
from rlfleet.v1 import common_pb2, controller_pb2, controller_pb2_grpc, reward_pb2, reward_pb2_grpc

__all__ = ["RewardWorker", "load_function", "main"]

TASKS_LABEL = "reward.tasks"  # (services/controller/reward_routes.h reads it)
MAX_ITEMS = 1024  # per Score call, as the fleet's reward service
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20  # every rlfleet service's --max_message_bytes (libs/rpc/server_runner.h)


def _log(message: str):
    print(f"rlfleet-reward-worker: {message}", flush=True)


class _Servicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, worker: "RewardWorker"):
        self._w = worker

    def _authorized(self, context) -> bool:
        if not self._w.token:
            return True
        for key, value in context.invocation_metadata():
            if key == "authorization" and value == f"Bearer {self._w.token}":
                return True
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        return False

    def Score(self, request, context):
        self._authorized(context)
        start = time.monotonic()
        if not 1 <= len(request.items) <= MAX_ITEMS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"items: {len(request.items)}; want 1..{MAX_ITEMS}")
        for i, item in enumerate(request.items):
            if item.task not in self._w.tasks:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"items[{i}].task: {item.task!r}; this worker scores {', '.join(self._w.tasks)}")
            if item.reward_function and item.reward_function != self._w.name:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"items[{i}].reward_function: {item.reward_function!r}; this worker's is {self._w.name}")
        # Answered by the call's deadline, less a margin for the reply to travel.
        remaining = context.time_remaining()
        deadline = None
        if remaining is not None:
            if remaining <= 0.01:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before scoring began")
            deadline = time.monotonic() + remaining - min(0.2, remaining * 0.1)
        outcomes = self._w.score_items(request.items, deadline, context.is_active)
        if not context.is_active():  # (the caller went away or its deadline passed: nobody reads a reply)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call ended before its items were scored")
        response = reward_pb2.ScoreResponse()
        for item, (value, error) in zip(request.items, outcomes):
            result = response.results.add(item_id=item.item_id, reward_function=self._w.name)
            if error is None:
                result.reward = value
                result.parsed = True
            else:
                result.reward = self._w.error_reward
                result.parsed = False
                result.components["error"] = 1.0
        response.elapsed_ms = (time.monotonic() - start) * 1000
        return response

    def ListRewardFunctions(self, request, context):
        self._authorized(context)
        if request.page.page_size > 1000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page.page_size: {request.page.page_size}; at most 1000")
        response = reward_pb2.ListRewardFunctionsResponse()
        if not request.task or request.task in self._w.tasks:
            response.functions.add(name=self._w.name, kind=reward_pb2.REWARD_KIND_VERIFIABLE,
                                   description=f"Python function {self._w.name}", tasks=self._w.tasks,
                                   component_names=["error"], min_reward=self._w.min_reward,
                                   max_reward=self._w.max_reward, needs_reference=False)
        return response


class RewardWorker:
    """Serves `fn` as the reward of `tasks`. Thread-safe. By default (isolate=True)
    items are scored in `threads` child processes, each item within item_timeout_s of
    wall clock (a child past it is killed and replaced) and each child's address space
    within memory_mb (0: no limit); the children get the function as `function_spec`
    (MODULE:NAME or PATH.py:NAME, what main() passes) or else `fn` pickled (a module-level
    function of an importable module). isolate=False scores on the server's threads, with
    no timeout: the function must then be safe to call from several at once."""

    def __init__(self, fn: Callable, tasks: Sequence[str], *, name: str = "", error_reward: float = 0.0,
                 min_reward: float = 0.0, max_reward: float = 1.0, token: Optional[str] = None, threads: int = 4,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, item_timeout_s: float = DEFAULT_ITEM_TIMEOUT_S,
                 memory_mb: int = DEFAULT_MEMORY_MB, isolate: bool = True, function_spec: Optional[str] = None):
        tasks = [t.strip() for t in tasks if t.strip()]
        if not tasks:
            raise ValueError("tasks: name at least one task this worker scores")
        if isinstance(item_timeout_s, bool) or not isinstance(item_timeout_s, (int, float)) or \
                not math.isfinite(item_timeout_s) or not 0.01 <= item_timeout_s <= 3600:
            raise ValueError(f"item_timeout_s: {item_timeout_s!r}; want 0.01..3600 seconds")
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or not 0 <= memory_mb <= (1 << 30):
            raise ValueError(f"memory_mb: {memory_mb!r}; want 0 (no limit) or a size in MiB")
        if isolate and function_spec is None:
            try:
                if getattr(fn, "__module__", None) == "__main__":
                    raise TypeError("it is defined in the main script, which the child processes do not run")
                pickle.dumps(fn)
            except Exception as e:
                raise ValueError(f"the reward function cannot go to a child process ({type(e).__name__}: {e}): "
                                 "pass function_spec='PATH.py:NAME', a module-level function of an importable "
                                 "module, or isolate=False (no per-item timeout)") from None
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or \
                not 1 <= max_message_bytes <= (1 << 31) - 1:
            raise ValueError(f"max_message_bytes: {max_message_bytes!r}; want 1..{(1 << 31) - 1}")
        if not math.isfinite(error_reward):
            raise ValueError(f"error_reward: {error_reward}; want a finite number")
        self.fn = fn
        self.tasks = tasks
        self.name = name or f"python:{getattr(fn, '__name__', 'reward')}"
        self.error_reward = float(error_reward)
        self.min_reward, self.max_reward = float(min_reward), float(max_reward)
        self.token = token
        self.threads = max(1, threads)
        self.max_message_bytes = max_message_bytes
        self.replica_id = f"reward-py-{uuid.uuid4().hex[:16]}"
        self._lock = threading.Lock()
        self.scored = 0
        self.errors = 0
        self._stop = threading.Event()
        self.item_timeout_s = float(item_timeout_s)
        self.timeouts = 0
        self._pool = ScoringPool(spec=function_spec, fn=fn, size=self.threads, item_timeout_s=self.item_timeout_s,
                                 memory_mb=memory_mb, log=_log) if isolate else None

    @staticmethod
    def _fields(item) -> dict:
        fields = dict(item.metadata)
        fields.update(task=item.task, answer=item.reference_answer, item_id=item.item_id)
        return fields

    def score_one(self, item):
        """(reward, None), or (None, reason) when the function failed on `item`; on this
        thread, with no timeout (score_items isolates)."""
        value, error = evaluate(self.fn, item.prompt_text, item.response_text, self._fields(item))
        self._count(item, error, "")
        return value, error

    def score_items(self, items, deadline: Optional[float] = None, active: Callable[[], bool] = lambda: True):
        """A (reward, None) or (None, reason) per item, scored in the child processes
        (see the class); by `deadline` (time.monotonic()), items not scored by then (or
        once `active` says the call is gone) failing. Without isolation, on this thread."""
        if self._pool is None:
            out = []
            for item in items:
                if (deadline is not None and time.monotonic() >= deadline) or not active():
                    out.append((None, "not scored before the call's deadline"))
                    self._count(item, out[-1][1], "deadline")
                else:
                    out.append(self.score_one(item))
            return out
        outcomes = self._pool.score([(i.prompt_text, i.response_text, self._fields(i)) for i in items], deadline,
                                    active)
        out = []
        for item, ((value, error), kind) in zip(items, outcomes):
            self._count(item, error, kind)
            out.append((value, error))
        return out

    def _count(self, item, error: Optional[str], kind: str):
        """Counts an item scored and logs a failure (the first ones, then every 100th)."""
        with self._lock:
            self.scored += 1
            if error is None:
                return
            self.errors += 1
            errors = self.errors
            if kind == "timeout":
                self.timeouts += 1
        if errors <= 20 or errors % 100 == 0:
            what = {"timeout": "; its process was killed and replaced",
                    "died": "; its process was replaced"}.get(kind, "")
            _log(f"reward error #{errors}: item {item.item_id} (task {item.task}): {self.name} {error}{what}; "
                 f"scored {self.error_reward}")

    def serve(self, controller: Optional[str] = None, *, host: str = "127.0.0.1", port: int = 0,
              advertise: Optional[str] = None, ttl_ms: int = 10000, ready: Optional[Callable[[str], None]] = None):
        """Serves until stop() (or SIGTERM / SIGINT when run by main()); registers with
        `controller` (its registry) when given, heartbeats, and deregisters at the end."""
        # (gRPC's own default would refuse any request over 4 MiB: 1024 responses of 8 KiB)
        if self._pool is not None:
            self._pool.start()
            self._pool.wait_started()  # ("serving" once the children have loaded the function)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.threads),
                             options=[("grpc.max_receive_message_length", self.max_message_bytes),
                                      ("grpc.max_send_message_length", self.max_message_bytes)])
        reward_pb2_grpc.add_RewardServiceServicer_to_server(_Servicer(self), server)
        bound = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        server.start()
        address = f"{advertise or host}:{bound}"
        isolation = f"{self.threads} processes, {self.item_timeout_s:g} s an item" if self._pool else "in process"
        _log(f"serving {self.name} for task(s) {', '.join(self.tasks)} on {address} "
             f"(messages up to {self.max_message_bytes} bytes; {isolation})")
        registry = None
        try:
            if controller:
                registry = _Registration(controller, self, address, ttl_ms)
                registry.register()
                _log(f"registered with the controller at {controller} as {self.replica_id}")
            if ready is not None:
                ready(address)
            while not self._stop.wait(registry.interval if registry else 1.0):
                if registry:
                    registry.heartbeat()
        finally:
            if registry:
                registry.deregister()
            server.stop(grace=5).wait()
            if self._pool is not None:
                self._pool.close()
            _log(f"stopped: scored {self.scored} items ({self.errors} errors, {self.timeouts} timed out)")

    def stop(self):
        self._stop.set()


class _Registration:
    """The worker's record in the controller's registry: role reward, labelled with its tasks."""

    def __init__(self, controller: str, worker: RewardWorker, address: str, ttl_ms: int):
        self._channel = grpc.insecure_channel(controller)
        self._stub = controller_pb2_grpc.RegistryServiceStub(self._channel)
        self._metadata = [("authorization", f"Bearer {worker.token}")] if worker.token else []
        self._w = worker
        self._address = address
        self._ttl_ms = ttl_ms
        self._lease = ""
        self.interval = ttl_ms / 3000.0

    def register(self):
        info = common_pb2.ReplicaInfo(replica_id=self._w.replica_id, role=common_pb2.REPLICA_ROLE_REWARD,
                                      grpc_address=self._address, started_at_unix_ms=int(time.time() * 1000))
        info.labels[TASKS_LABEL] = ",".join(self._w.tasks)
        reply = self._stub.Register(controller_pb2.RegisterRequest(replica=info, ttl_ms=self._ttl_ms), timeout=10,
                                    metadata=self._metadata)
        self._lease = reply.lease_id
        if reply.heartbeat_interval_ms > 0:
            self.interval = reply.heartbeat_interval_ms / 1000.0

    def heartbeat(self):
        try:
            self._stub.Heartbeat(controller_pb2.HeartbeatRequest(replica_id=self._w.replica_id, lease_id=self._lease),
                                 timeout=5, metadata=self._metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:  # (the lease expired: the controller restarted, say)
                _log("the registry lost this worker's lease; registering again")
                try:
                    self.register()
                except grpc.RpcError as again:
                    _log(f"registering again failed: {again.code().name}: {again.details()}")
            else:
                _log(f"heartbeat failed: {e.code().name}: {e.details()}")

    def deregister(self):
        try:
            self._stub.Deregister(controller_pb2.DeregisterRequest(replica_id=self._w.replica_id, lease_id=self._lease),
                                  timeout=5, metadata=self._metadata)
        except grpc.RpcError:
            pass  # (the lease expires by itself)
        self._channel.close()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rlfleet.reward_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--function", required=True, help="MODULE:NAME or PATH.py:NAME: reward(prompt, completion, **fields)")
    parser.add_argument("--tasks", required=True, help="comma-separated tasks this worker scores")
    parser.add_argument("--controller", default="", help="controller host:port to register with (empty: none)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free one)")
    parser.add_argument("--advertise", default="", help="address others reach this worker at (default: --host)")
    parser.add_argument("--token_file", default="", help="file with the fleet's bearer token")
    parser.add_argument("--error_reward", type=float, default=0.0, help="reward of an item the function failed on")
    parser.add_argument("--threads", type=int, default=4,
                        help="items scored at once at most: the scoring processes (and the server's threads)")
    parser.add_argument("--item_timeout_s", type=float, default=DEFAULT_ITEM_TIMEOUT_S,
                        help="wall-clock limit of one item (0.01..3600 s): past it the item scores --error_reward "
                             "and its process is replaced")
    parser.add_argument("--item_memory_mb", type=int, default=DEFAULT_MEMORY_MB,
                        help="address-space limit of each scoring process, in MiB (0: none)")
    parser.add_argument("--max_message_bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                        help="largest Score request (and reply) in bytes: the fleet's --max_message_bytes "
                             "(default 16 MiB, as every rlfleet service's)")
    args = parser.parse_args(argv)
    try:
        fn = load_function(args.function)
        token = open(args.token_file).read().strip() if args.token_file else None
        worker = RewardWorker(fn, args.tasks.split(","), error_reward=args.error_reward, token=token,
                              threads=args.threads, max_message_bytes=args.max_message_bytes,
                              item_timeout_s=args.item_timeout_s, memory_mb=args.item_memory_mb,
                              function_spec=args.function)
    except (ValueError, OSError) as e:
        print(f"rlfleet-reward-worker: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop())
    try:
        worker.serve(args.controller or None, host=args.host, port=args.port, advertise=args.advertise or None)
    except grpc.RpcError as e:
        print(f"rlfleet-reward-worker: registering with {args.controller}: {e.code().name}: {e.details()}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
