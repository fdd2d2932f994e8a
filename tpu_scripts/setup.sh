#!/usr/bin/env bash
# Install jax[tpu] and this package on every worker of a TPU slice (idempotent).
#
#   tpu_scripts/setup.sh [--name TPU_NAME] [--zone ZONE] [--project PROJECT]
#                        [--jax-version X.Y.Z] [--pull [--repo URL]] [--ref REF] [--dry-run]
#
# Copies the code (a `git archive` of REF, default HEAD; or with --pull a clone/fetch of REF
# from REPO_URL, default the origin remote, on the workers) to ~/jaxrl_reason on every worker,
# then runs tpu_scripts/worker.sh setup there: a virtualenv ~/jaxrl_venv with
# jax[tpu]==JAX_VERSION and `pip install -e ~/jaxrl_reason`. A worker whose marker file
# (~/jaxrl_venv/.jaxrl_reason_setup: the jax version and a hash of pyproject.toml) matches and
# that imports jax and jaxrl_reason is left alone, so re-running is safe and quick.
#
#   TPU_NAME, ZONE, PROJECT   as in create.sh                              --name --zone --project
#   JAX_VERSION               default: the jax[tpu]==X pin of pyproject.toml   --jax-version
#   REPO_URL                  git URL the workers clone with --pull            --repo
#   --dry-run                 print the commands (`+ gcloud ...`) without running them
set -euo pipefail
# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

split_flags "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  common_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  code_flag "$@"
  if ((NSHIFT)); then shift "$NSHIFT"; continue; fi
  case $1 in
    --jax-version) need_value "$@"; JAX_VERSION=$2; shift ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

check_target
if [[ -z ${JAX_VERSION:-} ]]; then
  JAX_VERSION=$(sed -n 's/.*"jax\[tpu\]==\([^"]*\)".*/\1/p' "$REPO_ROOT/pyproject.toml" | head -n 1)
fi
require JAX_VERSION --jax-version "no jax[tpu]==X pin found in pyproject.toml"

ship_code
ssh_all "$FETCH && $(quote bash "$CODE/tpu_scripts/worker.sh" setup "$JAX_VERSION")"
note "Next: tpu_scripts/launch.sh --name $TPU_NAME --zone $ZONE --workdir gs://BUCKET/runs/RUN configs/NAME.py"
