# tpuwatch worker-side script (docs/design.md, "Worker-side protocol").
#
# Shipped inside the package and sent over the SSH connection on every call, on the stdin of
# the worker's bash (protocol.REMOTE_COMMAND reads it whole, framed by its length, then runs
# it): nothing is installed on the workers. tpuwatch.workers.protocol wraps it in one
# `{ ... }` group with a preamble of shell-quoted TW_* assignments: a connection dropped
# mid-upload runs nothing.
#
# Per job, under ~/.tpuwatch/<job>/ (directories 0700, files 0600):
#   lock             flock held by every process of the running attempt (inherited fd 9);
#                    a launch is refused while anything holds it
#   attempt          number of the newest attempt launched here
#   pid              the attempt's wrapper: session and process-group leader (setsid)
#   boot             the boot id of this host when the attempt was launched: once the host has
#                    booted again, nothing of the attempt can be alive, and no scan of /proc
#                    needs to look for it
#   exit_code        written by the wrapper when the command ends
#   attempt-<n>.log  stdout+stderr of attempt n
#   maintenance      written by the relay when the metadata server gave notice (JSON: what, when,
#                    window, attempt, signal); removed at each launch
#   stop             the attempt tpuwatch's own stop is signalling, written before its TERM
#   term             the attempt whose wrapper got a TERM that neither tpuwatch's stop nor the relay
#                    sent (the guest shutting down, say), written before exit_code; removed at each launch
# Host paths (/dev/accel*, /dev/vfio/*, /tmp/libtpu_lockfile, /proc/sys/kernel/random/boot_id) are looked up under
# $TPUWATCH_HOST_ROOT when it is set (the simulator), else under /.
#
# Inputs (preamble): TW_ACTION probe|launch|stop|follow|wait, TW_JOB, and per action TW_ATTEMPT,
# TW_WORKER (its id within its slice), TW_SLICE, TW_SLICES (launch: a multislice job's slice and number of slices), TW_CHECKPOINT, TW_STEP, TW_COMMAND (already rendered), TW_ENV (array NAME=value),
# TW_GRACE_MS (stop's TERM-to-KILL grace), TW_DETACH (stop: 1 = TERM and return, a detached
# process KILLs what is left after the grace), TW_CLEAN_MS (launch: run stop first, with this
# grace, when an older attempt or none was launched here), TW_OFFSET (bytes), TW_POLL (seconds),
# TW_NOTIFY (launch: the signal the relay sends on a notice, such as TERM; empty for none),
# TW_CKPT_DIR (probe, and wait's probe requests: the local checkpoint directory to list).
# Output: lines "@tpuwatch key=value" on stdout (stderr for follow, whose stdout is the log);
# everything else (a chatty .bashrc, say) is ignored by tpuwatch.
# This script knows nothing of the cloud, of nodes or of other workers.
# shellcheck shell=bash

# tpuwatch's own files are private; the job itself runs with the login's umask (TW_UMASK), as
# it would if started by hand, so the files it writes are as readable as the user expects.
# Only a launch needs it: `$(umask)` costs a fork, and every call runs this. Linux (4.7 on)
# shows it in /proc/<pid>/status, as umask prints it: read there without a fork.
TW_UMASK=""
if [ "${TW_ACTION:-}" = launch ]; then
  while IFS=$' \t' read -r tw_key TW_UMASK; do
    [ "$tw_key" = Umask: ] && break
    TW_UMASK=""
  done 2>/dev/null <"/proc/$BASHPID/status"
  case $TW_UMASK in [0-7][0-7][0-7][0-7]) ;; *) TW_UMASK=$(umask) ;; esac
fi
umask 077

tw_emit() {
  local kv
  for kv in "$@"; do
    kv=${kv//$'\n'/ }
    printf '@tpuwatch %s\n' "$kv"
  done
}

tw_num() {  # variable $1 := the whole number on the first line of file $2, else empty
  # No command substitution, so no fork: a probe and every follow channel's loop read these
  # files, and a simulated pod runs hundreds of them on one machine.
  local _tw_v=
  if [ -f "$2" ]; then
    IFS= read -r _tw_v <"$2" 2>/dev/null
  fi
  case $_tw_v in
    '' | *[!0-9]*) _tw_v= ;;
  esac
  printf -v "$1" '%s' "$_tw_v"
}

tw_words() {  # variable $1 := the words of $2, separated by single spaces (no fork)
  local IFS=$' \t\n' _tw_w=()
  read -r -a _tw_w <<<"$2"
  printf -v "$1" '%s' "${_tw_w[*]}"
}

tw_write() {  # replace file $1 by the line $2 atomically (readers never see half a file)
  printf '%s\n' "$2" >"$1.tmp.$$" && mv -f -- "$1.tmp.$$" "$1"
}

tw_now_ms() {
  local t
  t=$(date +%s%N 2>/dev/null)
  case $t in
    *N | '') printf '%s000' "$(date +%s)" ;;
    *) printf '%s' "${t:0:${#t}-6}" ;;
  esac
}

tw_sleep() { sleep "$1" 2>/dev/null || sleep 1; }

tw_nap() {  # sleep $1 seconds without a process each time: a read that times out on a pipe no
  # one writes (opened once, by one fork); `sleep` where that pipe cannot be had
  if [ -z "${TW_NAP_FD:-}" ] && ! { exec {TW_NAP_FD}<> <(:); } 2>/dev/null; then
    tw_sleep "$1"
    return 0
  fi
  read -r -t "$1" -u "$TW_NAP_FD" _ 2>/dev/null
  return 0
}

# ---- processes ------------------------------------------------------------------------------
# Liveness is read from /proc/<pid>/stat, never from `kill -0`: an orphan that exits stays a
# zombie until init reaps it, and some containers' init never does.

tw_session_members() {  # live pids whose session or process group is $1
  # Every /proc/<pid>/stat in one pass (cat goes on past a pid that vanished), filtered by awk:
  # a read per process in bash costs ~0.1 ms, which a machine of thousands of processes feels.
  # The fields after the last ") " (the command name may hold both): state ppid pgrp session.
  tw_procs
  cat "${TW_PROCS[@]/%//stat}" 2>/dev/null | awk -v s="$1" '
    $1 ~ /^[0-9]+$/ {
      r = $0
      while ((j = index(r, ") ")) > 0) r = substr(r, j + 2)
      if (split(r, f, " ") >= 4 && f[1] !~ /^[ZXx]$/ && (f[3] == s || f[4] == s)) printf "%s ", $1
    }'
}

tw_wait_gone() {  # wait up to $1 ms for all pids in $2 to die; prints the survivors
  local deadline left p
  deadline=$(($(tw_now_ms) + $1))
  while :; do
    left=""
    for p in $2; do
      tw_alive "$p" && left="$left$p "
    done
    if [ -z "$left" ] || [ "$(tw_now_ms)" -ge "$deadline" ]; then
      break
    fi
    tw_sleep 0.1
  done
  printf '%s' "${left% }"
}

tw_signal() {  # signal $1 to pids $2; a process group -$3 first when given (atomic for it)
  local p
  if [ -n "${3:-}" ]; then
    kill "-$1" -- "-$3" 2>/dev/null
  fi
  for p in $2; do
    if [ -n "${3:-}" ] && tw_stat "$p" && [ "$TW_PGRP" = "$3" ]; then
      continue  # already signalled through its group
    fi
    kill "-$1" "$p" 2>/dev/null || sudo -n kill "-$1" "$p" 2>/dev/null
  done
}

tw_terminate() {  # TERM pids $2 (and group $3), wait $1 ms, KILL the rest. Adds to TW_KILLED
  # the pids that needed KILL and to TW_LEFT those alive even after it.
  local left
  [ -n "$2" ] || return 0
  tw_signal TERM "$2" "${3:-}"
  left=$(tw_wait_gone "$1" "$2")
  [ -n "$left" ] || return 0
  TW_KILLED="$TW_KILLED $left"
  tw_signal KILL "$left" "${3:-}"
  TW_LEFT="$TW_LEFT $(tw_wait_gone 5000 "$left")"
}

tw_killer() {  # detached: after $1 ms, KILL each "pid:starttime" of $2 still alive as that process
  local deadline left ps
  deadline=$(($(tw_now_ms) + $1))
  while :; do
    left=""
    for ps in $2; do
      tw_alive "${ps%%:*}" && tw_starttime "${ps%%:*}" && [ "$TW_START" = "${ps#*:}" ] && left="$left$ps "
    done
    [ -n "$left" ] || return 0
    [ "$(tw_now_ms)" -lt "$deadline" ] || break
    tw_sleep 0.2
  done
  for ps in $left; do
    kill -KILL "${ps%%:*}" 2>/dev/null || sudo -n kill -KILL "${ps%%:*}" 2>/dev/null
  done
}

tw_kill_same() {  # TERM each "pid:starttime" of $@ that is still that process: a pid that went
  # to another process since is left alone
  local ps
  for ps in "$@"; do
    [ -n "${ps#*:}" ] && tw_starttime "${ps%%:*}" && [ "$TW_START" = "${ps#*:}" ] && kill "${ps%%:*}" 2>/dev/null
  done
  return 0
}

tw_terminate_later() {  # TERM pids $2 (and group $3) now; a detached killer KILLs the ones
  # still alive after $1 ms, so the caller need not wait. Adds to TW_STOPPING those alive a
  # moment after TERM (the start time tells a pid reused meanwhile from the process it was).
  local left p starts=""
  [ -n "$2" ] || return 0
  tw_signal TERM "$2" "${3:-}"
  left=$(tw_wait_gone 500 "$2")
  [ -n "$left" ] || return 0
  for p in $left; do
    tw_starttime "$p" && starts="$starts$p:$TW_START "
  done
  TW_STOPPING="$TW_STOPPING $left"
  setsid nohup bash -c "$(declare -f tw_stat tw_alive tw_starttime tw_now_ms tw_sleep tw_killer); tw_killer \"\$@\"" \
    tpuwatch-killer "$(($1 > 500 ? $1 - 500 : 0))" "$starts" </dev/null >/dev/null 2>&1 8>&- 9>&- &
}

# ---- the job directory ----------------------------------------------------------------------

tw_need() {
  local t
  for t in "$@"; do
    if ! command -v "$t" >/dev/null 2>&1; then
      tw_emit result=error "detail=$t is not installed on this worker (tpuwatch needs $*)"
      return 1
    fi
  done
}

tw_lock_held() {  # some process holds the job lock (probing takes a shared lock for an instant)
  local rc=1
  [ -z "${TW_HELD:-}" ] || return 0  # a follow channel's helper is still waiting for it (the wait action)
  [ -e "$TW_DIR/lock" ] || return 1
  { flock -n -s 8; rc=$?; } 8<"$TW_DIR/lock" 2>/dev/null
  [ "$rc" -ne 0 ]
}

tw_boot_id() {  # variable $1 := this host's boot id (the kernel makes a new one at every boot), else empty
  local _tw_b="" _tw_f="${TPUWATCH_HOST_ROOT:-}"
  _tw_f="${_tw_f%/}/proc/sys/kernel/random/boot_id"
  [ -r "$_tw_f" ] && IFS= read -r _tw_b <"$_tw_f" 2>/dev/null
  printf -v "$1" '%s' "$_tw_b"
}

tw_older_boot() {  # the attempt in $TW_DIR was launched before this host last booted, so none
  # of its processes can be alive (a pid in its files may belong to anything now)
  local was="" now
  [ -f "$TW_DIR/boot" ] && IFS= read -r was <"$TW_DIR/boot" 2>/dev/null
  [ -n "$was" ] || return 1
  tw_boot_id now
  [ -n "$now" ] && [ "$was" != "$now" ]
}

tw_attempt_alive() {  # a process of the current attempt lives: lock holder or pid's session
  # (a scan of every process); none when the host has booted since the launch
  local pid members p
  tw_older_boot && return 1
  tw_lock_held && return 0
  tw_num pid "$TW_DIR/pid"
  [ -n "$pid" ] || return 1
  members=$(tw_session_members "$pid")
  for p in $members; do
    tw_is_ours "$p" && return 0
  done
  return 1
}

# ---- actions --------------------------------------------------------------------------------

tw_notice() {  # variable $1 := what the relay passed on to attempt $2 (TERMINATE_ON_HOST_MAINTENANCE,
  # PREEMPTED), else empty; no fork
  local m=
  [ -f "$TW_DIR/maintenance" ] && IFS= read -r m <"$TW_DIR/maintenance" 2>/dev/null
  printf -v "$1" '%s' ""
  if [[ $m == *"\"attempt\": $2,"* && $m =~ \"what\":\ \"([A-Z_]+)\" ]]; then
    printf -v "$1" '%s' "${BASH_REMATCH[1]}"
  fi
}

# Known runtime signatures (TW_SIGS: extended regular expressions, from [recovery] log_signatures
# and the built-ins): each probe searches only what attempt $2's log gained since the last one
# (from TW_SCAN_BACK bytes before, so a line cut by the last read is read whole; at most
# TW_SCAN_MAX bytes), and the first matching line is kept in attempt-<n>.match, so a probe costs
# one grep of the growth and nothing once a line matched. Variable $1 := that line, else empty.
TW_SCAN_BACK=4096
TW_SCAN_MAX=4194304
tw_scan() {
  local log="$TW_DIR/attempt-$2.log" mark="$TW_DIR/attempt-$2.scan" hit="$TW_DIR/attempt-$2.match"
  local size=$3 off="" from line="" re args=() LC_ALL=C  # C: the cut below counts bytes
  printf -v "$1" '%s' ""
  if [ -f "$hit" ]; then
    IFS= read -r line <"$hit" 2>/dev/null
    printf -v "$1" '%s' "$line"
    return 0
  fi
  [ "${#TW_SIGS[@]}" -gt 0 ] && [ "$size" -gt 0 ] || return 0  # nothing to search
  tw_num off "$mark"
  # The mark is written in place, not by tw_write's mv: a probe that reads it half-written
  # searches from an earlier offset, which only searches some bytes again.
  if [ -n "$off" ] && [ "$size" -le "$off" ]; then
    [ "$size" -lt "$off" ] && printf '%s\n' "$size" >"$mark"  # the log was cut: search it from there
    return 0
  fi
  from=$((${off:-0} - TW_SCAN_BACK))
  [ "$from" -lt $((size - TW_SCAN_MAX)) ] && from=$((size - TW_SCAN_MAX))
  [ "$from" -lt 0 ] && from=0
  for re in "${TW_SIGS[@]}"; do args+=(-e "$re"); done
  # Bytes past `size` (written since the stat) are searched now and again next time: harmless.
  # grep reads the log itself when the search starts at its first byte (no tail), and the first
  # 400 bytes of its line are cut here (no head).
  if [ "$from" = 0 ]; then
    line=$(LC_ALL=C grep -a -m 1 -E "${args[@]}" -- "$log" 2>/dev/null)
  else
    line=$(tail -c "+$((from + 1))" -- "$log" 2>/dev/null | LC_ALL=C grep -a -m 1 -E "${args[@]}" 2>/dev/null)
  fi
  line=${line:0:400}
  line=${line//$'\r'/}
  printf '%s\n' "$size" >"$mark"
  if [ -n "$line" ]; then
    tw_write "$hit" "$line"
    printf -v "$1" '%s' "$line"
  fi
}

tw_probe() {
  local attempt pid code state detail="" size="" notice="" st mtime now age="" match="" lingering="" term=""
  if [ ! -d "$TW_DIR" ]; then
    tw_emit result=ok state=absent "detail=no job directory"
    if [ -n "${TW_CKPT_DIR:-}" ]; then tw_ckpt_listing; fi
    return 0
  fi
  tw_num attempt "$TW_DIR/attempt"
  tw_num pid "$TW_DIR/pid"
  tw_num code "$TW_DIR/exit_code"
  state=""
  if [ -z "$code" ]; then
    if tw_attempt_alive; then
      state=running
    else  # the wrapper writes the exit code before it exits: one written since the first look is
      tw_num code "$TW_DIR/exit_code"  # there now (else a command that just ended reads as killed)
    fi
  fi
  if [ -n "$state" ]; then
    :
  elif [ -n "$code" ]; then
    state=exited
    if tw_attempt_alive; then
      lingering=1 detail="the command ended but some of its processes live on"
    fi
  elif [ -n "$attempt" ]; then
    state=absent
    detail="attempt $attempt left no exit code and no process (killed, or the host rebooted)"
  else
    state=absent
    detail="never launched"
  fi
  # The log's size and age (seconds since its last write, by this worker's clock) tell
  # tpuwatch whether a running attempt still says anything (hang detection); its new bytes are
  # searched for known runtime signatures.
  if [ -n "$attempt" ]; then
    st=$(stat -c '%s %Y' -- "$TW_DIR/attempt-$attempt.log" 2>/dev/null) || st=""
    case $st in
      *' '*)
        size=${st% *} mtime=${st#* }
        printf -v now '%(%s)T' -1
        age=$((now > mtime ? now - mtime : 0))
        tw_scan match "$attempt" "$size"
        ;;
    esac
      tw_notice notice "$attempt"
    tw_num term "$TW_DIR/term"
    if [ "$term" = "$attempt" ]; then term=foreign; else term=""; fi
  fi
  tw_emit result=ok "state=$state" "attempt=$attempt" "pid=$pid" "exit_code=$code" "log_bytes=$size" \
    "log_age=$age" "log_match=$match" "notice=$notice" "sigterm=$term" "lingering=$lingering" "detail=$detail"
  if [ -n "${TW_CKPT_DIR:-}" ]; then tw_ckpt_listing; fi
}

# A local job.checkpoint_dir is on the worker, not on the watcher's machine: the probe of the
# first worker lists it (one level, and one level of each entry: the checkpoint markers) as
# one line of JSON, `ckpt_listing=...`; tpuwatch.checkpoints applies its layout rules to that.
tw_ckpt_listing() {
  local out
  if ! command -v python3 >/dev/null 2>&1; then
    tw_emit "ckpt_error=python3 not found on the worker, needed to read $TW_CKPT_DIR"
    return 0
  fi
  # Under $TPUWATCH_HOST_ROOT (the simulator's VM disk) when it is there, else as given (a
  # mount the watcher shares, or a real VM).
  # -S: no site import (a third of its start-up); the listing needs the standard library only.
  out=$(python3 -S - "$TW_CKPT_DIR" "${TPUWATCH_HOST_ROOT:-}" <<'TW_PY' 2>&1
import json, os, sys
root = sys.argv[1]
if sys.argv[2] and os.path.isdir(sys.argv[2] + root):
    root = sys.argv[2] + root
MAX_ENTRIES, MAX_READ = 2000, 65536
def level(path):
    out = {}
    with os.scandir(path) as it:
        for i, e in enumerate(it):
            if i >= MAX_ENTRIES:
                break
            try:
                d = e.is_dir()
                out[e.name] = None if d else e.stat().st_mtime
            except OSError:
                continue
    return out
dirs, reads = {}, {}
try:
    dirs[""] = level(root)
except FileNotFoundError:
    print(json.dumps({"exists": False}))
    sys.exit(0)
except OSError as exc:
    print(json.dumps({"error": f"cannot list {root}: {exc.strerror}"}))
    sys.exit(0)
if dirs[""].get("checkpoints", 0) is None:
    try:
        dirs["checkpoints"] = level(os.path.join(root, "checkpoints"))
    except OSError:
        pass
for base in list(dirs):
    for name, mtime in list(dirs[base].items()):
        if mtime is not None:
            continue
        rel = f"{base}/{name}" if base else name
        try:
            dirs[rel] = level(os.path.join(root, rel))
        except OSError:
            continue
        meta = os.path.join(root, rel, "metadata.json")
        if dirs[rel].get("metadata.json") is not None:
            try:
                with open(meta, "rb") as f:
                    reads[rel + "/metadata.json"] = f.read(MAX_READ).decode("utf-8", "replace")
            except OSError:
                pass
print(json.dumps({"exists": True, "dirs": dirs, "reads": reads}, separators=(",", ":")))
TW_PY
  ) || true
  case $out in
    '{'*) tw_emit "ckpt_listing=$out" ;;
    *) tw_emit "ckpt_error=listing $TW_CKPT_DIR failed: ${out:0:300}" ;;
  esac
}

# The relay: beside the command for its whole life, it waits on this worker's metadata server
# (wait_for_change on instance/, so no polling load) for the notice Google gives shortly before it
# stops the VM, and passes it on. Three keys carry one: instance/maintenance-event turning to
# TERMINATE_ON_HOST_MAINTENANCE (about 60 s ahead; Compute Engine fills it only for VMs set to
# migrate or with a GPU), instance/upcoming-maintenance whose maintenance status turns to ONGOING
# (where the Cloud TPU documentation points TPU VMs; read as Compute Engine documents it, with
# ?alt=json, in any of the spellings maintenance_status / maintenanceStatus / maintenance-status),
# and instance/preempted turning to TRUE (spot, about 30 s). An ONGOING already there at the first
# look is passed on only once it has gone and come back: a notice left over from a finished
# maintenance must not end every new attempt at once. On a notice it writes $dir/maintenance for
# jobs that poll a file, and sends signal $3 (none when empty) to the attempt's process group $2,
# so a job that saves on SIGTERM (Orbax, PyTorch/XLA) saves before the host stops.
# Each look is the directory query, then the three keys, one connection each over bash's own
# /dev/tcp (HTTP/1.0: the answer ends with the connection), no process started: a curl costs
# ~6 ms of CPU to start, and a relaunched pod starts one relay a host, each looking twice at
# once (the first look, then the wait). Where bash cannot connect there (no such host, a bash
# built without /dev/tcp), the answer is not plain HTTP/1.x, or it is not a 200 before any came
# that way, curl looks instead, one curl a look. When the directory query fails twice in a row it
# reads the keys alone, every $poll seconds, for the rest of the attempt. When the keys do not answer either and nothing
# ever answered (not a Compute Engine VM), it says so in the log and ends.
tw_relay() {
  local dir=$1 group=$2 sig=$3 attempt=$4 base etag="" q fails=0 keys="" first=1 stale="" ev pre um poll=2 codes
  local what window ongoing='[Mm]aintenance[_-]?[Ss]tatus"?[[:space:]]*:[[:space:]]*"?ONGOING'
  local out="$dir/.relay.$BASHPID" line hetag  # curl's files: $out.h (headers), .1-.3 (keys), .codes
  local mhost=${GCE_METADATA_HOST:-metadata.google.internal} mport=80 tcp=1 tcp_ok=""
  exec 9>&-  # not the job: the relay never holds the job's lock
  base="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance"
  case $mhost in  # host[:port] for /dev/tcp; a bare IPv6 address or anything odd: curl only
    *[!A-Za-z0-9.:-]* | *:*:* | '') tcp="" ;;
    *:*) mport=${mhost##*:} mhost=${mhost%:*} ;;
  esac
  case $mport in '' | *[!0-9]*) tcp="" ;; esac
  TW_CURL=""
  trap '[ -n "$TW_CURL" ] && kill "$TW_CURL" 2>/dev/null; rm -f -- "$out".*; exit 0' TERM INT
  tw_get() {  # GET $base/$1 over /dev/tcp within $2 seconds: tw_code (000: no answer in time),
    # tw_etag and, with $3, the body in tw_body. Fails, with nothing decided, where curl must look.
    # The answer is read in two `read -N` (bash reads a socket a byte at a time; a `read -t` per
    # line costs twice as much): its first byte, then up to 4 KB more, the headers and a key's
    # short body, to the end of the connection (HTTP/1.0, Connection: close), or by its
    # Content-Length where a server kept it open 2 s. A directory's longer body is not read.
    local fd first="" resp="" raw head rc LC_ALL=C
    tw_code=000 tw_etag="" tw_body=""
    [ -n "$tcp" ] || return 1
    { exec {fd}<>"/dev/tcp/$mhost/$mport"; } 2>/dev/null || return 1
    if ! printf 'GET /computeMetadata/v1/instance/%s HTTP/1.0\r\nHost: %s\r\nMetadata-Flavor: Google\r\nConnection: close\r\n\r\n' \
      "$1" "${GCE_METADATA_HOST:-metadata.google.internal}" >&"$fd"; then
      exec {fd}>&-
      return 1
    fi
    IFS= read -r -N 1 -t "$2" -u "$fd" first  # a wait_for_change waits here
    [ $? -gt 128 ] && { exec {fd}>&-; return 0; }  # no answer in time, as curl's --max-time
    IFS= read -r -N 4095 -t 2 -u "$fd" resp
    rc=$?
    exec {fd}>&-
    resp=$first$resp raw=$first$resp
    resp=${resp//$'\r'/}
    head=${resp%%$'\n\n'*}
    [ "$head" != "$resp" ] || return 1  # cut short, or headers past 4 KB
    if [ "$rc" -gt 128 ]; then  # the connection stayed open: whole by its Content-Length, else curl
      [[ $head =~ $'\n'[Cc]ontent-[Ll]ength:\ *([0-9]+) ]] || return 1
      rc=${BASH_REMATCH[1]} first=${raw%%$'\r\n\r\n'*}
      [ "${#raw}" -ge $((${#first} + 4 + rc)) ] || return 1
    fi
    [[ $head =~ ^HTTP/1\.[01]\ ([0-9][0-9][0-9])([[:space:]]|$) ]] || return 1
    rc=${BASH_REMATCH[1]}
    # until a 200 came this way, any other answer is curl's to judge (a server refusing HTTP/1.0
    # must not pass for no metadata server)
    [ "$rc" = 200 ] && tcp_ok=1
    [ -n "$tcp_ok" ] || return 1
    [[ $head =~ $'\n'[Tt]ransfer-[Ee]ncoding: ]] && return 1  # chunked (not HTTP/1.0): curl reads it
    [[ $head =~ $'\n'[Ee][Tt][Aa][Gg]:\ *([^[:space:]]+) ]] && tw_etag=${BASH_REMATCH[1]}
    if [ -n "${3:-}" ]; then
      [ "${#resp}" -lt 4096 ] || return 1  # a body past 4 KB: not a key's
      tw_body=${resp#*$'\n\n'}
    fi
    tw_code=$rc
    return 0
  }
  tw_look() {  # with $1, the directory query $base/$1 first ($2 seconds at most), then the
    # three keys. codes := the HTTP statuses of the directory query and the keys (000: no
    # answer); hetag := the directory query's ETag; ev, pre, um := each key's value when it
    # answered 200 (um: the whole body on one line)
    local k=0 key dcode=-
    ev="" pre="" um="" codes=() hetag=""
    if [ -n "$1" ]; then
      tw_get "$1" "$2" || { tw_curl_look "$@"; return 0; }
      dcode=$tw_code hetag=$tw_etag
    fi
    for key in maintenance-event preempted "upcoming-maintenance?alt=json"; do
      k=$((k + 1))
      tw_get "$key" 10 body || { tw_curl_look ""; codes[0]=$dcode; return 0; }
      codes[k]=$tw_code
      [ "$tw_code" = 200 ] || continue
      case $k in
        1) ev=${tw_body%%$'\n'*} ;;
        2) pre=${tw_body%%$'\n'*} ;;
        3) um=${tw_body//$'\n'/} ;;
      esac
    done
    codes[0]=$dcode
    return 0
  }
  tw_curl_look() {  # tw_look with one curl, as a child so that TERM ends both at once
    local each=(-sS --connect-timeout 5 -H 'Metadata-Flavor: Google' -w '%{http_code}\n') dirq=()
    [ -n "$1" ] && dirq=("${each[@]}" --max-time "$2" -D "$out.h" -o /dev/null "$base/$1" --next)
    ev="" pre="" um="" codes=() hetag=""
    command -v curl >/dev/null 2>&1 || { codes=("${1:+000}" 000 000 000); codes[0]=${codes[0]:--}; return 0; }
    curl "${dirq[@]}" "${each[@]}" --max-time 10 \
      -o "$out.1" "$base/maintenance-event" -o "$out.2" "$base/preempted" \
      -o "$out.3" "$base/upcoming-maintenance?alt=json" >"$out.codes" 2>/dev/null &
    TW_CURL=$!
    wait "$TW_CURL"
    TW_CURL=""
    mapfile -t codes <"$out.codes" 2>/dev/null
    [ -n "$1" ] || codes=(- "${codes[@]}")
    [ "${codes[1]:-}" = 200 ] && { IFS= read -r ev <"$out.1" || :; }
    [ "${codes[2]:-}" = 200 ] && { IFS= read -r pre <"$out.2" || :; }
    if [ "${codes[3]:-}" = 200 ]; then
      while IFS= read -r line || [ -n "$line" ]; do um+=$line; done <"$out.3"
    fi
    if [ -n "$1" ] && [ -f "$out.h" ]; then  # the last ETag header, read without a fork
      while IFS= read -r line; do
        [[ $line =~ ^[Ee][Tt][Aa][Gg]:\ *([^[:space:]]+) ]] && hetag=${BASH_REMATCH[1]}
      done <"$out.h"
    fi
    return 0
  }
  if [ -z "$tcp" ] && ! command -v curl >/dev/null 2>&1; then
    echo "tpuwatch: curl is not installed: maintenance notices are not relayed to the job"
    return 0
  fi
  while :; do
    [ -d "/proc/$group" ] || return 0  # the attempt's wrapper is gone (killed): nothing to tell
    if [ -z "$keys" ]; then
      # The first look is at once; then anything under instance/ changing wakes us, and last_etag
      # makes a change between two waits count.
      q="?recursive=true"
      case $etag in
        '') ;;
        -) q="$q&wait_for_change=true&timeout_sec=60" ;;  # no ETag given: wait for a change from now
        *) q="$q&wait_for_change=true&timeout_sec=60&last_etag=$etag" ;;
      esac
      tw_look "$q" 75
      if [ "${codes[0]:-}" = 200 ]; then
        fails=0
        etag=${hetag:--}
      else
        fails=$((fails + 1))
        if [ "$fails" -lt 2 ]; then
          tw_sleep 1
          continue
        fi
        if [ "${codes[1]:-}" = 200 ] || [ "${codes[2]:-}" = 200 ]; then
          keys=1
          echo "tpuwatch: the metadata server does not answer the directory query instance/?recursive=true:" \
            "watching maintenance-event, upcoming-maintenance and preempted one by one every ${poll}s"
        elif [ -z "$etag" ]; then
          echo "tpuwatch: no metadata server at ${base%/instance}: maintenance notices are not relayed"
          rm -f -- "$out".*
          return 0
        else
          tw_sleep 1  # it answered before: ask again
          continue
        fi
      fi
    else
      tw_look ""
    fi
    what=""
    if [ "$ev" = TERMINATE_ON_HOST_MAINTENANCE ]; then
      what=$ev
    elif [ "$pre" = TRUE ]; then
      what=PREEMPTED
    elif [[ $um =~ $ongoing ]]; then
      [ -n "$first" ] && stale=1
      [ -z "$stale" ] && what=MAINTENANCE_ONGOING
    else
      stale=""
    fi
    first=""
    [ -n "$what" ] && break
    [ -n "$keys" ] && tw_sleep "$poll"
  done
  window=$um
  case $window in '{'*'}') ;; *) window=null ;; esac
  case $window in *'"error"'*) window=null ;; esac
  rm -f -- "$out".*
  tw_write "$dir/maintenance" "{\"what\": \"$what\", \"when\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"attempt\": $attempt, \"signal\": \"${sig:+SIG$sig}\", \"window\": $window}"
  echo "tpuwatch: the metadata server says $what: ${sig:+sending SIG$sig to the job and }wrote $dir/maintenance"
  if [ -n "$sig" ]; then
    trap '' "$sig"  # the relay is in the group it signals
    kill -s "$sig" -- "-$group" 2>/dev/null
  fi
  return 0
}

# The wrapper: the attempt's session leader. It runs the command in the foreground so TERM
# (trapped here, default in the command) reaches the command, then records its exit code.
# The relay runs beside it and is ended before the exit code is written. A TERM to the session
# that neither tpuwatch's stop (its `stop` file) nor the relay (its `maintenance` file) sent is
# recorded in `term` first: a job that saves on SIGTERM and exits 0 when the guest shuts down
# has not finished, though its code says so.
tw_wrapper() {
  local dir=$1 rc mask=${3:-} relay termed="" by="" m=""
  tw_write "$dir/pid" "$$"
  trap 'termed=1' TERM
  trap ':' INT
  case $mask in
    [0-7][0-7][0-7] | [0-7][0-7][0-7][0-7]) ;;
    *) mask=0022 ;;
  esac
  # Its own process, without TPUWATCH_JOB: it never counts as the attempt being alive (its
  # environment is the exec's; unset in this subshell, not by an `env` process).
  (
    unset TPUWATCH_JOB
    exec bash -c 'tw_relay "$@"' tpuwatch-relay "$dir" "$$" "${4:-}" "${5:-0}"
  ) &
  relay=$!
  # The job does not get our functions (the launch exported them to this shell and the relay).
  (umask "$mask" && export -fn tw_write tw_sleep tw_relay tw_wrapper && exec bash -c "$2")
  rc=$?
  kill -TERM "$relay" 2>/dev/null
  wait "$relay" 2>/dev/null
  if [ -n "$termed" ]; then
    [ -f "$dir/stop" ] && IFS= read -r by <"$dir/stop" 2>/dev/null
    [ -f "$dir/maintenance" ] && IFS= read -r m <"$dir/maintenance" 2>/dev/null
    if [ "$by" != "${5:-0}" ] && [[ $m != *"\"attempt\": ${5:-0},"* ]]; then
      tw_write "$dir/term" "${5:-0}"
    fi
  fi
  tw_write "$dir/exit_code" "$rc"
  exit "$rc"
}

tw_launch() {
  local cur pid code log i
  tw_need flock setsid awk || return 1
  # shellcheck disable=SC2174  # both directories are named, so both get the mode when made
  [ -d "$TW_DIR" ] || mkdir -p -m 700 -- "$HOME/.tpuwatch" "$TW_DIR" || {
    tw_emit result=error "detail=cannot create $TW_DIR"
    return 1
  }
  # With TW_CLEAN_MS, first clean up what an older attempt left (its processes, device
  # holders, a stale libtpu lockfile) in this same connection, reported as cleanup_* fields.
  # Never when this attempt (or a newer one) was launched here: that is not left over.
  tw_num cur "$TW_DIR/attempt"
  if [ -n "${TW_CLEAN_MS:-}" ] && { [ -z "$cur" ] || [ "$cur" -lt "$TW_ATTEMPT" ]; }; then
    TW_GRACE_MS=$TW_CLEAN_MS TW_STOP_PREFIX=cleanup_ tw_stop
  fi
  exec 9>>"$TW_DIR/lock" || {
    tw_emit result=error "detail=cannot open $TW_DIR/lock"
    return 1
  }
  # Waiting a moment lets a concurrent probe's instant shared lock pass; a live attempt
  # holds the lock for its whole life, so this still refuses it.
  if ! flock -w 0.5 9; then
    exec 9>&-
    tw_num cur "$TW_DIR/attempt"
    tw_num code "$TW_DIR/exit_code"
    tw_num pid "$TW_DIR/pid"
    if [ "$cur" = "$TW_ATTEMPT" ] && [ -z "$code" ]; then
      tw_emit result=running "attempt=$cur" "pid=$pid"
    else
      tw_emit result=busy "attempt=$cur" "pid=$pid" "exit_code=$code" \
        "detail=processes of attempt ${cur:-?} still hold $TW_DIR/lock; stop them first"
    fi
    return 0
  fi
  tw_num cur "$TW_DIR/attempt"
  if [ -n "$cur" ] && [ "$cur" -ge "$TW_ATTEMPT" ]; then
    exec 9>&-
    if [ "$cur" = "$TW_ATTEMPT" ]; then
      tw_num code "$TW_DIR/exit_code"
      tw_emit result=ran "attempt=$cur" "exit_code=$code"
    else
      tw_emit result=newer "attempt=$cur"
    fi
    return 0
  fi
  rm -f -- "$TW_DIR/exit_code" "$TW_DIR/pid" "$TW_DIR/boot" "$TW_DIR/maintenance" "$TW_DIR/term" \
    "$TW_DIR/stop" "$TW_DIR"/attempt-*.scan "$TW_DIR"/attempt-*.match
  local boot
  tw_boot_id boot
  [ -z "$boot" ] || tw_write "$TW_DIR/boot" "$boot"
  tw_write "$TW_DIR/attempt" "$TW_ATTEMPT" || {
    exec 9>&-
    tw_emit result=error "detail=cannot write $TW_DIR/attempt"
    return 1
  }
  log="$TW_DIR/attempt-$TW_ATTEMPT.log"
  : >>"$log"
  # One chmod for the directories (700) and the files (600): X is search for a directory only.
  # The attempt file is new (tw_write), made 600 by the umask.
  chmod u=rwX,go= -- "$HOME/.tpuwatch" "$TW_DIR" "$log" "$TW_DIR/lock" 2>/dev/null
  # Detached: its own session (setsid), HUP ignored (as nohup does: an ignored signal stays
  # ignored through exec), stdin not the SSH channel, output to the log. It inherits fd 9, so
  # the lock is held as long as any process of it lives.
  # TW_LIBTPU_ADD (a multislice job's abort-on-hang flags): appended to the LIBTPU_INIT_ARGS the
  # job would get ([job] env's, else this login's), each only when that value does not name it.
  local libtpu=() lib_args=${LIBTPU_INIT_ARGS-} e f
  if [ "${#TW_LIBTPU_ADD[@]}" -gt 0 ]; then
    for e in "${TW_ENV[@]}"; do
      case $e in LIBTPU_INIT_ARGS=*) lib_args=${e#LIBTPU_INIT_ARGS=} ;; esac
    done
    for f in "${TW_LIBTPU_ADD[@]}"; do
      case " $lib_args" in *" ${f%%=*}="* | *" ${f%%=*} "* | *" ${f%%=*}") ;; *) lib_args="${lib_args:+$lib_args }$f" ;; esac
    done
    libtpu=("LIBTPU_INIT_ARGS=$lib_args")
  fi
  (
    trap '' HUP
    trap - PIPE  # the job gets SIGPIPE as usual (the launch ignores it)
    local jobenv=("${libtpu[@]}" \
      "TPUWATCH_JOB=$TW_JOB" "TPUWATCH_ATTEMPT=$TW_ATTEMPT" "TPUWATCH_WORKER_ID=$TW_WORKER" \
      "TPUWATCH_SLICE_ID=${TW_SLICE:-0}" "TPUWATCH_NUM_SLICES=${TW_SLICES:-1}" \
      "TPUWATCH_CHECKPOINT=$TW_CHECKPOINT" "TPUWATCH_STEP=$TW_STEP")
    # The wrapper's and the relay's functions go to them in the environment (exported, the job
    # never gets them): a `$(declare -f ...)` forks a shell each. env and setsid pass them on
    # (a POSIX sh in between would drop them: BASH_FUNC_<name>%% is no sh variable name).
    export -f tw_write tw_sleep tw_relay tw_wrapper
    local jobrun=(setsid bash -c 'tw_wrapper "$@"' \
      tpuwatch-job "$TW_DIR" "$TW_COMMAND" "$TW_UMASK" "${TW_NOTIFY:-}" "$TW_ATTEMPT")
    if [ ${#TW_ENV[@]} -eq 0 ]; then  # our own names only, none of them readonly: no `env` process
      export "${jobenv[@]}"
      exec "${jobrun[@]}"
    fi
    exec env -- "${TW_ENV[@]}" "${jobenv[@]}" "${jobrun[@]}"
  ) </dev/null >>"$log" 2>&1 &
  exec 9>&-
  pid=""
  for ((i = 0; i < 100; i++)); do
    tw_num pid "$TW_DIR/pid"
    [ -n "$pid" ] && break
    tw_nap 0.05
  done
  tw_emit result=launched "attempt=$TW_ATTEMPT" "pid=$pid"
}

tw_stop() {
  local pid="" members="" group="" p ours="" holders="" lockf elock lstate=absent
  local grace=${TW_GRACE_MS:-30000}
  TW_KILLED="" TW_LEFT="" TW_STOPPING=""
  tw_find_ancestors
  tw_scan_how
  tw_need flock awk || return 1
  if [ -d "$TW_DIR" ]; then
    local older=""  # the host booted since the launch: nothing of the attempt lives or holds its lock
    tw_older_boot && older=1
    tw_num pid "$TW_DIR/pid"
    if [ -n "$pid" ] && [ -z "$older" ]; then
      # The attempt's session, only while it is still ours (the lock is held, or a member
      # carries our TPUWATCH_JOB): a pid reused by another program never gets a signal.
      members=$(tw_session_members "$pid")
      if [ -n "$members" ]; then
        if tw_lock_held; then
          ours=$members
        else
          for p in $members; do
            if tw_is_ours "$p"; then ours=$members; break; fi
          done
        fi
        [ -n "$ours" ] && group=$pid
      fi
    fi
    # Processes that left the session but still hold the job lock are the job's too. They
    # share the open file the launch locked, so while nothing holds the lock none exists.
    if [ -z "$older" ] && tw_lock_held; then
      tw_glob_escape elock "$TW_DIR/lock"
      for p in $(tw_holders "$elock"); do
        case " $ours " in *" $p "*) ;; *) ours="$ours $p" ;; esac
      done
    fi
    tw_words ours "$ours"
    if [ -n "$ours" ]; then  # marked before the TERM: the wrapper tells this stop from the guest's
      local cur
      tw_num cur "$TW_DIR/attempt"
      tw_write "$TW_DIR/stop" "$cur"
    fi
    if [ -n "$ours" ] && [ "${TW_DETACH:-0}" = 1 ]; then
      # Nothing waits on this stop: TERM now, KILL after the grace without holding the caller.
      tw_terminate_later "$grace" "$ours" "$group"
      tw_words TW_STOPPING "$TW_STOPPING"
      tw_emit "result=ok" "stopped=$ours" "stopping=$TW_STOPPING" "grace_ms=$grace"
      return 0
    elif [ -n "$ours" ]; then
      tw_terminate "$grace" "$ours" "$group"
    fi
  fi
  # Orphans still holding the TPU: /dev/accel* (v2-v4) and /dev/vfio/* (v5+).
  local root=${TPUWATCH_HOST_ROOT:-} eroot
  root=${root%/}
  if [ -n "$root" ]; then  # its real path, without a fork (cd there and back)
    local here=$PWD
    if builtin cd -P -- "$root" 2>/dev/null; then
      root=$PWD
      builtin cd -- "$here" 2>/dev/null || :
    else
      root=${TPUWATCH_HOST_ROOT%/}
    fi
  fi
  tw_glob_escape eroot "$root"
  holders=$(tw_holders "$eroot/dev/accel*" "$eroot/dev/vfio/*")
  if [ -n "$holders" ]; then
    tw_terminate "$grace" "$holders"
  fi
  # A crashed libtpu leaves its lockfile; stale when no live process has it open or locked.
  lockf="$root/tmp/libtpu_lockfile"
  if [ -e "$lockf" ] || [ -L "$lockf" ]; then
    local lholders rc=1 elockf
    tw_glob_escape elockf "$lockf"
    lholders=$(tw_holders "$elockf")
    if [ -z "$lholders" ]; then
      { flock -n 7; rc=$?; } 7<"$lockf" 2>/dev/null
      [ -L "$lockf" ] && rc=0
    fi
    if [ -z "$lholders" ] && [ "$rc" = 0 ]; then
      if rm -f -- "$lockf" 2>/dev/null || sudo -n rm -f -- "$lockf" 2>/dev/null; then
        lstate=removed
      else
        lstate="stale, cannot remove"
      fi
    else
      lstate="held${lholders:+ by $lholders}"
    fi
  fi
  local left k=${TW_STOP_PREFIX:-} result=ok
  tw_words left "$TW_LEFT"
  tw_words TW_KILLED "$TW_KILLED"
  [ -z "$left" ] || result=leftover
  tw_emit "${k}result=$result" "${k}stopped=$ours" \
    "${k}device_holders=$holders" "${k}device_scan=$tw_fd_scan" "${k}libtpu_lockfile=$lstate" "${k}leftover=$left" \
    "${k}killed=$TW_KILLED" "${k}grace_ms=$grace"
}

tw_follow() {
  # Stream attempt-<n>.log from byte TW_OFFSET until the attempt ends; the exit code goes to
  # stderr as "@tpuwatch exit_code=N". Polling file sizes (not `tail --pid`) keeps working when
  # the wrapper is a zombie nobody reaps.
  local log="$TW_DIR/attempt-$TW_ATTEMPT.log" off=${TW_OFFSET:-0} size code cur final=0
  local poll=${TW_POLL:-0.2} parent
  tw_stat "$BASHPID" && parent=$TW_PPID
  tw_num cur "$TW_DIR/attempt"
  if [ "$cur" != "$TW_ATTEMPT" ] || [ ! -f "$log" ]; then
    tw_emit result=error "detail=attempt $TW_ATTEMPT is not the current attempt here (${cur:-none})" >&2
    return 3
  fi
  while :; do
    size=$(stat -c %s -- "$log" 2>/dev/null) || size=$off
    if [ "$size" -gt "$off" ]; then
      tail -c "+$((off + 1))" -- "$log" | head -c "$((size - off))" || return 4
      off=$size
      continue
    fi
    [ $final = 1 ] && break
    tw_num code "$TW_DIR/exit_code"
    tw_num cur "$TW_DIR/attempt"
    if [ -n "$code" ] || [ "$cur" != "$TW_ATTEMPT" ] || ! tw_attempt_alive; then
      final=1  # one more read: the last output may have landed just before the exit code
      continue
    fi
    # Reparented: the SSH session is gone, nobody reads us any more.
    if tw_stat "$BASHPID" && [ "$TW_PPID" != "$parent" ]; then
      return 5
    fi
    tw_sleep "$poll"
  done
  # Read them again: the attempt may have written its exit code and ended between the reads
  # above and the liveness check that ended the loop.
  tw_num code "$TW_DIR/exit_code"
  tw_num cur "$TW_DIR/attempt"
  if [ "$cur" != "$TW_ATTEMPT" ]; then
    tw_emit result=replaced "attempt=$cur" >&2
  elif [ -n "$code" ]; then
    tw_emit result=ok "exit_code=$code" >&2
  else
    tw_emit result=gone "detail=attempt $TW_ATTEMPT ended without an exit code" >&2
  fi
}

tw_wait() {
  # Return the moment attempt TW_ATTEMPT ends here: "@tpuwatch result=ok exit_code=N" (it
  # ended with a code), "result=gone" (it died without one: killed, say), "result=replaced"
  # (a newer attempt was launched). Until then it answers requests, one line each on its stdin,
  # which the watcher keeps open: "probe <seq> <0|1>" runs tw_probe (1: with the checkpoint
  # listing of TW_CKPT_DIR) between "@tpuwatch probe_begin=<seq>" and "probe_end=<seq>" lines.
  #
  # One read waits for both, so each is answered at once: fd 7 is a pipe written by two helpers,
  # a `flock -s` on the job lock (every process of the attempt holds it) that says "free" when
  # nothing of the attempt holds it any more, and a `cat` of stdin (the requests), followed by
  # "closed" when stdin closes (sshd closes it with the channel: this shell ends then too). A
  # trapped signal cannot wake the read instead: outside POSIX mode bash runs the trap and
  # restarts `read -t`. Every TW_POLL seconds the read times out to look at the exit code (a
  # command whose orphans keep the lock has still ended).
  local code cur poll=${TW_POLL:-1} line part="" seq list helper="" reader="" free=0 rc
  tw_num cur "$TW_DIR/attempt"
  if [ "$cur" != "$TW_ATTEMPT" ] || [ ! -e "$TW_DIR/lock" ]; then
    tw_emit result=replaced "attempt=$cur"
    return 0
  fi
  if tw_older_boot; then  # the host booted since the launch: the attempt is over, no helper
    tw_num code "$TW_DIR/exit_code"  # need watch its lock (after a maintenance, every channel)
    if [ -n "$code" ]; then
      tw_emit result=ok "exit_code=$code"
    else
      tw_emit result=gone "detail=attempt $TW_ATTEMPT ended without an exit code"
    fi
    return 0
  fi
  tw_need flock || return 1
  exec 6<&0
  # The helpers' stderr is not the channel's: the channel closes when this shell ends.
  # The reader says who the helpers are before it copies a byte: a request already waiting on
  # stdin can never come first and be taken for that line (its number for a pid to end).
  exec 7< <(
    exec 2>/dev/null
    flock -s -o "$TW_DIR/lock" printf 'free\n' &
    helper=$!
    {
      printf 'helpers %s %s\n' "$helper" "$BASHPID"
      exec cat <&6
    } &
    wait "$!"
    printf 'closed\n'
  ) || return 1
  while IFS=' ' read -r line helper reader <&7; do  # a free lock may say so first
    [ "$line" = helpers ] && break
    [ "$line" = free ] && free=1
    helper="" reader=""
  done
  # Ended at the close by pid and start time: either may have ended by then and its pid gone to
  # another process (the reader ends with stdin; a busy host reuses pids within seconds).
  local helpers=()
  tw_starttime "$helper" && helpers+=("$helper:$TW_START")
  tw_starttime "$reader" && helpers+=("$reader:$TW_START")
  printf '@tpuwatch wait_ready=%s\n' "$TW_ATTEMPT"  # the watcher asks only channels that said so
  while :; do
    tw_num code "$TW_DIR/exit_code"
    tw_num cur "$TW_DIR/attempt"
    if [ "$cur" != "$TW_ATTEMPT" ]; then
      tw_emit result=replaced "attempt=$cur"
      break
    fi
    if [ -n "$code" ]; then
      tw_emit result=ok "exit_code=$code"
      break
    fi
    # The lock is free (or its helper was killed, by a stop say): over unless a process of
    # the attempt closed the lock's fd but lives on, which is looked at again every TW_POLL.
    if { [ $free = 1 ] || ! tw_alive "$helper"; } && ! tw_attempt_alive; then
      tw_num code "$TW_DIR/exit_code"  # written just before the wrapper exited, since the read above
      if [ -n "$code" ]; then
        tw_emit result=ok "exit_code=$code"
      else
        tw_emit result=gone "detail=attempt $TW_ATTEMPT ended without an exit code"
      fi
      break
    fi
    if IFS= read -r -t "$poll" -u 7 line; then
      line=$part$line part=
      case $line in
        free) free=1 ;;
        closed) break ;;
        'probe '*)
          list=${line#probe }
          seq=${list%% *} list=${list#"$seq"}
          case $seq in '' | *[!0-9]*) continue ;; esac
          printf '@tpuwatch probe_begin=%s\n' "$seq"
          # The helper still waiting for its shared lock says the attempt holds it: the probe
          # need not fork a flock of its own to learn that.
          TW_HELD=""
          [ $free = 0 ] && tw_alive "$helper" && TW_HELD=1
          if [ "$list" = ' 1' ]; then tw_probe; else TW_CKPT_DIR='' tw_probe; fi
          TW_HELD=""
          printf '@tpuwatch probe_end=%s\n' "$seq"
          ;;
      esac
    else
      rc=$?
      [ "$rc" -gt 128 ] || break  # the end of the pipe: nobody asks any more
      # Timed out: what it read of a line so far (bash keeps it) is the start of the next one.
      part=$part$line
    fi
  done
  tw_kill_same "${helpers[@]}"
  return 0
}

tw_main() {
  case ${TW_JOB:-} in
    '' | . | .. | */*)
      tw_emit result=error "detail=bad job name"
      return 2
      ;;
  esac
  TW_DIR="$HOME/.tpuwatch/$TW_JOB"
  case ${TW_ACTION:-} in
    probe) tw_probe ;;
    launch)
      # Once the script is here the launch happens even if the channel closes under it (a
      # watcher killed mid-cleanup): a report nobody reads fails its write instead of killing
      # the script with SIGPIPE between the cleanup and the launch.
      trap '' PIPE
      tw_launch || return
      trap - PIPE
      # With TW_THEN_WAIT the session goes on as the attempt's follow channel: one session for
      # both, and the rest of stdin holds the wait's requests.
      if [ -n "${TW_THEN_WAIT:-}" ]; then
        printf '@tpuwatch launch_end=%s\n' "$TW_ATTEMPT"
        tw_wait
        exit
      fi
      ;;
    stop) tw_stop ;;
    follow) tw_follow ;;
    wait) tw_wait; exit ;;  # stdin holds requests, not more script
    *)
      tw_emit result=error "detail=unknown action ${TW_ACTION:-}"
      return 2
      ;;
  esac
}

tw_main
