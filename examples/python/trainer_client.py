#!/usr/bin/python3
"""An orchestrator driving rlfleet's trainer from Python over gRPC: what a verl /
OpenRLHF user writes to run training steps from their own loop.

Generate the message classes once (protoc from Debian's protobuf-compiler), then run
with Debian's python3-grpcio and python3-protobuf:

  protoc -I proto --python_out=/tmp/rlfleet_py proto/rlfleet/v1/*.proto
  PYTHONPATH=/tmp/rlfleet_py /usr/bin/python3 examples/python/trainer_client.py \
      --trainer=127.0.0.1:PORT --checkpoint=step2

(checkpoint paths are relative to the trainer's --checkpoint_root, or absolute inside it)

It trains two GRPO steps on an inline batch, reads the trainer's state, saves a
checkpoint, shows what a malformed request gets back, and prints one JSON line.
"""
import argparse
import json
import sys

import grpc

from rlfleet.v1 import common_pb2, trainer_pb2


class Trainer:
    """rlfleet.v1.TrainerService through grpcio's generic stubs (no generated _grpc module)."""

    def __init__(self, address, token=None, timeout_s=60.0):
        self.channel = grpc.insecure_channel(address)
        self.metadata = [("authorization", "Bearer " + token)] if token else None
        self.timeout_s = timeout_s

    def _call(self, method, request, response_type):
        rpc = self.channel.unary_unary(
            "/rlfleet.v1.TrainerService/" + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString)
        # Every call has a deadline; UNAVAILABLE / DEADLINE_EXCEEDED are the retryable ones.
        return rpc(request, timeout=self.timeout_s, metadata=self.metadata)

    def train_step(self, request):
        return self._call("TrainStep", request, trainer_pb2.TrainStepResponse)

    def get_state(self):
        return self._call("GetState", trainer_pb2.GetStateRequest(), trainer_pb2.GetStateResponse)

    def save_checkpoint(self, path):
        return self._call("SaveCheckpoint", trainer_pb2.SaveCheckpointRequest(path=path, overwrite=True),
                          trainer_pb2.SaveCheckpointResponse)


def grpo_batch(step):
    """Four scored samples of one prompt (token ids as the rollout produced them)."""
    batch = trainer_pb2.InlineBatch()
    for i in range(4):
        e = batch.experiences.add()
        e.experience_id.value = "step%d-sample%d" % (step, i)
        e.group_id = "prompt-%d" % step
        e.prompt_token_ids.extend([1, 4, 5, 6])
        e.response_token_ids.extend([7 + i % 2, 8, 2])
        e.response_logprobs.extend([-3.0, -3.0, -3.0])
        e.token_policy_versions.extend([step + 1] * 3)
        e.reward = float(i % 2)
    return batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", required=True, help="host:port of rlfleet-trainer")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory, under the trainer's --checkpoint_root")
    parser.add_argument("--token", default=None, help="bearer token, if the trainer requires one")
    args = parser.parse_args()
    trainer = Trainer(args.trainer, args.token)

    losses = []
    for step in range(2):
        request = trainer_pb2.TrainStepRequest(inline_batch=grpo_batch(step), expected_step=step + 1)
        request.params.algorithm = common_pb2.ALGORITHM_GRPO
        request.params.optimizer.learning_rate = 1e-3
        response = trainer.train_step(request)
        losses.append(response.metrics.loss)
        print("step %d: loss %.4f, grad norm %.3f, %d tokens, version %d" % (
            response.step, response.metrics.loss, response.metrics.grad_norm, response.metrics.tokens,
            response.new_policy_version.version), file=sys.stderr)

    state = trainer.get_state()
    saved = trainer.save_checkpoint(args.checkpoint)

    # A malformed request is a clear error naming the problem, not a crash.
    try:
        trainer.train_step(trainer_pb2.TrainStepRequest())
        bad = "accepted"
    except grpc.RpcError as e:
        bad = "%s: %s" % (e.code().name, e.details())

    print(json.dumps({"step": state.step, "version": state.policy_version.version, "losses": losses,
                      "checkpoint": saved.path, "checkpoint_step": saved.step, "bad_request": bad}))


if __name__ == "__main__":
    main()
