#!/usr/bin/env bash
# Create a Cloud TPU VM slice (or, with --queued, a queued resource that provisions it).
#
#   tpu_scripts/create.sh [--name TPU_NAME] [--zone ZONE] [--type ACCELERATOR_TYPE]
#                         [--version RUNTIME_VERSION] [--project PROJECT]
#                         [--spot] [--queued] [--dry-run]
#
# Flags override the environment variables of the same meaning:
#   TPU_NAME          name of the TPU VM (and of its queued resource)        --name
#   ZONE              e.g. us-central2-b, us-east5-a                          --zone
#   ACCELERATOR_TYPE  e.g. v5litepod-16 (v5e-16), v5p-8, v6e-8, v4-8          --type
#   RUNTIME_VERSION   TPU software version: v2-alpha-tpuv5-lite (v5e),
#                     v2-alpha-tpuv5 (v5p), v2-alpha-tpuv6e (v6e),
#                     tpu-ubuntu2204-base (v4)                                --version
#   PROJECT           optional; gcloud's default project when unset           --project
#   SPOT=1            spot capacity: cheaper, can be preempted at any time    --spot
#   QUEUED=1          `queued-resources create`: waits in a queue until
#                     capacity is free instead of failing at once             --queued
#   --dry-run         print the gcloud command (`+ gcloud ...`) without running it
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SPOT=${SPOT:-0}
QUEUED=${QUEUED:-0}
split_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  common_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  case $1 in
    --type) need_value "$@"; ACCELERATOR_TYPE=$2; shift ;;
    --version) need_value "$@"; RUNTIME_VERSION=$2; shift ;;
    --spot) SPOT=1 ;;
    --queued) QUEUED=1 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

check_target
require ACCELERATOR_TYPE --type "e.g. v5litepod-16, v5p-8"
require RUNTIME_VERSION --version "e.g. v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p"

capacity=()
if [[ $SPOT == 1 ]]; then capacity=(--spot); fi
if [[ $QUEUED == 1 ]]; then
  run gcloud compute tpus queued-resources create "$TPU_NAME" "${WHERE[@]}" \
    --node-id="$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
    --runtime-version="$RUNTIME_VERSION" ${capacity[@]+"${capacity[@]}"}
  note "Queued. Watch it with: tpu_scripts/status.sh --queued --name $TPU_NAME --zone $ZONE"
  note "(state ACTIVE = provisioned; then run tpu_scripts/setup.sh)"
else
  run gcloud compute tpus tpu-vm create "$TPU_NAME" "${WHERE[@]}" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" \
    ${capacity[@]+"${capacity[@]}"}
  note "Next: tpu_scripts/setup.sh --name $TPU_NAME --zone $ZONE"
fi
