"""A reward written in Python, scoring a real fleet's run (tests/python:python_client_test
runs it after fleet_check.py): the worker registers for task `reverse`, the run's items
go to it, its function's failures become error rewards with a logged reason, and the
run completes. Exits non-zero on the first failed check.

    python reward_check.py CONTROLLER_ADDRESS WORK_DIR
"""
import os
import subprocess
import sys
import time

from rlfleet import Controller
from rlfleet.v1 import controller_pb2

USER_FUNCTION = '''
calls = 0

def reward(prompt, completion, **fields):
    """Partial credit for reversing the prompt's digits (the characters in place, a
    little for length); every 5th call raises, every 7th returns text."""
    global calls
    calls += 1
    if calls % 5 == 0:
        raise ValueError("a deliberate failure")
    if calls % 7 == 0:
        return "not a number"
    answer = fields["answer"].strip()
    right = sum(a == b for a, b in zip(completion, answer))
    return right / max(len(answer), 1) + 0.01 * min(len(completion), 10)
'''


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def start_worker(args, work):
    log = open(os.path.join(work, "worker.log"), "w+")
    worker = subprocess.Popen([sys.executable, "-m", "rlfleet.reward_worker"] + args, stdout=log,
                              stderr=subprocess.STDOUT)
    return worker, log


def wait_for(log, text, worker, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log.seek(0)
        out = log.read()
        if text in out:
            return out
        if worker.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    raise SystemExit(f"FAILED: no {text!r} from the worker:\n{log.read()}")


def main(address, work):
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "my_rewards.py")
    with open(path, "w") as f:
        f.write(USER_FUNCTION)

    # A function that cannot be loaded is a clear error at start.
    bad = subprocess.run([sys.executable, "-m", "rlfleet.reward_worker", "--function", path + ":no_such",
                          "--tasks", "reverse"], capture_output=True, text=True, timeout=60)
    check(bad.returncode == 2 and "has no function no_such" in bad.stderr, f"bad --function: {bad.stderr.strip()}")

    worker, log = start_worker(["--function", path + ":reward", "--tasks", "reverse", "--controller", address], work)
    try:
        wait_for(log, "registered with the controller", worker)
        with Controller(address, timeout=60) as c:
            workers = [r for r in c.replicas("reward") if r.labels.get("reward.tasks") == "reverse"]
            check(len(workers) == 1, "the worker is in the registry as a reward replica for task reverse")
            run_id = c.start_run(task="reverse", total_steps=2, group_size=8, batch_size=8, max_new_tokens=8,
                                 temperature=1.0, task_params={"min_len": "1", "max_len": "2"})
            final = c.wait(run_id, timeout=240)
            check(final.state == controller_pb2.RUN_STATE_COMPLETED,
                  f"run {run_id} scored in Python: {controller_pb2.RunState.Name(final.state)} {final.error}")
        check(worker.poll() is None, "the worker is alive after its function failed")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    log.seek(0)
    out = log.read()
    print(out)
    scored = [line for line in out.splitlines() if "stopped: scored" in line]
    check(len(scored) == 1, "the worker stopped cleanly")
    n = int(scored[0].split("scored ")[1].split()[0])
    check(n >= 32, f"the worker scored the run's items ({n})")
    check("raised ValueError: a deliberate failure" in out, "a raising function's reason is logged")
    check("not a number" in out, "a non-number's reason is logged")
    with Controller(address, timeout=60) as c:
        gone = [r for r in c.replicas("reward") if r.labels.get("reward.tasks") == "reverse"]
        check(not gone, "the worker deregistered when it stopped")
    print("reward worker: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
