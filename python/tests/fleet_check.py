"""Drives a running fleet through the rlfleet Python client, as a user's orchestrator
would, and checks what comes back (tests/python:python_client_test runs it against a
real local fleet). Exits non-zero on the first failed check.

    python fleet_check.py CONTROLLER_ADDRESS
"""
import sys

import grpc

from rlfleet import Controller, RlfleetError
from rlfleet.v1 import common_pb2, controller_pb2


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def main(address):
    with Controller(address, timeout=60) as c:
        status = c.status()
        check(status.state != controller_pb2.RUN_STATE_RUNNING,
              f"status: {controller_pb2.RunState.Name(status.state)} (no run active)")
        trainer, buffer, rollouts = c.connect_trainer(), c.connect_buffer(), c.connect_rollouts()
        check(len(rollouts) >= 1, f"{len(rollouts)} rollout replica(s) found through the registry")

        # A whole run through the controller (it also gives the replicas their first weights).
        run_id = c.start_run(task="reverse", total_steps=2, group_size=8, batch_size=8, max_new_tokens=8, temperature=1.0,
                             task_params={"min_len": "1", "max_len": "2"})
        final = c.wait(run_id, timeout=240)
        check(final.state == controller_pb2.RUN_STATE_COMPLETED and final.step >= 2,
              f"run {run_id}: {controller_pb2.RunState.Name(final.state)} at step {final.step} {final.error}")

        # Generation: two samples, every token with its logprob and policy version.
        gens = rollouts[0].generate([4, 5, 6], max_new_tokens=4, temperature=1.0, num_samples=2, seed=7,
                                    request_id="py-check")
        check(len(gens) == 2, "two samples")
        for i, g in enumerate(gens):
            check(1 <= len(g.token_ids) <= 4 and len(g.logprobs) == len(g.token_ids) ==
                  len(g.policy_versions), f"sample {i}: {len(g.token_ids)} tokens with logprobs and versions")
            check(g.finish_reason.startswith("FINISH_REASON_") and g.experience_id == f"py-check:{i}",
                  f"sample {i}: {g.finish_reason}, {g.experience_id}")

        # A train step on them, inline; then the buffer takes them.
        experiences = []
        for i, g in enumerate(gens):
            e = common_pb2.Experience(prompt_id="p", group_id="g", task="reverse", reward=float(i))
            e.experience_id.value = g.experience_id  # ("<request_id>:<sample>", as the buffer takes ids)
            e.prompt_token_ids.extend([4, 5, 6])
            e.response_token_ids.extend(g.token_ids)
            e.response_logprobs.extend(g.logprobs)
            e.token_policy_versions.extend(g.policy_versions)
            experiences.append(e)
        before = trainer.state().step
        stepped = trainer.train_step(experiences, {"algorithm": "ALGORITHM_GRPO"})
        check(stepped.step == before + 1, f"train_step: step {before} -> {stepped.step}, loss {stepped.metrics.loss:.4f}")
        put = buffer.put(experiences)
        check(put.accepted + put.duplicates == 2, f"buffer.put: {put.accepted} accepted {list(put.rejections)}")

        # Mistakes get errors that name them.
        try:
            rollouts[0].generate([], max_new_tokens=4)
            check(False, "an empty prompt is refused")
        except RlfleetError as e:
            check(e.code == grpc.StatusCode.INVALID_ARGUMENT and "prompt_token_ids" in e.details,
                  f"an empty prompt: {e}")
        try:
            c.start_run(task="reverse", no_such_field=1)
            check(False, "an unknown RunConfig field is refused")
        except TypeError as e:
            check("no_such_field" in str(e), f"an unknown field: {str(e)[:60]}")
        try:
            c.scale("gpus", 2)
            check(False, "an unknown role is refused")
        except ValueError as e:
            check("gpus" in str(e), f"an unknown role: {e}")
    print("python client: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
