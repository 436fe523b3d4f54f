# tpuwatch worker-side environment checks (docs/precheck.md; docs/design.md, "Worker-side protocol").
#
# Shipped inside the package and sent over the SSH connection on the stdin of the worker's
# bash (tpuwatch.workers.protocol.REMOTE_COMMAND), like remote.sh: nothing is installed on the
# workers. tpuwatch.workers.precheck wraps it in one `{ ... }` group behind shell-quoted TW_*
# assignments, framed by its length, so a truncated upload runs nothing.
# shellcheck shell=bash
#
# It MEASURES and reports; it decides nothing. Thresholds are applied by tpuwatch (precheck.py),
# so one config drives every worker and a change of threshold needs no change here.
#
# Inputs (preamble):
#   TW_JOB             job name (its processes carry TPUWATCH_JOB=<job>: "ours", not foreign)
#   TW_CHECKS          built-in checks to run, space separated
#   TW_CACHE_PATH      the cache/data path whose free space is measured ("" = none)
#   TW_PEERS           array: the other workers' addresses, resolved by the dns check
#   TW_INTERPRETER     the job's interpreter word ("" = none found in the command)
#   TW_ENV             array NAME=value: the job's [job] env, applied to interpreter and custom
#   TW_CUSTOM_NAME, TW_CUSTOM_CMD, TW_CUSTOM_TIMEOUT   arrays: [[precheck.custom]] checks
# Output: one line per check on stdout, `@tpuwatch-check id=<id>` then TAB-separated key=value
# fields (no TAB or newline inside a value), then `@tpuwatch-check-end`. Other lines (a chatty
# .bashrc) are ignored by tpuwatch.
#
# Host paths (/, /dev/shm, /dev/accel*, /dev/vfio/*, /tmp/libtpu_lockfile) are looked up under
# $TPUWATCH_HOST_ROOT when it is set (the simulator), else under /.
# TPUWATCH_SIM_HOSTS (simulator only, never set on a real VM): a hosts(5) file that the dns
# check reads instead of asking the system resolver, because the simulated workers of one
# machine share that machine's resolver and cannot each lose DNS on their own.

umask 077
export LC_ALL=C

twp_emit() {  # twp_emit ID key=value ...: each value's TABs and newlines made spaces (no fork)
  local line="@tpuwatch-check id=$1" kv
  shift
  for kv in "$@"; do
    kv=${kv//$'\t'/ }
    kv=${kv//$'\n'/ }
    kv=${kv//$'\r'/ }
    line+=$'\t'$kv
  done
  printf '%s\n' "$line"
}

twp_wants() {
  case " $TW_CHECKS " in *" $1 "*) return 0 ;; esac
  return 1
}

twp_root=${TPUWATCH_HOST_ROOT:-}
twp_root=${twp_root%/}
if [ -n "$twp_root" ]; then
  twp_root=$(cd -- "$twp_root" 2>/dev/null && pwd -P) || twp_root=${TPUWATCH_HOST_ROOT%/}
fi

twp_size="" twp_free=""
twp_df() {  # twp_df PATH: twp_size, twp_free := bytes of the filesystem holding PATH, or fails
  local out size avail
  out=$(df -P -k -- "$1" 2>/dev/null) || return 1
  # Its last line: Filesystem 1024-blocks Used Available Capacity Mounted-on
  read -r _ size _ avail _ <<<"${out##*$'\n'}"
  case "$size$avail" in '' | *[!0-9]*) return 1 ;; esac
  twp_size=$((size * 1024)) twp_free=$((avail * 1024))
}

twp_space() {  # twp_space ID PATH [SHOWN]: the free and total space of PATH's filesystem
  local id=$1 path=$2 shown=${3:-$2}
  if ! twp_df "$path"; then
    twp_emit "$id" "path=$shown" "error=cannot measure $shown (df failed: missing or not mounted)"
    return
  fi
  twp_emit "$id" "path=$shown" "size=$twp_size" "free=$twp_free"
}

twp_dirname() {  # variable $1 := dirname(1) of $2, without its fork
  local _twp_d=$2
  while [[ $_twp_d == */ && $_twp_d != / ]]; do _twp_d=${_twp_d%/}; done
  case $_twp_d in */*) _twp_d=${_twp_d%/*} ;; *) _twp_d=. ;; esac
  while [[ $_twp_d == */ ]]; do _twp_d=${_twp_d%/}; done
  printf -v "$1" '%s' "${_twp_d:-/}"
}

# ---- disk, shm, cache -----------------------------------------------------------------------

twp_disk() { twp_space disk "$twp_root/" /; }

twp_shm() {
  local p="$twp_root/dev/shm"
  if [ ! -d "$p" ]; then
    twp_emit shm "path=/dev/shm" "error=/dev/shm does not exist"
    return
  fi
  twp_space shm "$p" /dev/shm
}

twp_cache() {
  local p=${TW_CACHE_PATH:-} q
  if [ -z "$p" ]; then
    twp_emit cache "skip=no precheck.cache_path configured"
    return
  fi
  # shellcheck disable=SC2088  # a literal ~ in the configured path, expanded here
  case $p in "~") p=$HOME ;; "~/"*) p="$HOME/${p#"~/"}" ;; esac
  # A cache that does not exist yet fills the filesystem of its nearest existing parent.
  q=$p
  while [ ! -e "$q" ] && [ "$q" != / ] && [ -n "$q" ]; do
    twp_dirname q "$q"
  done
  if [ "$q" != "$p" ]; then
    if ! twp_df "$q"; then
      twp_emit cache "path=$p" "error=cannot measure $q"
      return
    fi
    twp_emit cache "path=$p" "size=$twp_size" "free=$twp_free" "note=$p does not exist yet; measured $q"
    return
  fi
  twp_space cache "$p"
}

# ---- ulimit ---------------------------------------------------------------------------------

twp_ulimit() {
  # Soft limits of this login, which is the kind of session the job is launched from.
  twp_emit ulimit "open_files=$(ulimit -S -n 2>/dev/null)" "locked_memory_kb=$(ulimit -S -l 2>/dev/null)" \
    "processes=$(ulimit -S -u 2>/dev/null)" "stack_kb=$(ulimit -S -s 2>/dev/null)"
}

# ---- dns ------------------------------------------------------------------------------------

twp_lookup() {  # twp_lookup NAME-OR-ADDRESS -> first "address name" answer, or fails
  local out
  if [ -n "${TPUWATCH_SIM_HOSTS:-}" ]; then
    # simulator only (see the header): the same answer shape as `getent hosts`
    [ -r "$TPUWATCH_SIM_HOSTS" ] || return 2
    out=$(awk -v q="$1" '$1 !~ /^#/ { for (i = 1; i <= NF; i++) if ($i == q) { print $1, $2; exit } }' \
      "$TPUWATCH_SIM_HOSTS" 2>/dev/null)
  else
    out=$(timeout 3 getent hosts "$1" 2>/dev/null | head -n 1)
  fi
  [ -n "$out" ] || return 2
  printf '%s' "$out"
}

twp_dns() {
  local peer ans name ok=0 bad="" n=${#TW_PEERS[@]}
  if [ "$n" = 0 ]; then
    twp_emit dns "skip=a single-host node has no peers to resolve"
    return
  fi
  for peer in "${TW_PEERS[@]}"; do
    # Reverse (address -> host name), then forward again (name -> address): what MPI-style
    # launchers and the job's own code do when they name their peers.
    if ! ans=$(twp_lookup "$peer"); then
      bad="$bad, $peer (no name)"
      continue
    fi
    read -r _ name <<<"$ans"
    if [ -z "$name" ] || [ "$name" = "$peer" ]; then
      ok=$((ok + 1))
      continue
    fi
    if ! twp_lookup "$name" >/dev/null; then
      bad="$bad, $peer ($name does not resolve)"
      continue
    fi
    ok=$((ok + 1))
  done
  twp_emit dns "resolved=$ok" "peers=$n" "failed=${bad#, }"
}

# ---- devices, holders, libtpu lockfile ------------------------------------------------------

twp_devices=()
twp_find_devices() {  # the chips' device files: /dev/accel<n> (v2-v4), /dev/vfio/<n> (v5+)
  local f
  twp_devices=()
  for f in "$twp_root"/dev/accel[0-9]* "$twp_root"/dev/vfio/[0-9]*; do
    [ -e "$f" ] && twp_devices+=("$f")
  done
}

twp_devices() {
  local f names=""
  for f in "${twp_devices[@]}"; do
    names="$names ${f#"$twp_root"}"
  done
  twp_emit devices "count=${#twp_devices[@]}" "found=${names# }"
}

twp_holders() {  # live pids (not us) with an open fd on one of the given paths
  local globs=() f g
  for f in "$@"; do
    tw_glob_escape g "$f"
    globs+=("$g")
  done
  tw_holders "${globs[@]}"
}

twp_describe_pids() {  # variable $1 := "pid:comm pid:comm" for pids $2 (no fork)
  local p _twp_c _twp_o=""
  for p in $2; do
    _twp_c=""
    IFS= read -r -d '' _twp_c <"/proc/$p/comm" 2>/dev/null
    _twp_o="$_twp_o $p:${_twp_c//$'\n'/}"
    [[ $_twp_o == *: ]] && _twp_o+="?"
  done
  printf -v "$1" '%s' "${_twp_o# }"
}

twp_device_holders() {
  local holders p ours="" foreign=""
  holders=$(twp_holders "${twp_devices[@]}")
  for p in $holders; do
    if tw_is_ours "$p"; then ours="$ours $p"; else foreign="$foreign $p"; fi
  done
  twp_describe_pids foreign "$foreign"
  twp_emit device_holders "ours=${ours# }" "foreign=$foreign" "scan=$tw_fd_scan"
}

twp_libtpu_lock() {
  local f="$twp_root/tmp/libtpu_lockfile" holders rc=1 state
  if [ ! -e "$f" ] && [ ! -L "$f" ]; then
    twp_emit libtpu_lock "state=absent" "path=${f#"$twp_root"}"
    return
  fi
  holders=$(twp_holders "$f")
  if [ -z "$holders" ]; then
    # Nobody has it open; a flock taken by a process that closed it cannot exist, so the
    # lock is free unless someone holds it right now.
    { flock -n 7; rc=$?; } 7<"$f" 2>/dev/null
    [ -L "$f" ] && rc=0
    if [ "$rc" = 0 ]; then state=stale; else state=locked; fi
  else
    state=held
  fi
  local p ours="" foreign=""
  for p in $holders; do
    if tw_is_ours "$p"; then ours="$ours $p"; else foreign="$foreign $p"; fi
  done
  twp_describe_pids foreign "$foreign"
  twp_emit libtpu_lock "state=$state" "path=${f#"$twp_root"}" "ours=${ours# }" \
    "foreign=$foreign"
}

# ---- the job's interpreter ------------------------------------------------------------------

twp_interpreter() {
  local w=${TW_INTERPRETER:-} path version
  if [ -z "$w" ]; then
    twp_emit interpreter "skip=no python interpreter named in job.command"
    return
  fi
  # shellcheck disable=SC2088  # a literal ~ in the configured name, expanded here
  case $w in "~/"*) w="$HOME/${w#"~/"}" ;; esac
  # shellcheck disable=SC2016  # $1 is the inner shell's
  path=$(env -- "${TW_ENV[@]}" bash -c 'command -v -- "$1"' _ "$w" 2>/dev/null)
  if [ -z "$path" ] || [ ! -x "$path" ]; then
    twp_emit interpreter "name=$w" "found=" "error=$w is not installed here (not on PATH or not executable)"
    return
  fi
  version=$(env -- "${TW_ENV[@]}" timeout 10 "$path" -S -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null | head -n 1)
  twp_emit interpreter "name=$w" "found=$path" "version=$version"
}

# ---- custom checks --------------------------------------------------------------------------

twp_custom() {
  local i n=${#TW_CUSTOM_NAME[@]} out rc last start end
  [ "$n" -gt 0 ] || return 0
  out=$(mktemp "${TMPDIR:-/tmp}/tpuwatch-precheck.XXXXXX") || out=/dev/null
  for ((i = 0; i < n; i++)); do
    start=$(date +%s%N)
    # `timeout` runs it in a process group of its own and signals the whole group, so a hang
    # kills every process it started (TERM, then KILL a second later); its output goes to a
    # file, so a child left running in the background cannot hold our stdout open.
    env -- "${TW_ENV[@]}" timeout -k 1 "${TW_CUSTOM_TIMEOUT[$i]}" \
      bash -c "${TW_CUSTOM_CMD[$i]}" </dev/null >"$out" 2>&1
    rc=$?
    end=$(date +%s%N)
    last=$(tail -c 2000 -- "$out" 2>/dev/null | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c 1-200)
    twp_emit "custom:${TW_CUSTOM_NAME[$i]}" "exit_code=$rc" "timeout=${TW_CUSTOM_TIMEOUT[$i]}" \
      "elapsed_ms=$(((end - start) / 1000000))" "output=$last"
  done
  [ "$out" = /dev/null ] || rm -f -- "$out"
}

twp_main() {
  tw_find_ancestors
  tw_scan_how  # here, not in the holders' $(...) subshells, which would keep tw_fd_scan to themselves
  twp_find_devices
  twp_wants disk && twp_disk
  twp_wants shm && twp_shm
  twp_wants cache && twp_cache
  twp_wants ulimit && twp_ulimit
  twp_wants dns && twp_dns
  twp_wants devices && twp_devices
  twp_wants device_holders && twp_device_holders
  twp_wants libtpu_lock && twp_libtpu_lock
  twp_wants interpreter && twp_interpreter
  twp_custom
  printf '@tpuwatch-check-end\n'
}

twp_main
