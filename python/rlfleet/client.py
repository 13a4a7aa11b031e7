"""Typed clients of the rlfleet services.

Each client holds one gRPC channel to one service; every call has a deadline (the
client's `timeout`, or the call's) and raises RlfleetError when the service answers
with an error (its gRPC status code and message: INVALID_ARGUMENT names the field).
Messages are the generated protobuf classes of rlfleet.v1 (proto/rlfleet/v1).

    from rlfleet import Controller
    with Controller("127.0.0.1:7000", token=open("token").read().strip()) as c:
        run_id = c.start_run(task="reverse", steps=20)
        status = c.wait(run_id, timeout=600)
        trainer = c.connect_trainer()       # found through the controller's registry
        print(trainer.state().step)
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence

import grpc
from google.protobuf import json_format

from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc, trainer_pb2, trainer_pb2_grpc

__all__ = ["RlfleetError", "Controller", "Trainer", "Rollout", "Buffer", "Generation", "ROLES"]

# Role names as the CLI spells them (rlfleet scale rollout=N).
ROLES = {
    "rollout": common_pb2.REPLICA_ROLE_ROLLOUT,
    "reward": common_pb2.REPLICA_ROLE_REWARD,
    "buffer": common_pb2.REPLICA_ROLE_BUFFER,
    "trainer": common_pb2.REPLICA_ROLE_TRAINER,
    "weights": common_pb2.REPLICA_ROLE_WEIGHTS,
}

_FINISHED_STATES = {
    controller_pb2.RUN_STATE_COMPLETED,
    controller_pb2.RUN_STATE_STOPPED,
    controller_pb2.RUN_STATE_FAILED,
}


class RlfleetError(Exception):
    """A service answered a call with an error.

    `method` is the call ("Controller.StartRun"), `code` the grpc.StatusCode and
    `details` the service's message (for INVALID_ARGUMENT it names the field).
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


def _message(cls, value, what: str):
    """`value` as a `cls` message: one already, or a dict in the message's JSON form."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        try:
            return json_format.ParseDict(value, cls())
        except json_format.ParseError as e:
            raise TypeError(f"{what}: {e}") from None
    raise TypeError(f"{what}: want a {cls.__name__} or a dict, got {type(value).__name__}")


def _set_fields(message, fields: Dict[str, Any], what: str):
    """Sets scalar / repeated / map fields of `message` by name; TypeError naming an unknown one."""
    known = {f.name: f for f in message.DESCRIPTOR.fields}
    for name, value in fields.items():
        f = known.get(name)
        if f is None:
            raise TypeError(f"{what}: no field `{name}` (fields: {', '.join(sorted(known))})")
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(message, name).update(value)
        elif f.label == f.LABEL_REPEATED:
            del getattr(message, name)[:]
            getattr(message, name).extend(value)
        elif f.message_type is not None:
            getattr(message, name).CopyFrom(_message(type(getattr(message, name)), value, f"{what}.{name}"))
        else:
            try:
                setattr(message, name, value)
            except (TypeError, ValueError) as e:
                raise TypeError(f"{what}.{name}: {e}") from None


class _Client:
    """One channel to one service, with the fleet's auth and deadlines."""

    _service = ""

    def __init__(self, address: str, *, token: Optional[str] = None, timeout: float = 60.0,
                 tls_ca: Optional[bytes] = None, tls_cert: Optional[bytes] = None, tls_key: Optional[bytes] = None,
                 max_message_bytes: int = 64 << 20):
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=tls_ca, private_key=tls_key,
                                                       certificate_chain=tls_cert)
            self._channel = grpc.secure_channel(address, credentials, options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        self.address = address
        self._auth = dict(token=token, timeout=timeout, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                          max_message_bytes=max_message_bytes)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self.timeout = timeout

    def _call(self, method, name: str, request, timeout: Optional[float] = None):
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise RlfleetError(f"{self._service}.{name}", e.code(), e.details() or "") from None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Controller(_Client):
    """The controller: runs, scaling, and the registry of every replica."""

    _service = "Controller"

    def __init__(self, address: str, **options):
        super().__init__(address, **options)
        self._stub = controller_pb2_grpc.ControllerServiceStub(self._channel)
        self._registry = controller_pb2_grpc.RegistryServiceStub(self._channel)

    def status(self) -> controller_pb2.GetStatusResponse:
        return self._call(self._stub.GetStatus, "GetStatus", controller_pb2.GetStatusRequest())

    def start_run(self, config: Optional[Any] = None, *, run_id: str = "", **fields) -> str:
        """Starts a run: `config` a RunConfig (or its JSON form as a dict), and/or its
        fields by name (task="reverse", steps=20, dataset=...). Returns the run's id."""
        request = controller_pb2.StartRunRequest(run_id=run_id)
        request.config.CopyFrom(_message(controller_pb2.RunConfig, config, "config"))
        _set_fields(request.config, fields, "RunConfig")
        return self._call(self._stub.StartRun, "StartRun", request).run_id

    def stop_run(self, run_id: str = "") -> controller_pb2.StopRunResponse:
        return self._call(self._stub.StopRun, "StopRun", controller_pb2.StopRunRequest(run_id=run_id))

    def scale(self, role: str, count: int) -> int:
        """Asks for `count` replicas of `role` (rollout, reward, trainer, weights);
        returns the count asked for before."""
        if role not in ROLES:
            raise ValueError(f"role `{role}`: want one of {', '.join(ROLES)}")
        request = controller_pb2.ScaleRequest(role=ROLES[role], target_count=count)
        return self._call(self._stub.Scale, "Scale", request).previous_count

    def wait(self, run_id: str = "", *, timeout: float = 600.0, poll: float = 0.5) -> controller_pb2.GetStatusResponse:
        """Waits until the run (the active one when empty) has completed, stopped or
        failed; TimeoutError after `timeout` seconds. Returns its last status."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if (not run_id or status.run_id == run_id) and status.state in _FINISHED_STATES:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id or status.run_id} still {controller_pb2.RunState.Name(status.state)} "
                                   f"after {timeout} s (step {status.step})")
            time.sleep(poll)

    def replicas(self, role: str = "", *, only_admitted: bool = False) -> List[common_pb2.ReplicaInfo]:
        """The replicas registered with the controller (of `role`, or all)."""
        if role and role not in ROLES:
            raise ValueError(f"role `{role}`: want one of {', '.join(ROLES)}")
        out: List[common_pb2.ReplicaInfo] = []
        request = controller_pb2.ListReplicasRequest(role=ROLES.get(role, 0), only_admitted=only_admitted)
        while True:
            response = self._call(self._registry.ListReplicas, "ListReplicas", request)
            out.extend(response.replicas)
            if not response.next_page_token:
                return out
            request.page.page_token = response.next_page_token

    def _connect(self, role: str, cls):
        found = self.replicas(role)
        if not found:
            raise LookupError(f"no {role} registered with the controller at {self.address}")
        return cls(found[0].grpc_address, **self._auth)

    def connect_trainer(self) -> "Trainer":
        return self._connect("trainer", Trainer)

    def connect_buffer(self) -> "Buffer":
        return self._connect("buffer", Buffer)

    def connect_rollouts(self) -> List["Rollout"]:
        return [Rollout(r.grpc_address, **self._auth) for r in self.replicas("rollout")]


class Trainer(_Client):
    """The trainer: train steps, its state, checkpoints, publishing weights."""

    _service = "Trainer"

    def __init__(self, address: str, **options):
        super().__init__(address, **options)
        self._stub = trainer_pb2_grpc.TrainerServiceStub(self._channel)

    def state(self) -> trainer_pb2.GetStateResponse:
        return self._call(self._stub.GetState, "GetState", trainer_pb2.GetStateRequest())

    def train_step(self, experiences: Iterable[common_pb2.Experience], params: Optional[Any] = None, *,
                   expected_step: Optional[int] = None, timeout: Optional[float] = None) -> trainer_pb2.TrainStepResponse:
        """One step on `experiences` (Experience messages); `params` an AlgorithmParams
        (or its JSON form, e.g. {"algorithm": "ALGORITHM_GRPO", "optimizer": {"learningRate": 1e-5}})."""
        request = trainer_pb2.TrainStepRequest()
        request.inline_batch.experiences.extend(experiences)
        request.params.CopyFrom(_message(type(request.params), params, "params"))
        if expected_step is not None:
            request.expected_step = expected_step
        return self._call(self._stub.TrainStep, "TrainStep", request, timeout)

    def publish(self, timeout: Optional[float] = None) -> trainer_pb2.PublishWeightsResponse:
        return self._call(self._stub.PublishWeights, "PublishWeights", trainer_pb2.PublishWeightsRequest(), timeout)

    def save_checkpoint(self, path: str, timeout: Optional[float] = None) -> trainer_pb2.SaveCheckpointResponse:
        return self._call(self._stub.SaveCheckpoint, "SaveCheckpoint", trainer_pb2.SaveCheckpointRequest(path=path),
                          timeout)


@dataclass
class Generation:
    """One sampled response: its tokens, each token's log-probability and the policy
    version that decoded it, why it ended, and the experience id the replica gave it."""
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    policy_versions: List[int] = field(default_factory=list)
    finish_reason: str = ""
    experience_id: str = ""


class Rollout(_Client):
    """A rollout replica: generation."""

    _service = "Rollout"

    def __init__(self, address: str, **options):
        super().__init__(address, **options)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)

    def info(self) -> rollout_pb2.GetInfoResponse:
        return self._call(self._stub.GetInfo, "GetInfo", rollout_pb2.GetInfoRequest())

    def generate(self, prompt_token_ids: Sequence[int], *, max_new_tokens: int = 64, temperature: float = 1.0,
                 top_p: float = 0.0, top_k: int = 0, num_samples: int = 1, seed: Optional[int] = None,
                 stop_token_ids: Sequence[int] = (), ignore_eos: bool = False, task: str = "",
                 request_id: Optional[str] = None, min_policy_version: int = 0,
                 timeout: Optional[float] = None) -> List[Generation]:
        """Samples `num_samples` responses to the prompt (token ids); streams them and
        returns them whole, in sample order."""
        request = rollout_pb2.GenerateRequest(
            request_id=request_id or f"py-{uuid.uuid4().hex[:16]}", task=task, num_samples=num_samples,
            min_policy_version=min_policy_version)
        request.prompt_token_ids.extend(prompt_token_ids)
        s = request.sampling
        s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.ignore_eos = temperature, top_p, top_k, max_new_tokens, ignore_eos
        s.stop_token_ids.extend(stop_token_ids)
        if seed is not None:
            s.seed = seed
        out = [Generation() for _ in range(max(num_samples, 1))]
        try:
            for event in self._stub.Generate(request, timeout=timeout or self.timeout, metadata=self._metadata):
                if event.HasField("chunk"):
                    g = out[event.chunk.sample_index]
                    g.token_ids.extend(event.chunk.token_ids)
                    g.logprobs.extend(event.chunk.logprobs)
                    g.policy_versions.extend(event.chunk.policy_versions)
                elif event.HasField("finished"):
                    g = out[event.finished.sample_index]
                    g.finish_reason = common_pb2.FinishReason.Name(event.finished.finish_reason)
                    g.experience_id = event.finished.experience_id.value
        except grpc.RpcError as e:
            raise RlfleetError("Rollout.Generate", e.code(), e.details() or "") from None
        return out


class Buffer(_Client):
    """The experience buffer."""

    _service = "Buffer"

    def __init__(self, address: str, **options):
        super().__init__(address, **options)
        self._stub = buffer_pb2_grpc.BufferServiceStub(self._channel)

    def put(self, experiences: Iterable[common_pb2.Experience], run_id: str = "") -> buffer_pb2.PutExperiencesResponse:
        request = buffer_pb2.PutExperiencesRequest(run_id=run_id, producer_id="python-client")
        request.experiences.extend(experiences)
        return self._call(self._stub.PutExperiences, "PutExperiences", request)

    def stats(self) -> buffer_pb2.GetStatsResponse:
        return self._call(self._stub.GetStats, "GetStats", buffer_pb2.GetStatsRequest())
