#!/bin/bash
# setup-env.sh - a minimal TPU VM startup script: prepare the job's environment at boot, start
# nothing. Use it when you want `tpuwatch watch` (not the boot) to start the job:
#     [tpu]
#     startup_script = "startup-scripts/setup-env.sh"
#
# Settings: instance metadata attributes, set under [tpu.spec.metadata] (never edit this file):
#   tpuwatch-setup   shell commands run as the job's user in its home (clone the code,
#                    install packages, mount a disk ...)
#   tpuwatch-pip     arguments for `python3 -m pip install --user` (e.g. "jax[tpu] orbax")
#   tpuwatch-user    the job's user (tpuwatch writes it: the user it connects as over SSH)
# Metadata server: http://metadata.google.internal/computeMetadata/v1, or GCE_METADATA_HOST /
# TPUWATCH_METADATA_URL to point it elsewhere (a simulator). Runs as root on every worker at
# every boot; output goes to the boot log. Exit status 0 done, 1 a step failed.

set -u -o pipefail
MD_URL=${TPUWATCH_METADATA_URL:-http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1}
MD_URL=${MD_URL%/}
log() { printf 'setup-env: %s\n' "$*"; }

get() {  # get KEY VAR: VAR=value, empty when absent; exit 1 when the server is unreachable
  local value rc
  value=$(curl -sS -f --max-time 10 --retry "${TPUWATCH_METADATA_RETRIES:-5}" --retry-delay 1 --retry-connrefused \
    -H 'Metadata-Flavor: Google' "$MD_URL/instance/attributes/$1" 2>/dev/null)
  rc=$?
  if [ $rc != 0 ] && [ $rc != 22 ]; then
    log "cannot reach the metadata server at $MD_URL (reading $1)"
    exit 1
  fi
  [ $rc = 0 ] || value=""
  printf -v "$2" '%s' "$value"
}

get tpuwatch-setup SETUP
get tpuwatch-pip PIP_ARGS
get tpuwatch-user RUN_USER

as_user() {
  if [ "$(id -u)" = 0 ] && [ -n "$RUN_USER" ] && [ "$RUN_USER" != root ]; then
    for _ in $(seq 1 60); do id -u "$RUN_USER" >/dev/null 2>&1 && break; sleep 1; done
    id -u "$RUN_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$RUN_USER" || return 1
    local home
    home=$(getent passwd "$RUN_USER" | cut -d: -f6)
    (cd "$home" && runuser -u "$RUN_USER" -- env HOME="$home" USER="$RUN_USER" LOGNAME="$RUN_USER" "$@")
  else
    (cd "$HOME" && "$@")
  fi
}

if [ -n "$PIP_ARGS" ]; then
  log "pip install --user $PIP_ARGS"
  as_user bash -c "python3 -m pip install --user $PIP_ARGS" || { log "pip install failed"; exit 1; }
fi
if [ -n "$SETUP" ]; then
  log "running tpuwatch-setup"
  as_user bash -c "$SETUP" || { log "tpuwatch-setup failed"; exit 1; }
fi
log "done"
