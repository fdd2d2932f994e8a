#!/usr/bin/env bash
# Run one config on every worker of a TPU slice, detached from ssh (survives disconnects).
#
#   tpu_scripts/launch.sh [--name TPU_NAME] [--zone ZONE] [--project PROJECT]
#                         [--workdir WORKDIR] [--run RUN] [--pull [--repo URL]] [--ref REF]
#                         [--no-resume] [--dry-run] CONFIG [--config.a.b=v ...] [-- ARG ...]
#   tpu_scripts/launch.sh --stop [--name TPU_NAME] [--zone ZONE] [--dry-run]
#
# Copies the code (a `git archive` of REF, default HEAD: commit what you want to run; or
# with --pull a clone/fetch of REF from REPO_URL on the workers) to ~/jaxrl_reason on every
# worker, then starts on all of them at once, under setsid nohup:
#   python -m jaxrl_reason.cli train --config CONFIG --workdir WORKDIR --resume [overrides]
# Each worker logs to its own ~/jaxrl_runs/RUN/worker-$(hostname).log (RUN defaults to the
# workdir's last path component). `--config.a.b=v` overrides and anything after `--` are
# passed to the CLI unchanged. --resume is passed unless --no-resume: a fresh workdir starts
# from scratch, and relaunching with the same workdir (e.g. after a spot preemption)
# continues from its latest checkpoint. --stop sends SIGTERM to the running training on every
# worker: it saves a checkpoint at the next step and exits.
#
#   TPU_NAME, ZONE, PROJECT   as in create.sh                      --name --zone --project
#   WORKDIR                   run directory seen by every worker, e.g. gs://BUCKET/runs/RUN
#                             (a spot slice's disks are gone after a preemption)   --workdir
#   REPO_URL                  git URL the workers clone with --pull                 --repo
#   CONFIG                    e.g. configs/arith_grpo.py (relative to the repo)     --config
#   --dry-run                 print the commands (`+ gcloud ...`) without running them
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CONFIG=""
RUN=${RUN:-}
RESUME=1
STOP=0
EXTRA=()
split_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  common_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  code_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  case $1 in
    --workdir) need_value "$@"; WORKDIR=$2; shift ;;
    --run) need_value "$@"; RUN=$2; shift ;;
    --config) need_value "$@"; CONFIG=$2; shift ;;
    --config.*) EXTRA+=("$1") ;;
    --no-resume) RESUME=0 ;;
    --stop) STOP=1 ;;
    --) shift; EXTRA+=("$@"); break ;;
    -*) die "unknown argument: $1 (see --help; CLI flags go after --)" ;;
    *) [[ -z $CONFIG ]] || die "two configs given: $CONFIG and $1"; CONFIG=$1 ;;
  esac
  shift
done

check_target
if [[ $STOP == 1 ]]; then
  ssh_all "$(quote bash "$CODE/tpu_scripts/worker.sh" stop)"
  exit 0
fi
require WORKDIR --workdir "e.g. gs://BUCKET/runs/RUN, shared by every worker"
require CONFIG --config "e.g. configs/arith_grpo.py"
CONFIG=${CONFIG#./}
[[ $CONFIG != /* ]] || die "give CONFIG relative to the repository root (e.g. configs/arith_grpo.py): $CONFIG"
if [[ ${PULL:-0} != 1 ]] && ! git -C "$REPO_ROOT" cat-file -e "${REF:-HEAD}:${CONFIG%%:*}" 2>/dev/null; then
  die "CONFIG ${CONFIG%%:*} is not in the shipped commit ${REF:-HEAD} of $REPO_ROOT"
fi
if [[ -z $RUN ]]; then
  RUN=${WORKDIR%/}
  RUN=${RUN##*/}
fi
[[ $RUN =~ ^[A-Za-z0-9._-]+$ ]] || die "RUN must be a plain name (letters, digits, . _ -): '$RUN'; pass --run"

cli_args=()
if [[ $RESUME == 1 ]]; then cli_args=(--resume); fi
cli_args+=(${EXTRA[@]+"${EXTRA[@]}"})
ship_code
ssh_all "$FETCH && $(quote bash "$CODE/tpu_scripts/worker.sh" launch "$RUN" "$WORKDIR" "$CONFIG" ${cli_args[@]+"${cli_args[@]}"})"

where_flags=$(quote "${WHERE[@]}")
note "
Started run $RUN on every worker of $TPU_NAME. Each worker logs to
  ~/jaxrl_runs/$RUN/worker-\$(hostname).log
Follow worker 0:
  gcloud compute tpus tpu-vm ssh $TPU_NAME $where_flags --worker=0 --command='tail -f jaxrl_runs/$RUN/worker-*.log'
Last lines of every worker's log:
  tpu_scripts/status.sh --name $TPU_NAME $where_flags --run $RUN
Stop (checkpoints first); relaunch with the same --workdir to resume:
  tpu_scripts/launch.sh --stop --name $TPU_NAME $where_flags"
