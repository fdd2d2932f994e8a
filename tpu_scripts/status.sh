#!/usr/bin/env bash
# State of a TPU slice (and of its queued resource with --queued), then, on every worker,
# whether a training runs and the last lines of its log.
#
#   tpu_scripts/status.sh [--name TPU_NAME] [--zone ZONE] [--project PROJECT] [--queued]
#                         [--run RUN] [--lines N] [--dry-run]
#
#   TPU_NAME, ZONE, PROJECT   as in create.sh                      --name --zone --project
#   QUEUED=1                  also describe the queued resource    --queued
#   RUN                       run whose logs to show (default: the last launched)   --run
#   --lines N                 lines of each worker's log (default 20)
#   --dry-run                 print the commands (`+ gcloud ...`) without running them
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

QUEUED=${QUEUED:-0}
RUN=${RUN:-latest}
NLINES=20
split_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  common_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  case $1 in
    --queued) QUEUED=1 ;;
    --run) need_value "$@"; RUN=$2; shift ;;
    --lines) need_value "$@"; NLINES=$2; shift ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

check_target
[[ $NLINES =~ ^[0-9]+$ ]] || die "--lines needs a number, got '$NLINES'"
if [[ $QUEUED == 1 ]]; then
  run gcloud compute tpus queued-resources describe "$TPU_NAME" "${WHERE[@]}" \
    --format='yaml(state,tpu.nodeSpec[0].node.acceleratorType,spot)'
fi
if ! run gcloud compute tpus tpu-vm describe "$TPU_NAME" "${WHERE[@]}" \
  --format='yaml(acceleratorType,state,health,healthDescription,schedulingConfig)'; then
  die "no TPU VM $TPU_NAME in $ZONE (yet)"
fi
ssh_all "$(quote bash "$CODE/tpu_scripts/worker.sh" status "$RUN" "$NLINES")"
