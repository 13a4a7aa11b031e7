#!/usr/bin/python3
"""Bad-input battery: sends malformed requests to every service of a live local fleet
and classifies what each one gets back (STYLE.md, "Input from the network"; issue 18).

  mkdir -p /tmp/rlfleet_py && protoc -I proto --python_out=/tmp/rlfleet_py proto/rlfleet/v1/*.proto
  PYTHONPATH=/tmp/rlfleet_py /usr/bin/python3 tests/battery/bad_input_battery.py \
      --controller=HOST:PORT [--out=FILE] [--token=T] [--admin_token=T] [--inference_token=T]

The other services are found through the controller's RegistryService.ListReplicas
(override any with --rollout= --reward= --buffer= --trainer= --weights=).
Each case has a 20 s deadline and is classified:
  refused   non-OK status other than UNAVAILABLE / DEADLINE_EXCEEDED / UNKNOWN / INTERNAL,
            with a message (an empty message is reported as "internal": not a clear error)
  accepted  OK (suspicious for bad input unless the case says expect="ok")
  internal  INTERNAL / UNKNOWN
  hung      DEADLINE_EXCEEDED
  crashed   UNAVAILABLE, or any service stopped answering grpc.health.v1.Health/Check after it
  script-error  the request could not be built (a bug in this script, not the service)
Exit status 1 if any case crashed or hung, or was accepted unexpectedly.

--dry_run builds and serializes every request without sending (needs no fleet).
Run it on an idle fleet (no run active): a run in progress makes StartRun refuse
everything with FAILED_PRECONDITION first, and accepted cases change shared state (the
script undoes what it can: stops a started run, nacks leases, restores the buffer's
configuration and Scale counts, deregisters fake replicas and destinations).
"""
import argparse
import os
import sys
import tempfile
import time
import uuid

from rlfleet.v1 import (buffer_pb2, common_pb2, controller_pb2, reward_pb2, rollout_pb2,
                        trainer_pb2, weights_pb2)

DEADLINE_S = 20.0
HEALTH_DEADLINE_S = 5.0
NAN = float("nan")
INF = float("inf")
U32_MAX = 2**32 - 1
I32_MIN_AS_U32 = 2**31
U64_MAX = 2**64 - 1
I64_MAX = 2**63 - 1
SERVICES = ("controller", "rollout", "reward", "buffer", "trainer", "weights")
SERVICE_NAME = {
    "controller": "ControllerService", "registry": "RegistryService", "rollout": "RolloutService",
    "reward": "RewardService", "buffer": "BufferService", "trainer": "TrainerService",
    "weights": "WeightsService",
}
# Which address serves each proto service (RegistryService lives in the controller).
ADDRESS_OF = {"registry": "controller"}
ROLE_NAME = {
    common_pb2.REPLICA_ROLE_ROLLOUT: "rollout", common_pb2.REPLICA_ROLE_REWARD: "reward",
    common_pb2.REPLICA_ROLE_BUFFER: "buffer", common_pb2.REPLICA_ROLE_TRAINER: "trainer",
    common_pb2.REPLICA_ROLE_WEIGHTS: "weights",
}

# Response types of the RPCs used (request types come from the request object).
RESPONSE = {
    ("controller", "GetStatus"): controller_pb2.GetStatusResponse,
    ("controller", "StartRun"): controller_pb2.StartRunResponse,
    ("controller", "StopRun"): controller_pb2.StopRunResponse,
    ("controller", "Scale"): controller_pb2.ScaleResponse,
    ("registry", "Register"): controller_pb2.RegisterResponse,
    ("registry", "Heartbeat"): controller_pb2.HeartbeatResponse,
    ("registry", "Deregister"): controller_pb2.DeregisterResponse,
    ("registry", "ListReplicas"): controller_pb2.ListReplicasResponse,
    ("rollout", "Generate"): rollout_pb2.GenerateResponse,
    ("rollout", "GenerateBatch"): rollout_pb2.GenerateBatchResponse,
    ("rollout", "UpdateWeights"): rollout_pb2.CommitWeightsResponse,
    ("rollout", "CommitWeights"): rollout_pb2.CommitWeightsResponse,
    ("rollout", "GetInfo"): rollout_pb2.GetInfoResponse,
    ("rollout", "Drain"): rollout_pb2.DrainResponse,
    ("rollout", "Resume"): rollout_pb2.ResumeResponse,
    ("reward", "Score"): reward_pb2.ScoreResponse,
    ("reward", "ListRewardFunctions"): reward_pb2.ListRewardFunctionsResponse,
    ("buffer", "PutExperiences"): buffer_pb2.PutExperiencesResponse,
    ("buffer", "SampleBatch"): buffer_pb2.SampleBatchResponse,
    ("buffer", "AckBatch"): buffer_pb2.AckBatchResponse,
    ("buffer", "NackBatch"): buffer_pb2.NackBatchResponse,
    ("buffer", "Configure"): buffer_pb2.ConfigureResponse,
    ("buffer", "GetStats"): buffer_pb2.GetStatsResponse,
    ("trainer", "TrainStep"): trainer_pb2.TrainStepResponse,
    ("trainer", "GetState"): trainer_pb2.GetStateResponse,
    ("trainer", "SaveCheckpoint"): trainer_pb2.SaveCheckpointResponse,
    ("trainer", "LoadCheckpoint"): trainer_pb2.LoadCheckpointResponse,
    ("trainer", "PublishWeights"): trainer_pb2.PublishWeightsResponse,
    ("weights", "PublishVersion"): weights_pb2.PublishVersionResponse,
    ("weights", "RegisterDestination"): weights_pb2.RegisterDestinationResponse,
    ("weights", "UnregisterDestination"): weights_pb2.UnregisterDestinationResponse,
    ("weights", "SyncVersion"): weights_pb2.SyncVersionResponse,
    ("weights", "GetPlan"): weights_pb2.GetPlanResponse,
}
STREAMING = {("rollout", "Generate")}


def short(text, n=160):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


# --------------------------------------------------------------------------------------
# Transport


class Fleet:
    """Channels to every service through generic stubs (no generated _grpc modules)."""

    def __init__(self, grpc_module, addresses, token=None, admin_token=None, inference_token=None):
        self.grpc = grpc_module
        self.addresses = addresses  # name -> "host:port" (rollout: the replica under test)
        self.extra_health = {}  # name -> address: every other replica, health-checked too
        options = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]
        self.channels = {}
        self._options = options
        bearer = admin_token or token
        self.metadata = [("authorization", "Bearer " + bearer)] if bearer else None
        # a fleet member's credential, for the cases that check a controller-only path
        self.fleet_metadata = [("authorization", "Bearer " + token)] if token else None
        self.roles = bool(admin_token)
        # the gateway's credential (Generate and reading the registry only)
        self.inference_metadata = [("authorization", "Bearer " + inference_token)] if inference_token else None

    def channel(self, address):
        if address not in self.channels:
            self.channels[address] = self.grpc.insecure_channel(address, options=self._options)
        return self.channels[address]

    def address(self, service):
        return self.addresses.get(ADDRESS_OF.get(service, service))

    def call(self, service, method, request, timeout=DEADLINE_S, as_fleet=False, as_inference=False):
        """Sends request (a message, or raw bytes); returns the response (a list for streams).
        as_fleet: with the fleet token instead of the admin token; as_inference: with the
        inference token."""
        metadata = self.inference_metadata if as_inference else self.fleet_metadata if as_fleet else self.metadata
        address = self.address(service)
        path = "/rlfleet.v1.%s/%s" % (SERVICE_NAME[service], method)
        response_type = RESPONSE[(service, method)]
        serializer = (lambda m: m) if isinstance(request, bytes) else (lambda m: m.SerializeToString())
        channel = self.channel(address)
        if (service, method) in STREAMING:
            rpc = channel.unary_stream(path, request_serializer=serializer,
                                       response_deserializer=response_type.FromString)
            return list(rpc(request, timeout=timeout, metadata=metadata))
        rpc = channel.unary_unary(path, request_serializer=serializer,
                                  response_deserializer=response_type.FromString)
        return rpc(request, timeout=timeout, metadata=metadata)

    def health(self, address):
        """None if the server answers grpc.health.v1.Health/Check (any serving status), else why not."""
        rpc = self.channel(address).unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,  # HealthCheckRequest{service=""} is empty
            response_deserializer=lambda b: b)
        try:
            rpc(b"", timeout=HEALTH_DEADLINE_S, metadata=self.metadata)
            return None
        except self.grpc.RpcError as e:
            if e.code() in (self.grpc.StatusCode.UNAVAILABLE, self.grpc.StatusCode.DEADLINE_EXCEEDED):
                return "%s: %s" % (e.code().name, short(e.details(), 80))
            return None  # it answered (e.g. UNAUTHENTICATED, NOT_FOUND): alive

    def all_health_targets(self):
        targets = {name: addr for name, addr in self.addresses.items() if addr}
        targets.update(self.extra_health)
        return targets


# --------------------------------------------------------------------------------------
# Context: what the fleet reports, so that a case differs from a valid request in one field


class Ctx:
    vocab = 64
    max_seq_len = 128
    rollout_layout = None  # common_pb2.ShardLayout
    rollout_version = 0
    rollout_replica_id = ""
    trainer_step = 0
    trainer_layout = None
    trainer_version = 0
    buffer_config = None  # buffer_pb2.ConfigureRequest
    buffer_version = 0
    run_id = ""
    run_state = 0
    desired = {}  # role -> desired count
    fifo = None  # a FIFO on this host (the fleet is local)
    tag = uuid.uuid4().hex[:8]
    counter = 0

    def uid(self, prefix="battery"):
        self.counter += 1
        return "%s-%s-%d" % (prefix, self.tag, self.counter)


def gather_context(fleet, ctx, log):
    def quietly(what, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - context is best-effort
            code = e.code().name if hasattr(e, "code") else type(e).__name__
            log("context: %s failed (%s); using defaults" % (what, code))
            return None

    if fleet.address("controller"):
        st = quietly("ControllerService.GetStatus",
                     lambda: fleet.call("controller", "GetStatus", controller_pb2.GetStatusRequest()))
        if st is not None:
            ctx.run_id, ctx.run_state = st.run_id, st.state
            ctx.desired = {r.role: r.desired for r in st.replicas}
            log("context: run %r state %s step %d version %d" % (
                st.run_id, controller_pb2.RunState.Name(st.state), st.step, st.policy_version.version))
            if st.state in (controller_pb2.RUN_STATE_STARTING, controller_pb2.RUN_STATE_RUNNING):
                log("warning: a run is active; StartRun cases will mostly see FAILED_PRECONDITION")
    if fleet.address("rollout"):
        info = quietly("RolloutService.GetInfo",
                       lambda: fleet.call("rollout", "GetInfo", rollout_pb2.GetInfoRequest()))
        if info is not None:
            if info.model.vocab_size:
                ctx.vocab = info.model.vocab_size
            if info.model.max_seq_len:
                ctx.max_seq_len = info.model.max_seq_len
            if info.layout.tensors:
                ctx.rollout_layout = info.layout
            ctx.rollout_version = info.installed_version.version
            ctx.rollout_replica_id = info.replica_id
            log("context: rollout vocab %d max_seq_len %d installed version %d (%s)" % (
                ctx.vocab, ctx.max_seq_len, ctx.rollout_version,
                rollout_pb2.ReplicaServingState.Name(info.state)))
            if ctx.rollout_version == 0:
                log("warning: the rollout replica has no weights; Generate cases may see "
                    "FAILED_PRECONDITION before their arguments are checked")
    if fleet.address("trainer"):
        state = quietly("TrainerService.GetState",
                        lambda: fleet.call("trainer", "GetState", trainer_pb2.GetStateRequest()))
        if state is not None:
            ctx.trainer_step = state.step
            ctx.trainer_version = state.policy_version.version
            if state.config.layout.tensors:
                ctx.trainer_layout = state.config.layout
            if state.config.model.vocab_size and not fleet.address("rollout"):
                ctx.vocab = state.config.model.vocab_size
                ctx.max_seq_len = state.config.model.max_seq_len or ctx.max_seq_len
            log("context: trainer step %d version %d" % (ctx.trainer_step, ctx.trainer_version))
    if fleet.address("buffer"):
        stats = quietly("BufferService.GetStats",
                        lambda: fleet.call("buffer", "GetStats", buffer_pb2.GetStatsRequest()))
        if stats is not None:
            ctx.buffer_config = buffer_pb2.ConfigureRequest()
            ctx.buffer_config.CopyFrom(stats.config)
            ctx.buffer_version = stats.current_policy_version
            log("context: buffer run %r group_size %d version %d" % (
                stats.config.run_id, stats.config.group_size, stats.current_policy_version))


def make_fifo(ctx):
    try:
        path = os.path.join(tempfile.mkdtemp(prefix="rlfleet_battery_"), "fifo")
        os.mkfifo(path)
        ctx.fifo = path
    except OSError:
        ctx.fifo = "/tmp/rlfleet_battery_no_fifo"


# --------------------------------------------------------------------------------------
# Cases


class Case:
    def __init__(self, service, method, name, build, expect="refused", on_ok=None, cleanup=None, as_fleet=False,
                 as_inference=False, setup=None):
        self.service, self.method, self.name = service, method, name
        # sent with the fleet token (--token), not the admin token: a controller-only path
        # must refuse it; run only when the fleet has roles (--admin_token given)
        self.as_fleet = as_fleet
        # sent with the inference token (--inference_token): anything but Generate and
        # reading the registry must refuse it; run only when that token is given
        self.as_inference = as_inference
        self.setup = setup  # (fleet, ctx) -> None, run before the call (e.g. a replica to collide with)
        self.build = build  # ctx -> request (message or bytes)
        self.expect = expect  # "refused" or "ok"
        self.on_ok = on_ok  # response -> None, or ("refused", detail) for per-item rejections
        self.cleanup = cleanup  # (fleet, ctx, response) -> None, run after an OK
        self.result = None
        self.detail = ""

    @property
    def label(self):
        return "%s.%s %s" % (self.service, self.method, self.name)


def mutated(base, mutate):
    """build function: base(ctx) then mutate(request, ctx) in place."""
    def build(ctx):
        request = base(ctx)
        mutate(request, ctx)
        return request
    return build


def unknown_field_bytes(size):
    """Serialized unknown field 999 (length-delimited) of `size` bytes."""
    tag = (999 << 3) | 2
    out = bytearray()

    def varint(v):
        while True:
            b = v & 0x7F
            v >>= 7
            if v:
                out.append(b | 0x80)
            else:
                out.append(b)
                return
    varint(tag)
    varint(size)
    return bytes(out) + b"x" * size


# ---- shared builders ----


def file_descriptor(path, length=4096, offset=0):
    d = common_pb2.TransferDescriptor()
    d.segment.backend = common_pb2.TRANSFER_BACKEND_FILE
    d.segment.worker_address = path.encode()
    # offset + length past 2^64 wraps: a small segment then passes a naive range check
    d.segment.length_bytes = length + offset if length + offset <= U64_MAX else 4096
    d.segment.memory_kind = common_pb2.MEMORY_KIND_HOST
    d.offset_bytes = offset
    d.length_bytes = length
    d.digest.algorithm = common_pb2.DIGEST_ALGORITHM_XXHASH64
    d.digest.value = 0x1234
    d.version = 1
    return d


def forged_ucx_descriptor(length=1 << 30):
    d = common_pb2.TransferDescriptor()
    s = d.segment
    s.backend = common_pb2.TRANSFER_BACKEND_UCX
    s.packed_rkey = os.urandom(512)
    s.worker_address = os.urandom(256)
    s.base_address = 0x7F0000000000
    s.length_bytes = length
    s.memory_kind = common_pb2.MEMORY_KIND_HOST
    s.registration_id = 1
    s.registration_epoch = 1
    s.owner_replica_id = "forged"
    s.mac = os.urandom(32)
    s.mac_expires_unix_ms = int(time.time() * 1000) + 60000
    d.length_bytes = length
    d.digest.algorithm = common_pb2.DIGEST_ALGORITHM_XXHASH64
    d.digest.value = 1
    d.version = 1
    return d


def small_layout(world_size=1, n_tensors=1, shape=(4, 4)):
    layout = common_pb2.ShardLayout(world_size=world_size)
    for i in range(n_tensors):
        t = layout.tensors.add()
        t.spec.name = "battery.t%d.weight" % i
        t.spec.dtype = common_pb2.DTYPE_FLOAT32
        t.spec.shape.extend(shape)
        t.kind = common_pb2.LAYOUT_KIND_REPLICATED
    return layout


def experience(ctx, i=0, group=None, n=3, version=None):
    e = common_pb2.Experience()
    e.experience_id.value = "%s/p/%d" % (ctx.uid(), i)
    e.prompt_id = "battery-prompt"
    e.group_id = group or ctx.uid("battery-group")
    e.task = "reverse"
    e.prompt_token_ids.extend([1, 4, 5, 6])
    e.response_token_ids.extend([7 % ctx.vocab] * (n - 1) + [2])
    e.response_logprobs.extend([-1.0] * n)
    v = version if version is not None else max(ctx.trainer_version, ctx.buffer_version, 1)
    e.token_policy_versions.extend([v] * n)
    e.reward = float(i % 2)
    e.finish_reason = common_pb2.FINISH_REASON_STOP
    e.created_at_unix_ms = int(time.time() * 1000)
    return e


# ---- controller ----


def controller_cases():
    cases = []

    def start_base(ctx):
        r = controller_pb2.StartRunRequest(run_id=ctx.uid())
        c = r.config
        c.task = "reverse"
        c.group_size = 4
        c.batch_size = 2
        c.learning_rate = 1e-3
        c.total_steps = 1
        c.max_new_tokens = 8
        c.temperature = 1.0
        c.rollout_replicas = 1
        c.ppo_epochs = 1
        c.clip_ratio = 0.2
        return r

    def stop_started(fleet, ctx, response):
        try:
            fleet.call("controller", "StopRun", controller_pb2.StopRunRequest(run_id=response.run_id, grace_ms=1000))
        except Exception:  # noqa: BLE001
            pass

    def sr(name, mutate, expect="refused"):
        cases.append(Case("controller", "StartRun", name, mutated(start_base, mutate), expect,
                          cleanup=stop_started))

    def setc(field, value):
        return lambda r, ctx: setattr(r.config, field, value)

    # (every RunConfig field has a default: 0 or empty means it, so these are valid runs)
    cases.append(Case("controller", "StartRun", "empty-request", lambda ctx: controller_pb2.StartRunRequest(),
                      expect="ok", cleanup=stop_started))
    sr("task-empty", setc("task", ""), expect="ok")
    sr("task-unknown", setc("task", "no_such_task"))
    sr("task-shell-syntax", setc("task", "reverse; touch /tmp/rlfleet_pwned"))
    sr("group_size-0", setc("group_size", 0), expect="ok")
    sr("group_size-65", setc("group_size", 65))
    sr("group_size-u32max", setc("group_size", U32_MAX))
    sr("batch_size-0", setc("batch_size", 0), expect="ok")
    sr("batch_size-1025", setc("batch_size", 1025))
    sr("batch_size-2^31", setc("batch_size", I32_MIN_AS_U32))
    sr("learning_rate-nan", setc("learning_rate", NAN))
    sr("learning_rate-inf", setc("learning_rate", INF))
    sr("learning_rate-negative", setc("learning_rate", -1.0))
    sr("learning_rate-0", setc("learning_rate", 0.0), expect="ok")
    sr("temperature-nan", setc("temperature", NAN))
    sr("temperature-negative", setc("temperature", -1.0))
    sr("entropy_coef-nan", setc("entropy_coef", NAN))
    sr("entropy_coef-negative", setc("entropy_coef", -1.0))
    sr("clip_ratio-nan", setc("clip_ratio", NAN))
    sr("stop_at_exact_match-nan", setc("stop_at_exact_match", NAN))
    sr("max_new_tokens-u32max", setc("max_new_tokens", U32_MAX))
    sr("ppo_epochs-u32max", setc("ppo_epochs", U32_MAX))
    sr("rollout_replicas-0", setc("rollout_replicas", 0), expect="ok")
    sr("algorithm-unknown-enum-99", setc("algorithm", 99))
    sr("algorithm-ppo-unsupported", setc("algorithm", common_pb2.ALGORITHM_PPO))
    sr("algorithm-rloo-unsupported", setc("algorithm", common_pb2.ALGORITHM_RLOO))
    sr("model-set-unsupported", lambda r, ctx: setattr(r.config.model, "vocab_size", 64))
    sr("task_params-unknown-key", lambda r, ctx: r.config.task_params.update({"evil": "1"}))
    sr("task_params-min_len-garbage", lambda r, ctx: r.config.task_params.update({"min_len": "abc"}))
    sr("task_params-max_len-huge", lambda r, ctx: r.config.task_params.update({"max_len": "99999999999999999999"}))
    sr("task_params-min_len-negative", lambda r, ctx: r.config.task_params.update({"min_len": "-5"}))
    sr("run_id-shell-syntax", lambda r, ctx: setattr(r, "run_id", "x'; touch /tmp/rlfleet_pwned; '"))
    sr("run_id-command-substitution", lambda r, ctx: setattr(r, "run_id", "$(touch /tmp/rlfleet_pwned)"))
    sr("run_id-dotdot", lambda r, ctx: setattr(r, "run_id", ".."))
    sr("run_id-traversal", lambda r, ctx: setattr(r, "run_id", "../../../tmp/rlfleet_battery"))
    sr("run_id-slash", lambda r, ctx: setattr(r, "run_id", "a/b"))
    sr("run_id-absolute", lambda r, ctx: setattr(r, "run_id", "/etc/rlfleet_battery"))
    sr("run_id-nul-byte", lambda r, ctx: setattr(r, "run_id", "run\x00id"))
    sr("run_id-4096-bytes", lambda r, ctx: setattr(r, "run_id", "a" * 4096))
    # (the controller does not know the trainer's --checkpoint_root: the trainer refuses
    # these at the run's first checkpoint, which fails the run; see docs/unsupported_fields.md)
    sr("checkpoint_dir-absolute-outside", setc("checkpoint_dir", "/etc"), expect="ok")
    sr("checkpoint_dir-traversal", setc("checkpoint_dir", "../../../../tmp/rlfleet_battery"))
    sr("checkpoint_dir-dev-zero", setc("checkpoint_dir", "/dev/zero"), expect="ok")

    def stop(name, mutate):
        def build(ctx):
            r = controller_pb2.StopRunRequest(run_id="battery-no-such-run-" + ctx.tag, grace_ms=1000)
            mutate(r, ctx)
            return r
        cases.append(Case("controller", "StopRun", name, build))

    stop("run_id-unknown", lambda r, ctx: None)
    stop("run_id-traversal", lambda r, ctx: setattr(r, "run_id", "../../../etc"))
    stop("run_id-shell-syntax", lambda r, ctx: setattr(r, "run_id", "x; touch /tmp/rlfleet_pwned"))
    stop("grace_ms-negative", lambda r, ctx: setattr(r, "grace_ms", -1))
    stop("grace_ms-i64max-checkpoint", lambda r, ctx: (setattr(r, "grace_ms", I64_MAX), setattr(r, "checkpoint", True)))

    def restore_scale(fleet, ctx, response):
        pass  # restored once at the end (restore_state)

    def scale(name, role, count):
        cases.append(Case("controller", "Scale", name,
                          lambda ctx: controller_pb2.ScaleRequest(role=role, target_count=count),
                          cleanup=restore_scale))

    scale("role-unspecified", common_pb2.REPLICA_ROLE_UNSPECIFIED, 1)
    scale("role-buffer", common_pb2.REPLICA_ROLE_BUFFER, 2)
    scale("role-controller", common_pb2.REPLICA_ROLE_CONTROLLER, 2)
    scale("role-unknown-enum-99", 99, 1)
    scale("target_count-1025", common_pb2.REPLICA_ROLE_REWARD, 1025)
    scale("target_count-2^31", common_pb2.REPLICA_ROLE_ROLLOUT, I32_MIN_AS_U32)
    scale("target_count-u32max", common_pb2.REPLICA_ROLE_ROLLOUT, U32_MAX)

    cases.append(Case("controller", "GetStatus", "unknown-field", lambda ctx: unknown_field_bytes(16), expect="ok"))
    cases.append(Case("controller", "GetStatus", "request-5MiB", lambda ctx: unknown_field_bytes(5 << 20),
                      expect="ok"))  # (under the 16 MiB message limit)

    # RegistryService (served by the controller)
    def deregister(fleet, ctx, response):
        try:
            fleet.call("registry", "Deregister", controller_pb2.DeregisterRequest(
                replica_id=response.replica.replica_id, lease_id=response.lease_id))
        except Exception:  # noqa: BLE001
            pass

    def reg_base(ctx):
        r = controller_pb2.RegisterRequest(ttl_ms=10000)
        r.replica.replica_id = ctx.uid("battery-replica")
        r.replica.role = common_pb2.REPLICA_ROLE_REWARD
        r.replica.grpc_address = "127.0.0.1:1"
        r.replica.run_id = "battery-no-such-run"
        return r

    def reg(name, mutate, expect="refused"):
        cases.append(Case("registry", "Register", name, mutated(reg_base, mutate), expect=expect, cleanup=deregister))

    reg("ttl_ms-1ms", lambda r, ctx: setattr(r, "ttl_ms", 1))
    reg("ttl_ms-negative", lambda r, ctx: setattr(r, "ttl_ms", -1))
    reg("ttl_ms-i64max", lambda r, ctx: setattr(r, "ttl_ms", I64_MAX))
    reg("replica_id-empty", lambda r, ctx: setattr(r.replica, "replica_id", ""))
    reg("replica_id-129-bytes", lambda r, ctx: setattr(r.replica, "replica_id", "r" * 129))
    reg("role-unspecified", lambda r, ctx: setattr(r.replica, "role", common_pb2.REPLICA_ROLE_UNSPECIFIED))
    reg("role-unknown-enum-99", lambda r, ctx: setattr(r.replica, "role", 99))
    reg("grpc_address-empty", lambda r, ctx: setattr(r.replica, "grpc_address", ""))
    # labels and endpoints: controller.proto / libs/registry/registry.h bounds
    reg("labels-33", lambda r, ctx: r.replica.labels.update({"k%d" % i: "v" for i in range(33)}))
    reg("labels-key-empty", lambda r, ctx: r.replica.labels.update({"": "v"}))
    reg("labels-key-129-bytes", lambda r, ctx: r.replica.labels.update({"k" * 129: "v"}))
    reg("labels-value-1025-bytes", lambda r, ctx: r.replica.labels.update({"pool": "v" * 1025}))
    reg("labels-9KiB-in-all", lambda r, ctx: r.replica.labels.update({"k%d" % i: "v" * 1024 for i in range(9)}))
    reg("data_plane_endpoints-65", lambda r, ctx: [r.replica.data_plane_endpoints.add(host="127.0.0.1", port=1)
                                                   for _ in range(65)])
    reg("data_plane_endpoints-port-70000",
        lambda r, ctx: r.replica.data_plane_endpoints.add(host="127.0.0.1", port=70000))
    reg("run_id-129-bytes", lambda r, ctx: setattr(r.replica, "run_id", "r" * 129))
    # load stats feed the autoscaler and routing: finite and in range
    reg("load-utilization-nan", lambda r, ctx: setattr(r.replica.load, "utilization", float("nan")))
    reg("load-utilization-2", lambda r, ctx: setattr(r.replica.load, "utilization", 2.0))
    reg("load-utilization-negative", lambda r, ctx: setattr(r.replica.load, "utilization", -0.5))
    reg("load-tokens_per_s-inf", lambda r, ctx: setattr(r.replica.load, "tokens_per_s", float("inf")))
    reg("load-tokens_per_s-negative", lambda r, ctx: setattr(r.replica.load, "tokens_per_s", -1.0))
    reg("load-queued_requests-u32max", lambda r, ctx: setattr(r.replica.load, "queued_requests", U32_MAX))
    reg("load-inflight_requests-2^21", lambda r, ctx: setattr(r.replica.load, "inflight_requests", 1 << 21))
    reg("load-memory_used_bytes-u64max", lambda r, ctx: setattr(r.replica.load, "memory_used_bytes", U64_MAX))
    reg("policy_version-digest-300-bytes", lambda r, ctx: setattr(r.replica.policy_version, "digest", "d" * 300))

    # a live replica's id, from another address: ALREADY_EXISTS naming the holder (its
    # lease is not replaced; the cleanup deregisters only if it was). The holder is the
    # battery's own replica, registered first from 127.0.0.1:2 (a real replica's id would
    # do as well, but its lease would be lost if the check failed)
    def register_holder(fleet, ctx):
        ctx.holder_id = ctx.uid("battery-holder")
        holder = controller_pb2.RegisterRequest(ttl_ms=2000)  # (it expires by itself 2 s later)
        holder.replica.replica_id = ctx.holder_id
        holder.replica.role = common_pb2.REPLICA_ROLE_ROLLOUT
        holder.replica.grpc_address = "127.0.0.1:2"
        fleet.call("registry", "Register", holder)

    def hijack(r, ctx):
        r.replica.replica_id = getattr(ctx, "holder_id", "") or "battery-holder-dry-run"
        r.replica.role = common_pb2.REPLICA_ROLE_ROLLOUT
        r.replica.grpc_address = "127.0.0.1:1"
        r.replica.run_id = ""
    cases.append(Case("registry", "Register", "live-id-from-another-address", mutated(reg_base, hijack),
                      cleanup=deregister, setup=register_holder))
    # reward task routes are the controller role's (a fleet token must not route a run's
    # rewards to itself); run only when the fleet has roles (--admin_token)
    cases.append(Case("registry", "Register", "labels-reward.tasks-with-fleet-token",
                      mutated(reg_base, lambda r, ctx: r.replica.labels.update({"reward.tasks": "reverse"})),
                      cleanup=deregister, as_fleet=True))
    cases.append(Case("controller", "Scale", "with-fleet-token",
                      lambda ctx: controller_pb2.ScaleRequest(role=common_pb2.REPLICA_ROLE_ROLLOUT, target_count=1),
                      cleanup=restore_scale, as_fleet=True))

    # the gateway's inference token reads the registry and generates, nothing else
    cases.append(Case("registry", "Register", "with-inference-token", reg_base, cleanup=deregister,
                      as_inference=True))
    cases.append(Case("controller", "Scale", "with-inference-token",
                      lambda ctx: controller_pb2.ScaleRequest(role=common_pb2.REPLICA_ROLE_ROLLOUT, target_count=1),
                      cleanup=restore_scale, as_inference=True))
    cases.append(Case("registry", "ListReplicas", "with-inference-token", lambda ctx: controller_pb2.ListReplicasRequest(),
                      expect="ok", as_inference=True))

    def beat(name, **load):
        def build(ctx):
            r = controller_pb2.HeartbeatRequest(replica_id="battery-no-such-replica", lease_id="no-such-lease")
            for field, value in load.items():
                setattr(r.load, field, value)
            return r
        cases.append(Case("registry", "Heartbeat", name, build))

    beat("load-utilization-nan", utilization=float("nan"))
    beat("load-tokens_per_s-minus-inf", tokens_per_s=float("-inf"))
    beat("load-queued_requests-u32max", queued_requests=U32_MAX)
    beat("load-memory_capacity_bytes-u64max", memory_capacity_bytes=U64_MAX)
    cases.append(Case("registry", "ListReplicas", "page_size-1001",
                      lambda ctx: controller_pb2.ListReplicasRequest(page=common_pb2.PageRequest(page_size=1001))))
    cases.append(Case("registry", "ListReplicas", "page_size-u32max",
                      lambda ctx: controller_pb2.ListReplicasRequest(page=common_pb2.PageRequest(page_size=U32_MAX))))
    cases.append(Case("registry", "ListReplicas", "page_token-garbage",
                      lambda ctx: controller_pb2.ListReplicasRequest(page=common_pb2.PageRequest(page_token="\x00garbage"))))
    cases.append(Case("registry", "Heartbeat", "empty-ids", lambda ctx: controller_pb2.HeartbeatRequest()))
    cases.append(Case("registry", "Heartbeat", "unknown-lease-version-u64max",
                      lambda ctx: controller_pb2.HeartbeatRequest(
                          replica_id="battery-no-such-replica", lease_id="no-such-lease",
                          policy_version=common_pb2.PolicyVersion(version=U64_MAX))))
    cases.append(Case("registry", "Deregister", "empty-replica_id", lambda ctx: controller_pb2.DeregisterRequest()))
    return cases


# ---- rollout ----


def rollout_cases():
    cases = []

    def gen_base(ctx):
        r = rollout_pb2.GenerateRequest(request_id=ctx.uid(), prompt_id="battery-prompt", task="reverse")
        r.prompt_token_ids.extend([t % ctx.vocab for t in (1, 4, 5, 6)])
        r.sampling.temperature = 1.0
        r.sampling.max_new_tokens = 4
        r.num_samples = 1
        return r

    def gen(name, mutate, expect="refused"):
        cases.append(Case("rollout", "Generate", name, mutated(gen_base, mutate), expect))

    def samp(field, value):
        return lambda r, ctx: setattr(r.sampling, field, value)

    def tokens(fn):
        def mutate(r, ctx):
            del r.prompt_token_ids[:]
            r.prompt_token_ids.extend(fn(ctx))
        return mutate

    cases.append(Case("rollout", "Generate", "empty-request", lambda ctx: rollout_pb2.GenerateRequest()))
    gen("prompt-empty", tokens(lambda ctx: []))
    gen("token-negative", tokens(lambda ctx: [1, -1, 2]))
    gen("token-equals-vocab", tokens(lambda ctx: [1, ctx.vocab]))
    gen("token-i32max", tokens(lambda ctx: [2**31 - 1]))
    gen("token-i32min", tokens(lambda ctx: [-2**31]))
    gen("prompt-max_seq_len-tokens", tokens(lambda ctx: [1] * ctx.max_seq_len))
    gen("prompt-1M-tokens", tokens(lambda ctx: [1] * 1000000))
    gen("max_new_tokens-u32max", samp("max_new_tokens", U32_MAX))
    gen("max_new_tokens-2^31", samp("max_new_tokens", I32_MIN_AS_U32))
    gen("max_new_tokens-over-max_seq_len", lambda r, ctx: setattr(r.sampling, "max_new_tokens", ctx.max_seq_len))
    gen("temperature-nan", samp("temperature", NAN))
    gen("temperature-inf", samp("temperature", INF))
    gen("temperature-negative", samp("temperature", -1.0))
    gen("top_p-nan", samp("top_p", NAN))
    gen("top_p-1.5", samp("top_p", 1.5))
    gen("top_p-negative", samp("top_p", -0.5))
    gen("top_k-2^31", samp("top_k", I32_MIN_AS_U32))
    gen("top_k-u32max", samp("top_k", U32_MAX))
    gen("top_k-2^20+1", samp("top_k", 2**20 + 1))
    gen("top_k-above-vocab", lambda r, ctx: setattr(r.sampling, "top_k", ctx.vocab + 1), expect="ok")
    gen("stop_token_ids-17", lambda r, ctx: r.sampling.stop_token_ids.extend([2] * 17))
    gen("num_samples-65", lambda r, ctx: setattr(r, "num_samples", 65))
    gen("num_samples-2^31", lambda r, ctx: setattr(r, "num_samples", I32_MIN_AS_U32))
    gen("num_samples-u32max", lambda r, ctx: setattr(r, "num_samples", U32_MAX))
    gen("chunk_tokens-1025", lambda r, ctx: setattr(r, "chunk_tokens", 1025))
    gen("chunk_tokens-u32max", lambda r, ctx: setattr(r, "chunk_tokens", U32_MAX))
    gen("request_id-empty", lambda r, ctx: setattr(r, "request_id", ""))
    gen("request_id-129-bytes", lambda r, ctx: setattr(r, "request_id", "r" * 129))
    gen("request_id-1MiB", lambda r, ctx: setattr(r, "request_id", "r" * (1 << 20)))
    gen("min_policy_version-u64max", lambda r, ctx: setattr(r, "min_policy_version", U64_MAX))

    def batch_base(ctx):
        r = rollout_pb2.GenerateBatchRequest(request_id=ctx.uid(), num_samples=1)
        p = r.prompts.add(prompt_id="battery-prompt", task="reverse")
        p.prompt_token_ids.extend([t % ctx.vocab for t in (1, 4, 5, 6)])
        r.sampling.temperature = 1.0
        r.sampling.max_new_tokens = 4
        return r

    def gb(name, mutate, expect="refused"):
        cases.append(Case("rollout", "GenerateBatch", name, mutated(batch_base, mutate), expect))

    def n_prompts(n):
        def mutate(r, ctx):
            proto = r.prompts[0]
            for _ in range(n - 1):
                r.prompts.add().CopyFrom(proto)
        return mutate

    cases.append(Case("rollout", "GenerateBatch", "empty-request", lambda ctx: rollout_pb2.GenerateBatchRequest()))
    gb("prompts-empty", lambda r, ctx: r.ClearField("prompts"))
    gb("prompts-257", n_prompts(257))
    gb("sequences-1280", lambda r, ctx: (n_prompts(256)(r, ctx), setattr(r, "num_samples", 5)))
    gb("num_samples-u32max", lambda r, ctx: setattr(r, "num_samples", U32_MAX))
    gb("num_samples-2^31", lambda r, ctx: setattr(r, "num_samples", I32_MIN_AS_U32))
    gb("prompts[1]-empty-tokens", lambda r, ctx: r.prompts.add(prompt_id="p2", task="reverse"))
    gb("token-negative", lambda r, ctx: r.prompts[0].prompt_token_ids.append(-7))
    gb("token-equals-vocab", lambda r, ctx: r.prompts[0].prompt_token_ids.append(ctx.vocab))
    gb("temperature-nan", lambda r, ctx: setattr(r.sampling, "temperature", NAN))
    gb("top_p-nan", lambda r, ctx: setattr(r.sampling, "top_p", NAN))
    gb("top_k-2^31", lambda r, ctx: setattr(r.sampling, "top_k", I32_MIN_AS_U32))
    gb("max_new_tokens-u32max", lambda r, ctx: setattr(r.sampling, "max_new_tokens", U32_MAX))
    gb("request_id-empty", lambda r, ctx: setattr(r, "request_id", ""))
    gb("min_policy_version-u64max", lambda r, ctx: setattr(r, "min_policy_version", U64_MAX))

    def over_budget(r, ctx):
        # 256 prompts x 4 samples x max_seq_len tokens: over 131072 tokens when max_seq_len > 128
        n_prompts(256)(r, ctx)
        r.num_samples = 4
        r.sampling.max_new_tokens = max(1, ctx.max_seq_len - 4)
        if 1024 * ctx.max_seq_len <= 131072:
            r.num_samples = 64  # then the sequence limit refuses it instead
    gb("reply-token-budget", over_budget)

    # UpdateWeights: PrepareWeightsRequest with one FILE chunk holding the whole image
    def upd_base(ctx):
        r = rollout_pb2.PrepareWeightsRequest(transfer_timeout_ms=10000)
        m = r.manifest
        m.version.version = ctx.rollout_version + 1
        m.version.run_id = ctx.run_id
        if ctx.rollout_layout is not None:
            m.layout.CopyFrom(ctx.rollout_layout)
        else:
            m.layout.CopyFrom(small_layout())
        m.total_bytes = 4096
        c = r.chunks.add(dst_rank=0)
        c.source.CopyFrom(file_descriptor("/dev/zero"))
        return r

    def upd(name, mutate):
        cases.append(Case("rollout", "UpdateWeights", name, mutated(upd_base, mutate)))

    def src(path, length=4096, offset=0):
        return lambda r, ctx: r.chunks[0].source.CopyFrom(file_descriptor(path, length, offset))

    cases.append(Case("rollout", "UpdateWeights", "empty-request", lambda ctx: rollout_pb2.PrepareWeightsRequest()))
    upd("file-dev-zero", lambda r, ctx: None)
    upd("file-etc-passwd", src("/etc/passwd"))
    upd("file-traversal", src("../../../../../../etc/passwd"))
    upd("file-directory", src("/tmp"))
    upd("file-root-directory", src("/"))
    upd("file-fifo", lambda r, ctx: src(ctx.fifo)(r, ctx))
    upd("file-proc-self-mem", src("/proc/self/mem"))
    upd("file-length-2GiB", src("/dev/zero", length=2 << 30))
    upd("file-offset-overflow", src("/etc/passwd", length=16, offset=U64_MAX - 8))
    upd("version-u64max", lambda r, ctx: setattr(r.manifest.version, "version", U64_MAX))
    upd("version-0", lambda r, ctx: setattr(r.manifest.version, "version", 0))
    upd("wire_dtype-bf16-unsupported", lambda r, ctx: setattr(r.manifest, "wire_dtype", common_pb2.DTYPE_BFLOAT16))
    upd("wire_dtype-unknown-enum-99", lambda r, ctx: setattr(r.manifest, "wire_dtype", 99))
    upd("chunks-2-unsupported", lambda r, ctx: r.chunks.add().CopyFrom(r.chunks[0]))
    upd("chunk-already_pushed-unsupported", lambda r, ctx: setattr(r.chunks[0], "already_pushed", True))
    upd("chunk-dst_rank-u32max", lambda r, ctx: setattr(r.chunks[0], "dst_rank", U32_MAX))
    upd("forged-ucx-descriptor", lambda r, ctx: r.chunks[0].source.CopyFrom(forged_ucx_descriptor()))
    upd("backend-unknown-enum-99", lambda r, ctx: setattr(r.chunks[0].source.segment, "backend", 99))
    upd("digest-algorithm-unknown-99", lambda r, ctx: setattr(r.chunks[0].source.digest, "algorithm", 99))
    upd("transfer_timeout_ms-negative", lambda r, ctx: setattr(r, "transfer_timeout_ms", -1))
    upd("layout-shape-overflow", lambda r, ctx: r.manifest.layout.CopyFrom(small_layout(shape=(2**62, 16))))
    upd("layout-shape-negative", lambda r, ctx: r.manifest.layout.CopyFrom(small_layout(shape=(-1, 4))))
    upd("layout-world_size-u32max", lambda r, ctx: setattr(r.manifest.layout, "world_size", U32_MAX))

    def reshard(mutate):
        def m(r, ctx):
            r.ClearField("chunks")
            rs = r.reshard
            rs.source_layout.CopyFrom(r.manifest.layout)
            rs.rank = 0
            rs.source_addresses.append(os.urandom(64))
            rs.digest_shares.append(1)
            mutate(rs, ctx)
        return m

    upd("reshard-source-world_size-1e8", reshard(lambda rs, ctx: setattr(rs.source_layout, "world_size", 10**8)))
    upd("reshard-dest-world_size-1e8", reshard(lambda rs, ctx: rs.destination_layout.CopyFrom(
        small_layout(world_size=10**8))))
    upd("reshard-rank-2^31", reshard(lambda rs, ctx: setattr(rs, "rank", I32_MIN_AS_U32)))
    upd("reshard-tag_epoch-99", reshard(lambda rs, ctx: setattr(rs, "tag_epoch", 99)))
    upd("reshard-chunk_bytes-2^63", reshard(lambda rs, ctx: setattr(rs, "chunk_bytes", 2**63)))
    upd("reshard-round_timeout-negative", reshard(lambda rs, ctx: setattr(rs, "round_timeout_ms", -1)))
    upd("reshard-5000-tensors", reshard(lambda rs, ctx: rs.source_layout.CopyFrom(small_layout(n_tensors=5000))))

    cases.append(Case("rollout", "CommitWeights", "version-u64max",
                      lambda ctx: rollout_pb2.CommitWeightsRequest(version=U64_MAX)))

    def resume(fleet, ctx, response):
        try:
            fleet.call("rollout", "Resume", rollout_pb2.ResumeRequest())
        except Exception:  # noqa: BLE001
            pass
    cases.append(Case("rollout", "Drain", "grace_ms-negative", lambda ctx: rollout_pb2.DrainRequest(grace_ms=-1),
                      cleanup=resume))
    cases.append(Case("rollout", "GetInfo", "unknown-field", lambda ctx: unknown_field_bytes(16), expect="ok"))
    cases.append(Case("rollout", "GetInfo", "request-5MiB", lambda ctx: unknown_field_bytes(5 << 20),
                      expect="ok"))  # (under the 16 MiB message limit)
    return cases


# ---- reward ----


def reward_cases():
    cases = []

    def base(ctx):
        r = reward_pb2.ScoreRequest()
        r.items.add(item_id=ctx.uid(), task="reverse", prompt_text="abc", response_text="cba", reference_answer="cba")
        return r

    def score(name, mutate, expect="refused"):
        cases.append(Case("reward", "Score", name, mutated(base, mutate), expect))

    def item(field, value):
        return lambda r, ctx: setattr(r.items[0], field, value)

    def more_items(n):
        def m(r, ctx):
            for _ in range(n - 1):
                r.items.add().CopyFrom(r.items[0])
        return m

    cases.append(Case("reward", "Score", "empty-request", lambda ctx: reward_pb2.ScoreRequest()))
    score("items-1025", more_items(1025))
    score("task-empty", item("task", ""))
    score("task-unknown", item("task", "no_such_task"))
    score("task-shell-syntax", item("task", "reverse; touch /tmp/rlfleet_pwned"))
    score("reward_function-unknown", item("reward_function", "no_such_function"))
    score("reward_function-traversal", item("reward_function", "../../../bin/sh"))
    score("item_id-empty", item("item_id", ""), expect="ok")  # (an echo; empty is allowed)
    score("item_id-257-bytes", item("item_id", "i" * 257))
    score("no-text-no-tokens", lambda r, ctx: (r.items[0].ClearField("prompt_text"),
                                               r.items[0].ClearField("response_text")))
    score("reference-missing", lambda r, ctx: r.items[0].ClearField("reference_answer"))
    score("response_text-64KiB+1", item("response_text", "a" * 65537))
    score("reference_answer-64KiB+1", item("reference_answer", "a" * 65537))
    score("prompt_text-64KiB+1", item("prompt_text", "a" * 65537))
    score("metadata-33", lambda r, ctx: r.items[0].metadata.update({"k%d" % i: "v" for i in range(33)}))
    score("response_tokens-negative", lambda r, ctx: (r.items[0].ClearField("response_text"),
                                                      r.items[0].response_token_ids.extend([-1, 5])))
    score("response_tokens-i32max", lambda r, ctx: (r.items[0].ClearField("response_text"),
                                                    r.items[0].response_token_ids.extend([2**31 - 1])))
    score("request-over-4MiB", lambda r, ctx: (item("response_text", "a" * 60000)(r, ctx), more_items(80)(r, ctx)),
          expect="ok")  # (4.8 MB: under the 16 MiB message limit, texts under 64 KiB each)
    cases.append(Case("reward", "ListRewardFunctions", "page_size-1001",
                      lambda ctx: reward_pb2.ListRewardFunctionsRequest(page=common_pb2.PageRequest(page_size=1001))))
    cases.append(Case("reward", "ListRewardFunctions", "page_token-garbage",
                      lambda ctx: reward_pb2.ListRewardFunctionsRequest(page=common_pb2.PageRequest(page_token="zz\x00"))))
    return cases


# ---- buffer ----


def put_rejected(response):
    """PutExperiences answers OK with per-experience rejections: all rejected = refused."""
    if response.accepted == 0 and response.rejected > 0:
        r = response.rejections[0] if response.rejections else None
        why = "%s: %s" % (buffer_pb2.RejectReason.Name(r.reason), r.message) if r else "rejected"
        return ("refused", "rejected " + why)
    return None


def buffer_cases():
    cases = []

    def put_base(ctx):
        r = buffer_pb2.PutExperiencesRequest(producer_id="bad-input-battery")
        r.experiences.add().CopyFrom(experience(ctx))
        return r

    def put(name, mutate, expect="refused"):
        cases.append(Case("buffer", "PutExperiences", name, mutated(put_base, mutate), expect, on_ok=put_rejected))

    def exp(fn):
        return lambda r, ctx: fn(r.experiences[0], ctx)

    cases.append(Case("buffer", "PutExperiences", "empty-request", lambda ctx: buffer_pb2.PutExperiencesRequest(),
                      on_ok=put_rejected))
    put("experiences-1025", lambda r, ctx: [r.experiences.add().CopyFrom(experience(ctx, i)) for i in range(1024)])
    put("experience_id-missing", exp(lambda e, ctx: e.ClearField("experience_id")))
    put("experience_id-257-bytes", exp(lambda e, ctx: setattr(e.experience_id, "value", "x" * 257)))
    put("reward-unset", exp(lambda e, ctx: e.ClearField("reward")))
    put("reward-nan", exp(lambda e, ctx: setattr(e, "reward", NAN)))
    put("reward-inf", exp(lambda e, ctx: setattr(e, "reward", -INF)))
    put("reward_components-nan", exp(lambda e, ctx: e.reward_components.update({"exact": NAN})))
    put("response_logprobs-nan", exp(lambda e, ctx: e.response_logprobs.__setitem__(0, NAN)))
    put("response_logprobs-count-mismatch", exp(lambda e, ctx: e.response_logprobs.append(-1.0)))
    put("token_policy_versions-count-mismatch", exp(lambda e, ctx: e.token_policy_versions.append(1)))
    put("token_policy_versions-u64max", exp(lambda e, ctx: e.token_policy_versions.__setitem__(0, U64_MAX)))
    put("token_policy_versions-2^48+1", exp(lambda e, ctx: e.token_policy_versions.__setitem__(0, 2**48 + 1)))
    put("response-empty", exp(lambda e, ctx: (e.ClearField("response_token_ids"), e.ClearField("response_logprobs"),
                                              e.ClearField("token_policy_versions"))))
    put("extra_tensor-data-65537-bytes", exp(lambda e, ctx: e.extra_tensors.add(
        spec=common_pb2.TensorSpec(name="v", dtype=common_pb2.DTYPE_UINT8, shape=[65537]), data=b"\0" * 65537)))
    put("extra_tensor-shape-overflow", exp(lambda e, ctx: e.extra_tensors.add(
        spec=common_pb2.TensorSpec(name="v", dtype=common_pb2.DTYPE_FLOAT32, shape=[2**62, 2**62]), data=b"\0" * 4)))
    put("extra_tensor-dtype-unknown-99", exp(lambda e, ctx: e.extra_tensors.add(
        spec=common_pb2.TensorSpec(name="v", dtype=99, shape=[1]), data=b"\0" * 4)))

    def remote(desc_fn):
        def fn(e, ctx):
            for f in ("response_token_ids", "response_logprobs", "token_policy_versions", "prompt_token_ids"):
                e.ClearField(f)
            e.remote_payload.CopyFrom(desc_fn(ctx))
        return exp(fn)
    put("remote_payload-file-dev-zero", remote(lambda ctx: file_descriptor("/dev/zero", 1 << 20)))
    put("remote_payload-file-fifo", remote(lambda ctx: file_descriptor(ctx.fifo, 4096)))
    put("remote_payload-file-etc-passwd", remote(lambda ctx: file_descriptor("/etc/passwd", 64)))
    put("remote_payload-forged-ucx", remote(lambda ctx: forged_ucx_descriptor(1 << 20)))
    put("remote_payload-length-u64max", remote(lambda ctx: file_descriptor("/dev/zero", U64_MAX)))

    def run_mismatch(r, ctx):
        r.run_id = "battery-other-run-../../x"
    if True:
        put("run_id-mismatch", run_mismatch)

    def nack_lease(fleet, ctx, response):
        if getattr(response, "lease_id", ""):
            try:
                fleet.call("buffer", "NackBatch", buffer_pb2.NackBatchRequest(lease_id=response.lease_id,
                                                                             reason="bad-input-battery"))
            except Exception:  # noqa: BLE001
                pass

    def sample_base(ctx):
        return buffer_pb2.SampleBatchRequest(num_groups=1, wait_ms=0, consumer_id="bad-input-battery")

    def sample(name, mutate):
        cases.append(Case("buffer", "SampleBatch", name, mutated(sample_base, mutate), cleanup=nack_lease))

    def sset(field, value):
        return lambda r, ctx: setattr(r, field, value)

    sample("num_groups-0", sset("num_groups", 0))
    sample("num_groups-1025", sset("num_groups", 1025))
    sample("num_groups-u32max", sset("num_groups", U32_MAX))
    sample("min_groups-over-num_groups", sset("min_groups", 2))
    sample("wait_ms-negative", sset("wait_ms", -1))
    sample("wait_ms-600001", sset("wait_ms", 600001))
    sample("wait_ms-i64max", sset("wait_ms", I64_MAX))
    sample("lease_ttl_ms-1ms", sset("lease_ttl_ms", 1))
    sample("lease_ttl_ms-999", sset("lease_ttl_ms", 999))
    sample("lease_ttl_ms-negative", sset("lease_ttl_ms", -1))
    sample("lease_ttl_ms-600001", sset("lease_ttl_ms", 600001))
    sample("current_policy_version-u64max", sset("current_policy_version", U64_MAX))
    sample("current_policy_version-2^48+1", sset("current_policy_version", 2**48 + 1))
    sample("consumer_id-257-bytes", sset("consumer_id", "c" * 257))

    for method, typ in (("AckBatch", buffer_pb2.AckBatchRequest), ("NackBatch", buffer_pb2.NackBatchRequest)):
        cases.append(Case("buffer", method, "lease_id-empty", lambda ctx, t=typ: t()))
        cases.append(Case("buffer", method, "lease_id-unknown", lambda ctx, t=typ: t(lease_id="battery-no-such-lease")))
        cases.append(Case("buffer", method, "lease_id-traversal", lambda ctx, t=typ: t(lease_id="../../../etc/passwd")))
        cases.append(Case("buffer", method, "lease_id-nul-byte", lambda ctx, t=typ: t(lease_id="lease\x00x")))
        cases.append(Case("buffer", method, "lease_id-1MiB", lambda ctx, t=typ: t(lease_id="l" * (1 << 20))))
    cases.append(Case("buffer", "NackBatch", "reason-1MiB-unknown-lease",
                      lambda ctx: buffer_pb2.NackBatchRequest(lease_id="battery-no-such-lease", reason="r" * (1 << 20))))

    def conf_base(ctx):
        r = buffer_pb2.ConfigureRequest()
        if ctx.buffer_config is not None:
            r.CopyFrom(ctx.buffer_config)
        else:
            r.group_size = 4
        return r

    def conf(name, mutate):
        cases.append(Case("buffer", "Configure", name, mutated(conf_base, mutate)))

    cases.append(Case("buffer", "Configure", "empty-request", lambda ctx: buffer_pb2.ConfigureRequest()))
    conf("group_size-0", sset("group_size", 0))
    conf("group_size-1025", sset("group_size", 1025))
    conf("group_size-u32max", sset("group_size", U32_MAX))
    conf("capacity_bytes-1", sset("capacity_bytes", 1))
    conf("capacity_bytes-u64max", sset("capacity_bytes", U64_MAX))
    conf("zero_variance_epsilon-nan", sset("zero_variance_epsilon", NAN))
    conf("zero_variance_epsilon-inf", sset("zero_variance_epsilon", INF))
    conf("zero_variance_epsilon-negative", sset("zero_variance_epsilon", -1.0))
    conf("default_lease_ttl_ms-1ms", sset("default_lease_ttl_ms", 1))
    conf("default_lease_ttl_ms-negative", sset("default_lease_ttl_ms", -5))
    conf("default_lease_ttl_ms-i64max", sset("default_lease_ttl_ms", I64_MAX))
    conf("run_id-257-bytes", sset("run_id", "r" * 257))
    return cases


# ---- trainer ----


def trainer_cases():
    cases = []

    def ts_base(ctx):
        r = trainer_pb2.TrainStepRequest(expected_step=ctx.trainer_step + 1)
        group = ctx.uid("battery-group")
        for i in range(4):
            r.inline_batch.experiences.add().CopyFrom(experience(ctx, i, group=group))
        r.params.algorithm = common_pb2.ALGORITHM_GRPO
        return r

    def refresh_step(fleet, ctx, response):
        ctx.trainer_step = response.step

    def ts(name, mutate):
        cases.append(Case("trainer", "TrainStep", name, mutated(ts_base, mutate), cleanup=refresh_step))

    def par(field, value):
        return lambda r, ctx: setattr(r.params, field, value)

    def opt(field, value):
        return lambda r, ctx: setattr(r.params.optimizer, field, value)

    def kl(field, value):
        return lambda r, ctx: setattr(r.params.kl, field, value)

    def exp0(fn):
        return lambda r, ctx: fn(r.inline_batch.experiences[0], ctx)

    cases.append(Case("trainer", "TrainStep", "empty-request-no-source", lambda ctx: trainer_pb2.TrainStepRequest()))
    ts("inline_batch-empty", lambda r, ctx: r.inline_batch.ClearField("experiences"))
    ts("inline_batch-1025", lambda r, ctx: [r.inline_batch.experiences.add().CopyFrom(experience(ctx, i))
                                            for i in range(1021)])
    ts("buffer-num_groups-0", lambda r, ctx: r.buffer.SetInParent())
    ts("buffer-num_groups-u32max", lambda r, ctx: setattr(r.buffer, "num_groups", U32_MAX))
    ts("buffer-num_groups-1025", lambda r, ctx: setattr(r.buffer, "num_groups", 1025))
    ts("buffer-wait_ms-negative", lambda r, ctx: (setattr(r.buffer, "num_groups", 1), setattr(r.buffer, "wait_ms", -1)))
    ts("buffer-wait_ms-i64max", lambda r, ctx: (setattr(r.buffer, "num_groups", 1),
                                                setattr(r.buffer, "wait_ms", I64_MAX)))
    ts("buffer-min_groups-over-num_groups", lambda r, ctx: (setattr(r.buffer, "num_groups", 1),
                                                            setattr(r.buffer, "min_groups", 5)))
    ts("reward-nan", exp0(lambda e, ctx: setattr(e, "reward", NAN)))
    ts("reward-inf", exp0(lambda e, ctx: setattr(e, "reward", INF)))
    ts("reward-unset", exp0(lambda e, ctx: e.ClearField("reward")))
    ts("logprobs-nan", exp0(lambda e, ctx: e.response_logprobs.__setitem__(0, NAN)))
    ts("logprobs-count-mismatch", exp0(lambda e, ctx: e.response_logprobs.append(-1.0)))
    ts("token-negative", exp0(lambda e, ctx: e.prompt_token_ids.append(-1)))
    ts("token-equals-vocab", exp0(lambda e, ctx: e.response_token_ids.__setitem__(0, ctx.vocab)))
    ts("token-i32max", exp0(lambda e, ctx: e.prompt_token_ids.append(2**31 - 1)))
    ts("experience-over-max_seq_len", exp0(lambda e, ctx: e.prompt_token_ids.extend([1] * ctx.max_seq_len)))
    ts("response-empty", exp0(lambda e, ctx: (e.ClearField("response_token_ids"), e.ClearField("response_logprobs"),
                                              e.ClearField("token_policy_versions"))))
    ts("extra_tensors-unsupported", exp0(lambda e, ctx: e.extra_tensors.add(
        spec=common_pb2.TensorSpec(name="values", dtype=common_pb2.DTYPE_FLOAT32, shape=[1]), data=b"\0" * 4)))
    ts("remote_payload-unsupported", exp0(lambda e, ctx: e.remote_payload.CopyFrom(file_descriptor("/dev/zero"))))
    ts("algorithm-unknown-enum-99", par("algorithm", 99))
    ts("advantage_estimator-unknown-99", par("advantage_estimator", 99))
    ts("clip_ratio-nan", par("clip_ratio", NAN))
    ts("clip_ratio-1.5", par("clip_ratio", 1.5))
    ts("clip_ratio_high-nan", par("clip_ratio_high", NAN))
    ts("clip_ratio_high-11", par("clip_ratio_high", 11.0))
    ts("ppo_epochs-17", par("ppo_epochs", 17))
    ts("ppo_epochs-u32max", par("ppo_epochs", U32_MAX))
    ts("mini_batches-u32max", par("mini_batches", U32_MAX))
    ts("entropy_coef-nan", par("entropy_coef", NAN))
    ts("entropy_coef-negative", par("entropy_coef", -1.0))
    ts("entropy_coef-101", par("entropy_coef", 101.0))
    ts("gamma-without-gae", par("gamma", 0.9))
    ts("gae_lambda-without-gae", par("gae_lambda", 0.9))
    ts("value_loss_coef-without-gae", par("value_loss_coef", 1.0))
    ts("gamma-nan", par("gamma", NAN))
    ts("kl-coef-unsupported", kl("coef", 0.1))
    ts("kl-coef-nan", kl("coef", NAN))
    ts("kl-target-nan", kl("target", NAN))
    ts("kl-penalty-in_loss-unsupported", kl("penalty", trainer_pb2.KL_PENALTY_IN_LOSS))
    ts("kl-estimator-k3-unsupported", kl("estimator", trainer_pb2.KL_ESTIMATOR_K3))
    ts("kl-penalty-unknown-99", kl("penalty", 99))
    ts("optimizer-learning_rate-nan", opt("learning_rate", NAN))
    ts("optimizer-learning_rate-2", opt("learning_rate", 2.0))
    ts("optimizer-learning_rate-negative", opt("learning_rate", -1e-3))
    ts("optimizer-beta1-1.0", opt("beta1", 1.0))
    ts("optimizer-beta2-nan", opt("beta2", NAN))
    ts("optimizer-eps-negative", opt("eps", -1.0))
    ts("optimizer-weight_decay-11", opt("weight_decay", 11.0))
    ts("optimizer-weight_decay-nan", opt("weight_decay", NAN))
    ts("optimizer-grad_clip_norm-inf", opt("grad_clip_norm", INF))
    ts("optimizer-grad_clip_norm-negative", opt("grad_clip_norm", -1.0))

    def save(name, path, overwrite=False, expect="refused"):
        cases.append(Case("trainer", "SaveCheckpoint", name,
                          lambda ctx: trainer_pb2.SaveCheckpointRequest(path=path, overwrite=overwrite), expect=expect))

    save("path-empty", "")
    save("path-4097-bytes", "c" * 4097)
    save("path-absolute-outside", "/tmp/rlfleet_battery_ckpt")
    save("path-etc-overwrite", "/etc", overwrite=True)
    save("path-root-overwrite", "/", overwrite=True)
    save("path-traversal-overwrite", "../../../../tmp", overwrite=True)
    save("path-dot-root-itself", ".", overwrite=True)
    save("path-dev-zero", "/dev/zero", overwrite=True)
    save("path-nul-byte", "ckpt\x00/../../etc")
    # (no shell anywhere: this is the path <root>/x, inside the root)
    save("path-shell-syntax", "$(touch /tmp/rlfleet_pwned)/../../../x", expect="ok")

    def load(name, path):
        cases.append(Case("trainer", "LoadCheckpoint", name, lambda ctx: trainer_pb2.LoadCheckpointRequest(path=path)))

    load("path-empty", "")
    load("path-4097-bytes", "c" * 4097)
    load("path-etc", "/etc")
    load("path-traversal", "../../../../etc")
    load("path-dev-zero", "/dev/zero")
    load("path-proc-self", "/proc/self")
    load("path-dot-root-itself", ".")
    load("path-unknown", "battery-no-such-checkpoint")
    cases.append(Case("trainer", "LoadCheckpoint", "path-fifo",
                      lambda ctx: trainer_pb2.LoadCheckpointRequest(path=ctx.fifo)))

    def pub(name, **kw):
        cases.append(Case("trainer", "PublishWeights", name, lambda ctx: trainer_pb2.PublishWeightsRequest(**kw)))

    pub("wire_dtype-int32", wire_dtype=common_pb2.DTYPE_INT32)
    pub("wire_dtype-bool", wire_dtype=common_pb2.DTYPE_BOOL)
    pub("wire_dtype-bf16-unsupported", wire_dtype=common_pb2.DTYPE_BFLOAT16)
    pub("wire_dtype-unknown-enum-99", wire_dtype=99)
    pub("timeout_ms-negative", timeout_ms=-1)
    pub("timeout_ms-3600001", timeout_ms=3600001)
    pub("timeout_ms-i64max", timeout_ms=I64_MAX)
    return cases


# ---- weights ----


def weights_cases():
    cases = []

    def pv_base(ctx):
        r = weights_pb2.PublishVersionRequest(publisher_id="bad-input-battery")
        m = r.manifest
        m.version.version = max(ctx.trainer_version, ctx.rollout_version) + 1
        m.version.run_id = ctx.run_id
        m.layout.CopyFrom(ctx.trainer_layout if ctx.trainer_layout is not None else small_layout())
        t0 = m.layout.tensors[0].spec.name
        d = file_descriptor("/etc/passwd", 64)
        m.shard_digests.add(rank=0, tensor_name=t0, length_bytes=64, digest=d.digest)
        s = r.sources.add(rank=0)
        s.shards.add(tensor_name=t0, location=d)
        return r

    def pv(name, mutate):
        cases.append(Case("weights", "PublishVersion", name, mutated(pv_base, mutate)))

    def loc(fn):
        return lambda r, ctx: r.sources[0].shards[0].location.CopyFrom(fn(ctx))

    cases.append(Case("weights", "PublishVersion", "empty-request", lambda ctx: weights_pb2.PublishVersionRequest()))
    pv("manifest-no-tensors", lambda r, ctx: r.manifest.layout.ClearField("tensors"))
    pv("file-etc-passwd", lambda r, ctx: None)
    pv("file-dev-zero", loc(lambda ctx: file_descriptor("/dev/zero", 1 << 20)))
    pv("file-traversal", loc(lambda ctx: file_descriptor("../../../../../../etc/passwd", 64)))
    pv("file-directory", loc(lambda ctx: file_descriptor("/tmp", 4096)))
    pv("file-fifo", loc(lambda ctx: file_descriptor(ctx.fifo, 4096)))
    pv("file-proc-self-environ", loc(lambda ctx: file_descriptor("/proc/self/environ", 64)))
    pv("file-length-2GiB", loc(lambda ctx: file_descriptor("/dev/zero", 2 << 30)))
    pv("file-length-u64max", loc(lambda ctx: file_descriptor("/dev/zero", U64_MAX)))
    pv("file-offset-overflow", loc(lambda ctx: file_descriptor("/etc/passwd", 16, U64_MAX - 8)))
    pv("forged-ucx-descriptor", loc(lambda ctx: forged_ucx_descriptor()))
    pv("backend-unknown-enum-99", lambda r, ctx: setattr(r.sources[0].shards[0].location.segment, "backend", 99))
    pv("source-rank-2^31", lambda r, ctx: setattr(r.sources[0], "rank", I32_MIN_AS_U32))
    pv("source-rank-u32max", lambda r, ctx: setattr(r.sources[0], "rank", U32_MAX))
    pv("sources-1025", lambda r, ctx: [r.sources.add(rank=i) for i in range(1, 1025)])
    pv("layout-world_size-1e8", lambda r, ctx: setattr(r.manifest.layout, "world_size", 10**8))
    pv("layout-world_size-u32max", lambda r, ctx: setattr(r.manifest.layout, "world_size", U32_MAX))
    pv("layout-world_size-0", lambda r, ctx: setattr(r.manifest.layout, "world_size", 0))
    pv("layout-5000-tensors", lambda r, ctx: r.manifest.layout.CopyFrom(small_layout(n_tensors=5000)))
    pv("shape-2GiB", lambda r, ctx: r.manifest.layout.CopyFrom(small_layout(shape=(2**31, 2**31))))
    pv("shape-product-overflow", lambda r, ctx: r.manifest.layout.CopyFrom(small_layout(shape=(2**62, 16))))
    pv("shape-negative", lambda r, ctx: r.manifest.layout.CopyFrom(small_layout(shape=(-1, 4))))
    pv("dtype-unknown-enum-99", lambda r, ctx: setattr(r.manifest.layout.tensors[0].spec, "dtype", 99))
    pv("layout-kind-unknown-99", lambda r, ctx: setattr(r.manifest.layout.tensors[0], "kind", 99))
    pv("tp_column-axis-i32max", lambda r, ctx: (setattr(r.manifest.layout.tensors[0], "kind",
                                                        common_pb2.LAYOUT_KIND_TP_COLUMN),
                                                setattr(r.manifest.layout.tensors[0], "axis", 2**31 - 1)))
    pv("tp_row-axis-negative", lambda r, ctx: (setattr(r.manifest.layout.tensors[0], "kind",
                                                       common_pb2.LAYOUT_KIND_TP_ROW),
                                               setattr(r.manifest.layout.tensors[0], "axis", -1)))
    pv("shard_digests-70000", lambda r, ctx: [r.manifest.shard_digests.add(rank=0, tensor_name="x")
                                              for _ in range(70000)])
    pv("digest-algorithm-unknown-99", lambda r, ctx: setattr(r.sources[0].shards[0].location.digest, "algorithm", 99))
    pv("version-u64max", lambda r, ctx: setattr(r.manifest.version, "version", U64_MAX))
    pv("version-0", lambda r, ctx: setattr(r.manifest.version, "version", 0))
    pv("run_id-traversal", lambda r, ctx: setattr(r.manifest.version, "run_id", "../../../etc"))
    pv("wire_dtype-bf16-unsupported", lambda r, ctx: setattr(r.manifest, "wire_dtype", common_pb2.DTYPE_BFLOAT16))
    pv("sources-endpoint-unsupported", lambda r, ctx: setattr(r.sources[0].endpoint, "host", "127.0.0.1"))
    pv("total_bytes-mismatch", lambda r, ctx: setattr(r.manifest, "total_bytes", 12345))
    pv("trainer_pause_us-negative", lambda r, ctx: setattr(r, "trainer_pause_us", -1))

    def unregister(fleet, ctx, response, replica_id=None):
        pass  # destinations are unregistered in restore_state (their ids are known there)

    def rd_base(ctx):
        r = weights_pb2.RegisterDestinationRequest(replica_id=ctx.uid("battery-dest"), grpc_address="127.0.0.1:1")
        r.layout.CopyFrom(ctx.rollout_layout if ctx.rollout_layout is not None else small_layout())
        ctx.destinations.append(r.replica_id)
        return r

    def rd(name, mutate):
        cases.append(Case("weights", "RegisterDestination", name, mutated(rd_base, mutate)))

    def rset(field, value):
        return lambda r, ctx: setattr(r, field, value)

    cases.append(Case("weights", "RegisterDestination", "empty-request",
                      lambda ctx: weights_pb2.RegisterDestinationRequest()))
    rd("replica_id-empty", rset("replica_id", ""))
    rd("replica_id-129-bytes", rset("replica_id", "d" * 129))
    rd("layout-world_size-0", lambda r, ctx: setattr(r.layout, "world_size", 0))
    rd("layout-world_size-65", lambda r, ctx: setattr(r.layout, "world_size", 65))
    rd("layout-world_size-1e8", lambda r, ctx: setattr(r.layout, "world_size", 10**8))
    rd("layout-world_size-u32max", lambda r, ctx: setattr(r.layout, "world_size", U32_MAX))
    rd("layout-4097-tensors", lambda r, ctx: r.layout.CopyFrom(small_layout(n_tensors=4097)))
    rd("layout-tensor-named-twice", lambda r, ctx: r.layout.tensors.add().CopyFrom(r.layout.tensors[0]))
    rd("layout-kind-unknown-99", lambda r, ctx: setattr(r.layout.tensors[0], "kind", 99))
    rd("layout-shape-overflow", lambda r, ctx: r.layout.CopyFrom(small_layout(shape=(2**62, 2**62))))
    rd("ranks-unsupported", lambda r, ctx: r.ranks.add(rank=0))
    rd("ranks-forged-staging", lambda r, ctx: r.ranks.add(rank=0).staging.CopyFrom(forged_ucx_descriptor().segment))
    rd("wire_dtype-bf16-unsupported", rset("wire_dtype", common_pb2.DTYPE_BFLOAT16))
    rd("wire_dtype-unknown-enum-99", rset("wire_dtype", 99))

    def sync(name, **kw):
        def build(ctx):
            args = dict(replica_id="battery-no-such-dest-" + ctx.tag, commit=True, timeout_ms=5000)
            args.update(kw)
            return weights_pb2.SyncVersionRequest(**args)
        cases.append(Case("weights", "SyncVersion", name, build))

    sync("timeout_ms-negative", timeout_ms=-1)
    sync("timeout_ms-86400001", timeout_ms=86400001)
    sync("commit-false-unsupported", commit=False)
    sync("replica_id-unknown")
    sync("replica_id-traversal", replica_id="../../../etc")
    sync("version-u64max", version=U64_MAX)
    sync("replica_ids-with-replica_id", replica_ids=["a"])
    sync("replica_ids-empty-entry", replica_id="", replica_ids=[""])
    sync("replica_ids-1025", replica_id="", replica_ids=["battery-no-such-dest-%d" % i for i in range(1025)])

    def plan(name, **kw):
        def build(ctx):
            args = dict(replica_id=ctx.rollout_replica_id or "battery-no-such-dest")
            args.update(kw)
            return weights_pb2.GetPlanRequest(**args)
        cases.append(Case("weights", "GetPlan", name, build))

    plan("max_ranges-100001", include_ranges=True, max_ranges=100001)
    plan("max_ranges-u32max", include_ranges=True, max_ranges=U32_MAX)
    plan("replica_id-unknown", replica_id="battery-no-such-dest")
    plan("replica_id-1MiB", replica_id="d" * (1 << 20))
    plan("version-u64max", version=U64_MAX)
    return cases


# --------------------------------------------------------------------------------------
# Running


def classify(fleet, case, response_or_error):
    grpc = fleet.grpc
    if isinstance(response_or_error, grpc.RpcError):
        code = response_or_error.code()
        details = response_or_error.details() or ""
        text = "%s: %s" % (code.name, short(details)) if details else code.name
        if code == grpc.StatusCode.UNAVAILABLE:
            return "crashed", text
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "hung", text
        if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
            return "internal", text
        if not details.strip():
            return "internal", text + " (no message: not a clear error)"
        return "refused", text
    if case.on_ok is not None:
        verdict = case.on_ok(response_or_error)
        if verdict is not None:
            return verdict
    return "accepted", "OK " + short(response_or_error if not isinstance(response_or_error, list)
                                     else "%d stream messages" % len(response_or_error), 200)


def run_case(fleet, ctx, case):
    if case.setup is not None:
        try:
            case.setup(fleet, ctx)
        except Exception as e:  # noqa: BLE001 - a bug or a refusal in the setup: report it, go on
            return "script-error", "setup: %s: %s" % (type(e).__name__, short(e))
    try:
        request = case.build(ctx)
        if not isinstance(request, bytes):
            request.SerializeToString()
    except Exception as e:  # noqa: BLE001 - a bug in this script: report it, go on
        return "script-error", "%s: %s" % (type(e).__name__, short(e))
    try:
        response = fleet.call(case.service, case.method, request, as_fleet=case.as_fleet,
                              as_inference=case.as_inference)
    except fleet.grpc.RpcError as e:
        response = e
    except Exception as e:  # noqa: BLE001
        return "script-error", "%s: %s" % (type(e).__name__, short(e))
    result, detail = classify(fleet, case, response)
    if result == "accepted" and case.cleanup is not None:
        try:
            case.cleanup(fleet, ctx, response)
        except Exception:  # noqa: BLE001
            pass
    return result, detail


def check_health(fleet, dead):
    """Names (and why) of services that stopped answering health checks, not already known dead."""
    newly = []
    for name, address in sorted(fleet.all_health_targets().items()):
        if name in dead:
            continue
        why = fleet.health(address)
        if why is not None:
            # one retry: a server restarting its listener for a moment is not a crash
            time.sleep(0.5)
            why = fleet.health(address)
        if why is not None:
            newly.append((name, address, why))
    return newly


def restore_state(fleet, ctx, results, log):
    """Undoes what accepted cases changed, where that can be done through the API."""
    accepted = {(c.service, c.method) for c in results if c.result == "accepted"}
    if ("buffer", "Configure") in accepted and ctx.buffer_config is not None:
        try:
            fleet.call("buffer", "Configure", ctx.buffer_config)
            log("restore: buffer configuration put back")
        except Exception as e:  # noqa: BLE001
            log("restore: buffer Configure failed: %s" % short(e))
    if ("controller", "Scale") in accepted:
        for role, count in ctx.desired.items():
            if role in (common_pb2.REPLICA_ROLE_ROLLOUT, common_pb2.REPLICA_ROLE_REWARD,
                        common_pb2.REPLICA_ROLE_TRAINER, common_pb2.REPLICA_ROLE_WEIGHTS):
                try:
                    fleet.call("controller", "Scale", controller_pb2.ScaleRequest(role=role, target_count=count))
                except Exception:  # noqa: BLE001
                    pass
        log("restore: Scale desired counts put back to %s" % {common_pb2.ReplicaRole.Name(r): n
                                                              for r, n in ctx.desired.items()})
    if ("weights", "RegisterDestination") in accepted:
        for replica_id in ctx.destinations:
            try:
                fleet.call("weights", "UnregisterDestination",
                           weights_pb2.UnregisterDestinationRequest(replica_id=replica_id))
            except Exception:  # noqa: BLE001
                pass
        log("restore: battery destinations unregistered")


def discover(grpc_module, args, log):
    addresses = {"controller": args.controller}
    extra = {}
    fleet = Fleet(grpc_module, addresses, args.token, args.admin_token, args.inference_token)
    try:
        replicas, token = [], ""
        while True:
            resp = fleet.call("registry", "ListReplicas", controller_pb2.ListReplicasRequest(
                page=common_pb2.PageRequest(page_size=1000, page_token=token)))
            replicas.extend(resp.replicas)
            token = resp.next_page_token
            if not token:
                break
        counts = {}
        for r in replicas:
            name = ROLE_NAME.get(r.role)
            if name is None or not r.grpc_address:
                continue
            counts[name] = counts.get(name, 0) + 1
            if name not in addresses:
                addresses[name] = r.grpc_address
                if name == "rollout":
                    log("discover: rollout replica under test %s (%s)" % (r.replica_id, r.grpc_address))
            else:
                extra["%s#%d" % (name, counts[name])] = r.grpc_address
        log("discover: %d replicas: %s" % (len(replicas), ", ".join(
            "%s=%s" % (n, addresses[n]) for n in SERVICES if n in addresses)))
    except grpc_module.RpcError as e:
        log("discover: ListReplicas failed (%s: %s); use --rollout= etc." % (e.code().name, short(e.details())))
    for name in SERVICES[1:]:
        override = getattr(args, name)
        if override:
            addresses[name] = override
    fleet.extra_health = extra
    return fleet


def write_table(path, cases, summary, started):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("# Bad-input battery\n\n")
        f.write("Run %s by `tests/battery/bad_input_battery.py`.\n\n" % time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(started)))
        f.write("%s\n\n" % summary)
        f.write("| service | method | case | expect | result | detail |\n| --- | --- | --- | --- | --- | --- |\n")
        for c in cases:
            detail = (c.detail or "").replace("|", "\\|").replace("\n", " ")
            f.write("| %s | %s | %s | %s | %s | %s |\n" % (c.service, c.method, c.name, c.expect, c.result, detail))


def all_cases():
    return controller_cases() + rollout_cases() + reward_cases() + buffer_cases() + trainer_cases() + weights_cases()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--controller", help="host:port of rlfleet-controller")
    parser.add_argument("--out", default="bench/results/bad_input_battery.md", help="markdown table to write")
    for name in SERVICES[1:]:
        parser.add_argument("--" + name, default=None, help="host:port of %s (default: from the registry)" % name)
    parser.add_argument("--token", default=None, help="fleet bearer token, if the fleet requires one")
    parser.add_argument("--admin_token", default=None, help="controller-role token (sent instead of --token)")
    parser.add_argument("--inference_token", default=None,
                        help="the gateway's inference token, if the fleet has one: its cases check it is refused "
                             "everywhere but Generate and ListReplicas")
    parser.add_argument("--only", default=None, help="run only cases whose label contains this text")
    parser.add_argument("--dry_run", action="store_true", help="build every request, send nothing")
    args = parser.parse_args()

    def log(text):
        print(text, flush=True)

    cases = all_cases()
    if args.only:
        cases = [c for c in cases if args.only in c.label]
    ctx = Ctx()
    ctx.destinations = []
    make_fifo(ctx)

    if args.dry_run:
        errors = 0
        for c in cases:
            try:
                request = c.build(ctx)
                size = len(request) if isinstance(request, bytes) else len(request.SerializeToString())
                print("%s -> built (%d bytes)" % (c.label, size))
            except Exception as e:  # noqa: BLE001
                errors += 1
                print("%s -> script-error (%s: %s)" % (c.label, type(e).__name__, short(e)))
        per = {}
        for c in cases:
            per[c.service] = per.get(c.service, 0) + 1
        print("dry run: %d cases (%s), %d script errors" % (
            len(cases), ", ".join("%s %d" % kv for kv in per.items()), errors))
        return 1 if errors else 0

    if not args.controller:
        parser.error("--controller is required (or --dry_run)")
    import grpc  # Debian's python3-grpcio; imported here so --dry_run needs only protobuf
    started = time.time()
    fleet = discover(grpc, args, log)
    missing = [n for n in SERVICES if not fleet.addresses.get(n)]
    if missing:
        log("warning: no address for %s: their cases are skipped" % ", ".join(missing))
    gather_context(fleet, ctx, log)
    dead = {}
    for name, address, why in check_health(fleet, dead):
        log("warning: %s (%s) does not answer health before the battery: %s" % (name, address, why))
        dead[name] = why

    ran = []
    for case in cases:
        target = ADDRESS_OF.get(case.service, case.service)
        if not fleet.addresses.get(target):
            continue
        if case.as_fleet and not fleet.roles:
            continue  # (one trust domain: the fleet token may do everything)
        if case.as_inference and fleet.inference_metadata is None:
            continue
        if target in dead:
            case.result, case.detail = "crashed", "not run: %s is down (%s)" % (target, dead[target])
            ran.append(case)
            print("%s -> %s" % (case.label, case.detail), flush=True)
            continue
        t0 = time.time()
        case.result, case.detail = run_case(fleet, ctx, case)
        newly = check_health(fleet, dead)
        if newly:
            for name, address, why in newly:
                dead[name] = why
            case.result = "crashed"
            case.detail = "%s; service died: %s" % (case.detail, ", ".join(
                "%s (%s: %s)" % (n, a, w) for n, a, w in newly))
        note = ""
        if case.result == "accepted":
            note = " [expected]" if case.expect == "ok" else " [UNEXPECTED: bad input accepted]"
        print("%s -> %s (%s)%s [%.1fs]" % (case.label, case.result, case.detail, note, time.time() - t0), flush=True)
        ran.append(case)

    restore_state(fleet, ctx, ran, log)
    n = len(ran)
    count = lambda r: sum(1 for c in ran if c.result == r)  # noqa: E731
    expected_ok = sum(1 for c in ran if c.result == "accepted" and c.expect == "ok")
    unexpected = count("accepted") - expected_ok
    summary = "battery: %d tried, %d refused, %d accepted (%d expected), %d internal, %d hung, %d crashed" % (
        n, count("refused"), count("accepted"), expected_ok, count("internal"), count("hung"), count("crashed"))
    if count("script-error"):
        summary += ", %d script-error" % count("script-error")
    per = {}
    for c in ran:
        per[c.service] = per.get(c.service, 0) + 1
    log("cases per service: " + ", ".join("%s %d" % kv for kv in per.items()))
    if dead:
        log("services that stopped answering: " + ", ".join("%s (%s)" % kv for kv in dead.items()))
    print(summary, flush=True)
    write_table(args.out, ran, summary, started)
    log("table: %s" % args.out)
    return 1 if (count("crashed") or count("hung") or unexpected) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
