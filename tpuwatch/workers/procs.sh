# tpuwatch worker-side process helpers, shared by remote.sh and precheck.sh: sent in front of
# each (tpuwatch/workers/protocol.py), never run alone. Which processes are alive, which are our
# own shell and its ancestors (never signalled), and which hold a file open.
# shellcheck shell=bash

tw_stat() {  # sets TW_STATE TW_PPID TW_PGRP for pid $1 (no fork), or fails
  local s
  IFS= read -r s 2>/dev/null <"/proc/$1/stat" || return 1
  s=${s##*) }
  # shellcheck disable=SC2034  # TW_STATE and TW_PGRP are for the callers that want them
  read -r TW_STATE TW_PPID TW_PGRP _ <<<"$s"
}

tw_starttime() {  # sets TW_START to pid $1's start time (clock ticks after boot), or fails
  local s f
  IFS= read -r s 2>/dev/null <"/proc/$1/stat" || return 1
  s=${s##*) }
  read -r -a f <<<"$s"
  TW_START=${f[19]:-}
  [ -n "$TW_START" ]
}

# The processes of this host: every /proc/<pid>, or in the simulator, where the hosts share one
# machine, the ones its cgroup lists (TPUWATCH_SIM_PROCS), as a real VM shows only its own.
tw_procs() {  # array TW_PROCS := /proc/<pid> of every process of this host
  local ids=()
  if [ -n "${TPUWATCH_SIM_PROCS:-}" ] && [ -r "$TPUWATCH_SIM_PROCS" ] &&
    mapfile -t ids <"$TPUWATCH_SIM_PROCS" 2>/dev/null && [ ${#ids[@]} -gt 0 ]; then
    TW_PROCS=("${ids[@]/#//proc/}")
  else
    TW_PROCS=(/proc/[0-9]*)
  fi
}

tw_alive() {  # pid $1 exists and is not a zombie
  tw_stat "$1" || return 1
  case $TW_STATE in
    Z | X | x) return 1 ;;
  esac
  return 0
}

tw_ancestors=" "
tw_find_ancestors() {  # our own shell and everything above it: never signalled
  local p=$BASHPID
  tw_ancestors=" $$ $BASHPID "
  while [ -n "$p" ] && [ "$p" != 0 ] && [ "$p" != 1 ]; do
    tw_stat "$p" || break
    p=$TW_PPID
    tw_ancestors="$tw_ancestors$p "
  done
}

tw_glob_escape() {  # variable $1 := $2 with find -lname's wildcard characters made literal (no fork)
  local _tw_s=$2 _tw_o="" _tw_c
  while [ -n "$_tw_s" ]; do
    _tw_c=${_tw_s:0:1} _tw_s=${_tw_s:1}
    case $_tw_c in
      '[' | ']' | '*' | '?' | \\) _tw_o+="\\$_tw_c" ;;
      *) _tw_o+=$_tw_c ;;
    esac
  done
  printf -v "$1" '%s' "$_tw_o"
}

# A plain user cannot read other users' /proc/<pid>/fd: their device holders are invisible. Scan
# as root, or through `sudo -n` where it is allowed without a password, or else only our own
# processes, and say which in the result (device_scan=root|sudo|own).
tw_fd_scan=""
tw_scan_how() {
  [ -n "$tw_fd_scan" ] && return 0
  if [ "${EUID:-$(id -u)}" = 0 ]; then
    tw_fd_scan=root
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    tw_fd_scan=sudo
  else
    tw_fd_scan=own
  fi
}

tw_holders() {  # live pids (not us, not our ancestors) with an open fd matching a -lname glob
  local args=() g line p out=" " find=(find)
  tw_scan_how
  [ "$tw_fd_scan" = sudo ] && find=(sudo -n find)
  for g in "$@"; do
    [ ${#args[@]} -gt 0 ] && args+=(-o)
    args+=(-lname "$g")
  done
  [ ${#args[@]} -gt 0 ] || return 0
  tw_procs
  # No find when the host has no process but us and our ancestors (a host just booted, as its
  # cgroup shows it in the simulator): none of them holds a device. Ends at the first other.
  g=""
  for p in "${TW_PROCS[@]#/proc/}"; do
    case "$tw_ancestors$BASHPID " in *" $p "*) ;; *) g=1 && break ;; esac
  done
  [ -n "$g" ] || return 0
  while IFS= read -r line; do
    p=${line#/proc/}
    p=${p%%/*}
    case $p in '' | *[!0-9]*) continue ;; esac
    case "$tw_ancestors$out" in *" $p "*) continue ;; esac
    tw_alive "$p" || continue
    out="$out$p "
  done < <("${find[@]}" "${TW_PROCS[@]/%//fd}" -mindepth 1 -maxdepth 1 \( "${args[@]}" \) -print 2>/dev/null)
  out=${out# }
  printf '%s' "${out% }"
}

tw_is_ours() {  # pid $1 runs with TPUWATCH_JOB=$TW_JOB in its environment
  local e=() v  # its NUL-separated entries read by bash itself: no tr, no fork
  mapfile -d '' -t e <"/proc/$1/environ" 2>/dev/null || return 1
  for v in "${e[@]}"; do
    [ "$v" = "TPUWATCH_JOB=$TW_JOB" ] && return 0
  done
  return 1
}
