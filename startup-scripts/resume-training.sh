#!/bin/bash
# resume-training.sh - a TPU VM startup script that resumes the training job at boot.
#
# Use it: in tpuwatch.toml set
#     [tpu]
#     startup_script = "startup-scripts/resume-training.sh"
# tpuwatch then sends this file as the node's `startup-script` metadata on every create, with
# the settings below as metadata too. The TPU VM runs it as root on every worker at every boot.
# It installs what the job needs, then starts the job through tpuwatch's own worker-side
# protocol (tpuwatch/workers/remote.sh, under ~/.tpuwatch/<job>/ with its flock): the job
# resumes before the watcher reconnects, and when the watcher does, it finds that attempt
# running and never starts a second copy.
#
# Settings: instance metadata attributes (never edit this file). tpuwatch writes these on
# every create from the config:
#   tpuwatch-job            job name; the job's files are ~/.tpuwatch/<job>/           (required)
#   tpuwatch-command        [job] command; {checkpoint} {step} {attempt} {worker}
#                           are substituted shell-quoted                                 (required)
#   tpuwatch-worker-script  tpuwatch's worker-side protocol script                       (required)
#   tpuwatch-user           user the job runs as: the user tpuwatch connects as over SSH
#   tpuwatch-env            extra environment, one NAME='shell-quoted value' per line
#                           (only with [job] env_in_metadata = true)
#   tpuwatch-env-withheld   "true": [job] env is set but kept out of metadata, so only set
#                           up; the watcher starts the job over SSH
#   tpuwatch-command-withheld "true": [job] command looks like it holds a credential and is
#                           kept out of metadata, so only set up; the watcher starts the job
#   tpuwatch-checkpoint-dir [job] checkpoint_dir, exported as TPUWATCH_CHECKPOINT_DIR
#   tpuwatch-attempt        attempt number to launch; tpuwatch-checkpoint and
#   tpuwatch-checkpoint     tpuwatch-step are the newest complete checkpoint when
#   tpuwatch-step           the node was created (the job was not running then)
# You may add these under [tpu.spec.metadata]:
#   tpuwatch-setup          shell commands run before the job, as the job's user in its home
#                           (clone the code, `pip install -r requirements.txt`, ...); a
#                           failure stops the script before the job starts
#   tpuwatch-pip            arguments for `python3 -m pip install --user` (e.g. "-r ~/repo/req.txt")
#   tpuwatch-launch         "false": only set up; the watcher starts the job (`tpuwatch
#                           recreate` sets it when [job] checkpoint_dir is a path on the VM)
# The TPU VM provides agent-worker-number (this worker's index, 0 on worker 0).
#
# Which attempt starts at boot, so a reboot never rewinds the job: with tpuwatch-attempt, that
# attempt is launched unless this worker already ran it (then nothing starts; the watcher takes
# over). Without it, attempt 1 is launched on a fresh worker, and nothing on a worker that ran
# the job before (a reboot after maintenance): only the watcher knows the newest checkpoint then.
#
# Metadata server: http://metadata.google.internal/computeMetadata/v1 with the header
# `Metadata-Flavor: Google`. GCE_METADATA_HOST=host:port (the variable Google's client libraries
# honour) or TPUWATCH_METADATA_URL=<base URL> point it elsewhere, e.g. at a simulator;
# TPUWATCH_METADATA_RETRIES (default 5, one second apart) bounds retries while it is unreachable.
# Output goes to the boot log (`sudo journalctl -u google-startup-scripts`).
# Exit status: 0 launched, already running, or nothing to do; 1 a setting or setup failed.

set -u -o pipefail

MD_URL=${TPUWATCH_METADATA_URL:-http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1}
MD_URL=${MD_URL%/}

log() { printf 'resume-training: %s\n' "$*"; }

# md KEY: print the attribute; status 0 found, 1 absent (404), 2 metadata server unreachable.
md() {
  local out rc
  out=$(curl -sS -f --max-time 10 --retry "${TPUWATCH_METADATA_RETRIES:-5}" --retry-delay 1 --retry-connrefused \
    -H 'Metadata-Flavor: Google' "$MD_URL/instance/attributes/$1" 2>/dev/null)
  rc=$?
  case $rc in
    0) printf '%s' "$out"; return 0 ;;
    22) return 1 ;;  # HTTP error: 404 = no such attribute
    *) return 2 ;;
  esac
}

# get KEY VAR: VAR=value (empty when absent); exits when the server cannot be reached.
get() {
  local value rc
  value=$(md "$1")
  rc=$?
  if [ $rc = 2 ]; then
    log "cannot reach the metadata server at $MD_URL (reading $1)"
    exit 1
  fi
  printf -v "$2" '%s' "$value"
}

get tpuwatch-job JOB
get tpuwatch-command TEMPLATE
get tpuwatch-worker-script WORKER_SCRIPT
get tpuwatch-user RUN_USER
get tpuwatch-env ENV_LINES
get tpuwatch-checkpoint-dir CKPT_DIR
get tpuwatch-attempt ATTEMPT
get tpuwatch-checkpoint CHECKPOINT
get tpuwatch-step STEP
get tpuwatch-setup SETUP
get tpuwatch-pip PIP_ARGS
get tpuwatch-launch LAUNCH
get tpuwatch-env-withheld WITHHELD
get tpuwatch-command-withheld COMMAND_WITHHELD
get agent-worker-number WORKER

if [ -z "$WORKER" ]; then
  # TPU VM host names end in -w-<index>; a VM without the attribute is a single host.
  case $(hostname 2>/dev/null) in
    *-w-[0-9]*) WORKER=$(hostname); WORKER=${WORKER##*-w-} ;;
    *) WORKER=0 ;;
  esac
fi
case $WORKER in '' | *[!0-9]*) log "agent-worker-number is not a number: $WORKER"; exit 1 ;; esac

# Run as the job's user (the SSH user of the watcher) so ~/.tpuwatch/<job> is the directory the
# watcher probes. Startup scripts run as root; the account may still be in the making by the
# guest agent (from ssh-keys metadata) at boot, so wait for it a while, then create it.
as_user() {  # as_user CMD...: run CMD as RUN_USER with its HOME (or as we are)
  if [ "$(id -u)" = 0 ] && [ -n "$RUN_USER" ] && [ "$RUN_USER" != root ]; then
    local home
    home=$(getent passwd "$RUN_USER" | cut -d: -f6)
    (cd "$home" && runuser -u "$RUN_USER" -- env HOME="$home" USER="$RUN_USER" LOGNAME="$RUN_USER" "$@")
  else
    (cd "$HOME" && "$@")
  fi
}

if [ "$(id -u)" = 0 ] && [ -n "$RUN_USER" ] && [ "$RUN_USER" != root ]; then
  for _ in $(seq 1 60); do
    id -u "$RUN_USER" >/dev/null 2>&1 && break
    sleep 1
  done
  if ! id -u "$RUN_USER" >/dev/null 2>&1; then
    log "user $RUN_USER does not exist yet; creating it"
    useradd -m -s /bin/bash "$RUN_USER" || { log "cannot create user $RUN_USER"; exit 1; }
  fi
fi

if [ -n "$PIP_ARGS" ]; then
  log "pip install --user $PIP_ARGS"
  # shellcheck disable=SC2086  # the value is a list of pip arguments
  as_user bash -c "python3 -m pip install --user $PIP_ARGS" || { log "pip install failed"; exit 1; }
fi
if [ -n "$SETUP" ]; then
  log "running tpuwatch-setup"
  as_user bash -c "$SETUP" || { log "tpuwatch-setup failed (exit $?); not starting the job"; exit 1; }
fi

if [ "$LAUNCH" = false ]; then
  log "tpuwatch-launch is false: set up only; the watcher starts the job"
  exit 0
fi
if [ "$WITHHELD" = true ]; then
  log "the job's [job] env is kept out of the node's metadata (job.env_in_metadata = false): set up only; the watcher starts the job"
  exit 0
fi
if [ "$COMMAND_WITHHELD" = true ]; then
  log "the job's command looks like it holds a credential and is kept out of the node's metadata (job.command_in_metadata = false): set up only; the watcher starts the job"
  exit 0
fi
if [ -z "$JOB" ] || [ -z "$TEMPLATE" ] || [ -z "$WORKER_SCRIPT" ]; then
  log "no tpuwatch-job / tpuwatch-command / tpuwatch-worker-script metadata: nothing to launch"
  exit 0
fi
case $JOB in '' | . | .. | */*) log "bad tpuwatch-job: $JOB"; exit 1 ;; esac

if [ -z "$ATTEMPT" ]; then
  # shellcheck disable=SC2016  # $HOME and $1 are the user's shell's
  last=$(as_user bash -c 'cat "$HOME/.tpuwatch/$1/attempt" 2>/dev/null' _ "$JOB")
  if [ -n "$last" ]; then
    log "this worker ran attempt $last of $JOB before and no tpuwatch-attempt is set: leaving the restart to the watcher"
    exit 0
  fi
  ATTEMPT=1
fi
case $ATTEMPT in *[!0-9]* | '') log "tpuwatch-attempt is not a number: $ATTEMPT"; exit 1 ;; esac
# A checkpoint path (not gs://) from the old VM is here only if its disk was shared or kept
# (NFS, a data disk); on a new boot disk it is gone, and only the watcher, reading this VM, knows
# where to resume.
case $CHECKPOINT in
  '' | gs://*) ;;
  *) if ! as_user test -e "$CHECKPOINT"; then
       log "checkpoint $CHECKPOINT is not on this VM (a local checkpoint_dir does not outlive the VM's disk): set up only; the watcher starts the job"
       exit 0
     fi ;;
esac

# The launch request, exactly as tpuwatch sends it over SSH: TW_* assignments (each value one
# shell-quoted word) before remote.sh, in one { ... } group. The command template is rendered
# the way tpuwatch renders it: each placeholder becomes one shell-quoted word.
request=$(
  TEMPLATE=$TEMPLATE JOB=$JOB ATTEMPT=$ATTEMPT WORKER=$WORKER CHECKPOINT=$CHECKPOINT STEP=$STEP \
  ENV_LINES=$ENV_LINES CKPT_DIR=$CKPT_DIR python3 - <<'PY'
import os, shlex, string
e = os.environ
values = {"checkpoint": e["CHECKPOINT"], "step": e["STEP"] if e["CHECKPOINT"] else "",
          "attempt": e["ATTEMPT"], "worker": e["WORKER"]}
parts = []
for literal, name, spec, conv in string.Formatter().parse(e["TEMPLATE"]):
    parts.append(literal)
    if name is not None:
        parts.append(shlex.quote(values[name]))
env = ["TPUWATCH_CHECKPOINT_DIR=" + e["CKPT_DIR"]] if e["CKPT_DIR"] else []
for line in e["ENV_LINES"].splitlines():
    if "=" in line:
        name, _, quoted = line.partition("=")
        words = shlex.split(quoted) or [""]
        env.append(name + "=" + words[0])
q = shlex.quote
print("{")
print("TW_ACTION=launch")
print("TW_JOB=" + q(e["JOB"]))
print("TW_ATTEMPT=" + q(e["ATTEMPT"]))
print("TW_WORKER=" + q(e["WORKER"]))
print("TW_CHECKPOINT=" + q(e["CHECKPOINT"]))
print("TW_STEP=" + q(values["step"]))
print("TW_COMMAND=" + q("".join(parts)))
print("TW_ENV=(" + " ".join(q(x) for x in env) + ")")
PY
) || { log "cannot render the launch request (python3 missing or bad tpuwatch-command)"; exit 1; }

answer=$(printf '%s\n%s\n}\n' "$request" "$WORKER_SCRIPT" | as_user bash -s)
rc=$?
printf '%s\n' "$answer" | grep '^@tpuwatch ' | sed 's/^/resume-training: worker: /'
case $answer in
  *"result=launched"*) log "launched attempt $ATTEMPT of $JOB on worker $WORKER"; exit 0 ;;
  *"result=running"* | *"result=ran"* | *"result=newer"* | *"result=busy"*)
    log "attempt $ATTEMPT of $JOB not started here: the worker has it (or a newer one) already"; exit 0 ;;
  *) log "launch failed (exit $rc)"; exit 1 ;;
esac
