#!/usr/bin/env bash
# Runs ON each TPU worker (setup.sh, launch.sh and status.sh call it through
# `gcloud compute tpus tpu-vm ssh --worker=all`); not meant to be run on your machine.
#
#   worker.sh setup JAX_VERSION              virtualenv ~/jaxrl_venv with jax[tpu] and the
#                                            package (skipped when already done)
#   worker.sh launch RUN WORKDIR CONFIG [ARG...]
#                                            `python -m jaxrl_reason.cli train --config CONFIG
#                                            --workdir WORKDIR ARG...` detached from the ssh
#                                            session (setsid nohup), logging to
#                                            ~/jaxrl_runs/RUN/worker-$(hostname).log
#   worker.sh status [RUN] [LINES]           running or not, and the log's last LINES lines
#   worker.sh stop                           SIGTERM to the training: it checkpoints, exits
#
# Every line it prints starts with [hostname], since the workers' outputs interleave.
set -euo pipefail

CODE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${JAXRL_VENV:-$HOME/jaxrl_venv}
RUNS=$HOME/jaxrl_runs
MARKER=$VENV/.jaxrl_reason_setup
HOST=$(hostname)

say() { echo "[$HOST] $*"; }
die() { echo "[$HOST] error: $*" >&2; exit 1; }

# The pid of the training started by `launch` if it is still running, else nothing.
running_pid() {
  local pid
  pid=$(cat "$RUNS/current.pid" 2>/dev/null) || return 0
  if [[ -n $pid ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q jaxrl_reason.cli; then
    echo "$pid"
  fi
}

setup() {
  local jax_version=$1 want
  want="jax[tpu]==$jax_version pyproject:$(sha256sum "$CODE_DIR/pyproject.toml" | cut -c1-16)"
  if [[ -f $MARKER && $(<"$MARKER") == "$want" ]] \
    && "$VENV/bin/python" -c 'import jax, jaxrl_reason' 2>/dev/null; then
    say "already set up ($want)"
    return
  fi
  if [[ ! -x $VENV/bin/python ]]; then
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then  # Ubuntu images may lack python3-venv
      rm -rf "$VENV"
      sudo apt-get update -q && sudo apt-get install -y -q python3-venv
      python3 -m venv "$VENV"
    fi
  fi
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "jax[tpu]==$jax_version"
  "$VENV/bin/pip" install -q -e "$CODE_DIR"
  "$VENV/bin/python" -c 'import jax, jaxrl_reason; print("jax", jax.__version__)' | sed "s/^/[$HOST] /"
  echo "$want" >"$MARKER"
  say "set up ($want)"
}

launch() {
  (($# >= 3)) || die "usage: worker.sh launch RUN WORKDIR CONFIG [ARG...]"
  local run=$1 workdir=$2 config=$3 pid log
  shift 3
  [[ -x $VENV/bin/python ]] || die "no virtualenv at $VENV: run tpu_scripts/setup.sh first"
  pid=$(running_pid)
  [[ -z $pid ]] || die "a training is already running (pid $pid): stop it with tpu_scripts/launch.sh --stop"
  mkdir -p "$RUNS/$run"
  log=$RUNS/$run/worker-$HOST.log
  cd "$CODE_DIR"
  echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) train --config $config --workdir $workdir $*" >>"$log"
  PYTHONUNBUFFERED=1 setsid nohup "$VENV/bin/python" -m jaxrl_reason.cli train \
    --config "$config" --workdir "$workdir" "$@" >>"$log" 2>&1 </dev/null &
  echo "$!" >"$RUNS/current.pid"
  ln -sfn "$run" "$RUNS/latest"
  say "started pid $!, log $log"
}

status() {
  local run=${1:-latest} lines=${2:-20} pid log
  pid=$(running_pid)
  if [[ -n $pid ]]; then say "training running (pid $pid)"; else say "no training running"; fi
  log=$RUNS/$run/worker-$HOST.log
  if [[ -f $log ]]; then
    say "--- last $lines lines of $log"
    tail -n "$lines" "$log" | sed "s/^/[$HOST] /"
  else
    say "no log at $log"
  fi
}

stop() {
  local pid
  pid=$(running_pid)
  if [[ -z $pid ]]; then say "no training running"; return; fi
  kill -TERM "$pid"
  say "sent SIGTERM to pid $pid: it saves a checkpoint at the next step and exits"
}

case ${1:-} in
  setup | launch | status | stop) cmd=$1; shift; "$cmd" "$@" ;;
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" ;;
  *) die "usage: worker.sh {setup|launch|status|stop} ... (see the top of this file)" ;;
esac
