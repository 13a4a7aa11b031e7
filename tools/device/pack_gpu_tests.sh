#!/usr/bin/env bash
# On the build machine: packs for tools/device/run_gpu_tests.sh every test tagged `gpu`
# and the tests of code that runs the model on RLFLEET_TEST_DEVICE (libs/model, the
# rollout and trainer cores and services, the model reward, the Gloo group), with the
# libraries the GPU machine lacks and Debian's absl and Gloo headers for building the
# model backends there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mapfile -t gpu < <(bazel query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
DEVICE_TESTS=(
  //libs/model/tests:policy_test //libs/model/tests:decode_batch_test
  //services/rollout/tests:rollout_test //services/rollout/tests:weight_intake_test
  //services/trainer/tests:trainer_core_test //services/trainer/tests:trainer_service_test
  //services/reward/tests:model_reward_test //libs/dist/tests:gloo_group_test
)
bash tools/device/pack.sh "${gpu[@]}" "${DEVICE_TESTS[@]}" "$@"
bash tools/device/pack_absl.sh
du -sh .carry >&2
