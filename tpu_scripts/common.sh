# shellcheck shell=bash
# shellcheck disable=SC2034  # (sets variables that the sourcing scripts read)
# Sourced by the tpu_scripts: flags every script takes, required-variable checks, and `run`,
# which prints each command as `+ gcloud ...` (shell-quoted, one line) and runs it unless
# --dry-run. Variables: TPU_NAME, ZONE, PROJECT (optional: gcloud's default project).

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CODE=jaxrl_reason  # where the code lives on each worker (relative to the worker's home)
DRY_RUN=${DRY_RUN:-0}

die() { echo "$(basename "$0"): error: $*" >&2; exit 2; }
note() { echo "$*" >&2; }

# The comment block at the top of the calling script, without its `# `.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

# require VAR FLAG: fail fast, naming the variable and the flag that sets it.
require() {
  [[ -n ${!1:-} ]] || die "$1 is not set: export $1=... or pass $2${3:+ ($3)}"
}

# quote ARGS...: the arguments as one line of shell words, quoted only where needed
# (`--flag='a b'` keeps the flag name outside the quotes, for reading).
quote() {
  local words=() a q="'"
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      words+=("$a")
    elif [[ $a =~ ^(--[A-Za-z0-9_.-]+=)(.+)$ ]]; then
      words+=("${BASH_REMATCH[1]}'${BASH_REMATCH[2]//$q/$q\\$q$q}'")
    else
      words+=("'${a//$q/$q\\$q$q}'")
    fi
  done
  echo "${words[*]}"
}

need_value() { [[ $# -ge 2 ]] || die "$1 needs a value"; }

run() {
  echo "+ $(quote "$@")"
  [[ $DRY_RUN == 1 ]] || "$@"
}

# split_flags ARGS...: sets ARGS to the arguments with `--flag=value` split in two, except
# `--config.a.b=v` overrides and whatever follows `--`, which pass through untouched.
split_flags() {
  ARGS=()
  while (($#)); do
    case $1 in
      --) ARGS+=("$@"); return ;;
      --config.*) ARGS+=("$1") ;;
      --*=*) ARGS+=("${1%%=*}" "${1#*=}") ;;
      *) ARGS+=("$1") ;;
    esac
    shift
  done
}

# common_flag ARGS...: consumes a flag that every script takes; sets NSHIFT to the number of
# arguments used (0: not a common flag).
common_flag() {
  NSHIFT=2
  case $1 in
    --name) need_value "$@"; TPU_NAME=$2 ;;
    --zone) need_value "$@"; ZONE=$2 ;;
    --project) need_value "$@"; PROJECT=$2 ;;
    --dry-run) DRY_RUN=1; NSHIFT=1 ;;
    -h | --help) usage; exit 0 ;;
    *) NSHIFT=0 ;;
  esac
}

# check_target: TPU_NAME and ZONE are set; sets WHERE (the --zone/--project flags) and, unless
# --dry-run, checks that gcloud is installed.
check_target() {
  require TPU_NAME --name
  require ZONE --zone "e.g. us-central2-b"
  WHERE=(--zone="$ZONE")
  if [[ -n ${PROJECT:-} ]]; then WHERE+=(--project="$PROJECT"); fi
  if [[ $DRY_RUN != 1 ]] && ! command -v gcloud >/dev/null; then
    die "gcloud is not installed (see https://cloud.google.com/sdk/docs/install); --dry-run prints the commands without it"
  fi
}

ssh_all() { run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="$1"; }

# ship_code: puts the repository's commit REF (default HEAD) at ~/jaxrl_reason on every worker:
# a `git archive` copied with scp, or with PULL=1 a clone/fetch of REPO_URL on the workers.
# Sets FETCH, the remote command that puts the code in place (to run in the next ssh).
ship_code() {
  local sha tarball
  if [[ ${PULL:-0} == 1 ]]; then
    if [[ -z ${REPO_URL:-} ]]; then
      REPO_URL=$(git -C "$REPO_ROOT" remote get-url origin 2>/dev/null) \
        || die "REPO_URL is not set and the repository has no origin: export REPO_URL=... or pass --repo"
    fi
    [[ -n ${REF:-} ]] || REF=$(git -C "$REPO_ROOT" rev-parse HEAD)
    FETCH="{ test -d $CODE/.git || { rm -rf $CODE && git clone -q $(quote "$REPO_URL") $CODE; }; }"
    FETCH+=" && git -C $CODE fetch -q origin $(quote "$REF") && git -C $CODE checkout -q --force --detach FETCH_HEAD"
    return
  fi
  sha=$(git -C "$REPO_ROOT" rev-parse --verify -q "${REF:-HEAD}^{commit}") \
    || die "--ref ${REF:-HEAD} is not a commit of $REPO_ROOT"
  if [[ -z ${REF:-} ]] && ! git -C "$REPO_ROOT" diff-index --quiet HEAD --; then
    note "note: uncommitted changes are not shipped (git archive of HEAD, ${sha:0:12})"
  fi
  tarball="$(cd "${TMPDIR:-/tmp}" && pwd)/jaxrl_reason-$sha.tar.gz"  # absolute: git runs in -C
  run git -C "$REPO_ROOT" archive --format=tar.gz --output="$tarball" "$sha"
  run gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:$CODE.tar.gz" "${WHERE[@]}" --worker=all
  if [[ $DRY_RUN != 1 ]]; then rm -f "$tarball"; fi
  FETCH="rm -rf $CODE.new && mkdir $CODE.new && tar -xzf $CODE.tar.gz -C $CODE.new"
  FETCH+=" && rm -rf $CODE $CODE.tar.gz && mv $CODE.new $CODE"
}

# code_flag ARGS...: like common_flag, for the flags of ship_code (--pull, --ref, --repo).
code_flag() {
  NSHIFT=2
  case $1 in
    --pull) PULL=1; NSHIFT=1 ;;
    --ref) need_value "$@"; REF=$2 ;;
    --repo) need_value "$@"; REPO_URL=$2 ;;
    *) NSHIFT=0 ;;
  esac
}
