#!/usr/bin/env bash
# Delete a TPU slice (with --queued: its queued resource and the slice). Asks first.
#
#   tpu_scripts/teardown.sh [--name TPU_NAME] [--zone ZONE] [--project PROJECT]
#                           [--queued] [--yes] [--dry-run]
#
#   TPU_NAME, ZONE, PROJECT   as in create.sh                      --name --zone --project
#   QUEUED=1                  the slice was made by `create.sh --queued`     --queued
#   --yes                     do not ask; without it a run with no terminal on stdin
#                             refuses to delete anything
#   --dry-run                 print the command (`+ gcloud ...`) without running it
# The workdir (checkpoints, metrics) is not touched; logs on the workers' disks are deleted.
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

QUEUED=${QUEUED:-0}
YES=0
split_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  common_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  case $1 in
    --queued) QUEUED=1 ;;
    -y | --yes) YES=1 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

check_target
what="TPU VM $TPU_NAME"
if [[ $QUEUED == 1 ]]; then what="queued resource $TPU_NAME and its TPU VM"; fi
if [[ $YES != 1 && $DRY_RUN != 1 ]]; then
  [[ -t 0 ]] || die "refusing to delete the $what without confirmation (stdin is not a terminal): pass --yes"
  read -r -p "Delete the $what in $ZONE? [y/N] " answer
  [[ $answer == [yY] || $answer == [yY][eE][sS] ]] || die "not deleted"
fi
# --quiet: gcloud's own prompt was answered above.
if [[ $QUEUED == 1 ]]; then
  run gcloud compute tpus queued-resources delete "$TPU_NAME" "${WHERE[@]}" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${WHERE[@]}" --quiet
fi
