"""Find the newest *complete* checkpoint under a job's `checkpoint_dir` (absolute path or gs://).

This module holds the name grammar of each checkpoint layout, the rule that says when a step
is complete, and two tiny stores (local filesystem, Google Cloud Storage) that can list one
level of a directory and look at one object. It must not know about SSH, workers, the policy
or the journal, and it never hands a name to a shell: names are data, returned verbatim.

Layouts and when a step counts as complete (docs/design.md, "Checkpoint layouts"):

- orbax: `<step>/` or `<prefix>_<step>/` (e.g. `step_100`; zero padding allowed). Temporary
  names `<name>.orbax-checkpoint-tmp` and `…-tmp-<timestamp|counter>` are never chosen. On
  GCS Orbax writes in place, so a step is complete only when `commit_success.txt` exists
  (Orbax's own rule) — unless the user switched Orbax to atomic-rename temporary paths, which
  write no commit file: when *no* step of the directory has `commit_success.txt`, a final
  (non-temporary) name with `_CHECKPOINT_METADATA` is complete, as locally. Locally Orbax renames the temporary directory when it finishes, but a
  plain name alone cannot tell a finished save from a half-copied directory, so a local step
  is complete when it has `commit_success.txt` or `_CHECKPOINT_METADATA` (recent Orbax writes
  the latter into every step, the former on every backend). Only when *no* step of the
  directory carries either marker (an older Orbax that wrote none) does a plain `<step>/`
  holding at least one item subdirectory count by its name alone, as in Orbax's own rule;
  prefixed names always need a marker. MaxText is Orbax under
  `<run>/checkpoints/<step>/items`; pointing at `<run>` also works (we descend into
  `checkpoints/` once).
- flax: `checkpoint_<step>` written as a file under `checkpoint_tmp` and renamed (complete by
  existing), or as an Orbax directory (Orbax rules). `checkpoint_<step>_gda/` holds
  multi-process arrays and counts with its base; alone it is an unfinished save.
- t5x: `checkpoint_<step>/` is complete only when its `checkpoint` file exists (written last);
  `checkpoint_<step>.tmp-<ts>/` is never chosen.
- levanter: `step-<n>/` is complete only when `metadata.json` exists and parses (Levanter
  writes it in the commit callback, after every array). Its `is_temporary` flag marks
  *retention* (a time-based save that Levanter deletes once the next one commits), not
  completeness: Levanter's own discovery resumes from such a checkpoint, and skipping it
  would throw away the progress made since the last permanent save.
- pytorch_xla: `<step>/` is complete only when `.manager_metadata` exists (the
  torch_xla CheckpointManager writes it after the distributed save).

Auto-detection looks at the names present and tries every layout whose grammar matches;
a `<step>/` directory is Orbax or PyTorch/XLA by its markers, a `checkpoint_<step>/` directory
is T5X when it has a `checkpoint` file and Flax (Orbax-backed) otherwise.

Cost on GCS: one prefix+delimiter listing of `checkpoint_dir` (pages of 1000 names), then for
each candidate, newest first, one or two single-object reads of its markers, stopping at the
first committed one (in a directory with no commit file at all, every step is looked at once). Nothing is ever listed recursively. (google-cloud-storage 3.x also makes
one background `buckets.get` per client for its tracing attributes; that is the library's.)
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from tpuwatch.errors import CloudError, ConfigError, NotFoundError
from tpuwatch.model import Checkpoint

LAYOUTS = ("orbax", "flax", "t5x", "levanter", "pytorch_xla")
LAYOUT_CHOICES = ("auto", *LAYOUTS)

DIR_KEY = "job.checkpoint_dir"
LAYOUT_KEY = "job.checkpoint_layout"

ORBAX_COMMIT = "commit_success.txt"
ORBAX_METADATA = "_CHECKPOINT_METADATA"
T5X_COMMIT = "checkpoint"
LEVANTER_COMMIT = "metadata.json"
PTXLA_COMMIT = ".manager_metadata"
MAXTEXT_SUBDIR = "checkpoints"
_METADATA_LIMIT = 1 << 20  # a Levanter metadata.json is ~100 bytes; refuse to read a huge one

# Name grammar. Order matters: temporary names first, then the most specific families.
_ORBAX_TMP = re.compile(r"^(?P<base>.+?)\.orbax-checkpoint-tmp(?:-\d+)?$", re.S)
_T5X_TMP = re.compile(r"^checkpoint_(?P<step>\d+)\.tmp-\d+$")
_FLAX_TMP = re.compile(r"^checkpoint_tmp(?:_gda)?$")
_FLAX_GDA = re.compile(r"^checkpoint_(?P<step>\d+)_gda$")
_CHECKPOINT_N = re.compile(r"^checkpoint_(?P<step>\d+)$")
_LEVANTER = re.compile(r"^step-(?P<step>\d+)$")
_PLAIN = re.compile(r"^(?P<step>\d+)$")
_PREFIXED = re.compile(r"^(?P<prefix>.+)_(?P<step>\d+)$", re.S)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$")


@dataclass(frozen=True)
class Skip:
    """A candidate that was not chosen, and why (shown with --debug)."""

    path: str
    step: int | None
    reason: str


@dataclass(frozen=True)
class Scan:
    """The newest complete checkpoint (or None) and every rejected candidate newer than it."""

    latest: Checkpoint | None
    skipped: tuple[Skip, ...] = ()

    def explain(self) -> list[str]:
        """One line per decision, for --debug."""
        lines = [f"skipped {s.path}" + (f" (step {s.step})" if s.step is not None else "")
                 + f": {s.reason}" for s in self.skipped]
        if self.latest is None:
            lines.append("no complete checkpoint: the job starts fresh")
        else:
            c = self.latest
            lines.append(f"latest complete checkpoint: {c.path} (step {c.step}, {c.layout})")
        return lines


def normalize_layout(layout: str) -> str:
    """The canonical layout name, or a ConfigError naming job.checkpoint_layout."""
    value = (layout or "auto").strip().lower().replace("-", "_")
    if value in LAYOUT_CHOICES:
        return value
    hint = difflib.get_close_matches(value, LAYOUT_CHOICES, n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ConfigError(
        f"{LAYOUT_KEY} = {layout!r} is not a known checkpoint layout{did_you_mean}; "
        f"use one of: {', '.join(LAYOUT_CHOICES)}"
    )


# --------------------------------------------------------------------------- stores


@dataclass(frozen=True)
class _Listing:
    dirs: frozenset[str]
    files: dict[str, datetime | None]  # name -> modification time when the listing gave it


@dataclass(frozen=True)
class _Stat:
    time: datetime | None


class _Store(Protocol):
    root: str  # absolute path or gs:// URI, no trailing slash
    is_gcs: bool

    def uri(self, rel: str) -> str: ...

    def list_dir(self, rel: str) -> _Listing | None:
        """One level of `rel` (relative to root; "" is root); None when root does not exist."""

    def stat(self, rel: str) -> _Stat | None:
        """The object or file at `rel`, or None when there is none."""

    def read(self, rel: str, limit: int) -> bytes | None: ...

    def has_subdir(self, rel: str) -> bool:
        """Whether the directory `rel` holds at least one directory (local stores only)."""


def _mtime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


class _LocalStore:
    is_gcs = False

    def __init__(self, root: str) -> None:
        self.root = root

    def uri(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def list_dir(self, rel: str) -> _Listing | None:
        dirs: set[str] = set()
        files: dict[str, datetime | None] = {}
        try:
            with os.scandir(self.uri(rel)) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir()  # follows symlinks, like Orbax's own listing
                    except OSError:
                        continue
                    if is_dir:
                        dirs.add(entry.name)
                    else:
                        files[entry.name] = None
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            if rel:
                return None
            raise ConfigError(
                f"{DIR_KEY} = {self.root!r} is a file, not a directory; point it at the "
                "directory the trainer saves its checkpoints in"
            ) from None
        except PermissionError as exc:
            if rel:
                return None  # an unreadable step directory shows no markers: it is skipped
            raise ConfigError(
                f"{DIR_KEY} = {self.root!r} cannot be listed ({exc.strerror}); give the user "
                "tpuwatch runs as read access to it"
            ) from None
        return _Listing(frozenset(dirs), files)

    def stat(self, rel: str) -> _Stat | None:
        try:
            st = os.stat(self.uri(rel))
        except OSError:  # missing, or a path through a file: no such marker
            return None
        return _Stat(_mtime(st.st_mtime))

    def read(self, rel: str, limit: int) -> bytes | None:
        try:
            with open(self.uri(rel), "rb") as f:
                return f.read(limit + 1)
        except OSError:
            return None

    def has_subdir(self, rel: str) -> bool:
        listing = self.list_dir(rel)
        return bool(listing and listing.dirs)


class _GcsStore:
    """One bucket prefix, read with prefix+delimiter listings and single-object gets."""

    is_gcs = True

    def __init__(self, root: str, bucket: str, prefix: str, client: Any) -> None:
        self.root = root
        self._bucket_name = bucket
        self._prefix = prefix  # "" or "a/b" (no slashes at either end)
        self._client = client
        self._bucket = client.bucket(bucket)

    def uri(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _object(self, rel: str) -> str:
        return "/".join(p for p in (self._prefix, rel) if p)

    def list_dir(self, rel: str) -> _Listing | None:
        base = self._object(rel)
        prefix = f"{base}/" if base else ""
        with _gcs_errors(self, "list objects in", self.uri(rel)):
            pages = self._client.list_blobs(
                self._bucket_name,
                prefix=prefix,
                delimiter="/",
                fields="items(name,updated),prefixes,nextPageToken",
            )
            files: dict[str, datetime | None] = {}
            for blob in pages:
                name = blob.name[len(prefix):]
                if name:  # "dir/" placeholder objects made by some tools
                    files[name] = blob.updated
            dirs = frozenset(p[len(prefix):].rstrip("/") for p in pages.prefixes)
        return _Listing(frozenset(d for d in dirs if d), files)

    def stat(self, rel: str) -> _Stat | None:
        with _gcs_errors(self, "read", self.uri(rel)):
            blob = self._bucket.get_blob(self._object(rel))
        return None if blob is None else _Stat(blob.updated)

    def read(self, rel: str, limit: int) -> bytes | None:
        from google.api_core import exceptions as gexc

        with _gcs_errors(self, "read", self.uri(rel)):
            try:
                data: bytes = self._bucket.blob(self._object(rel)).download_as_bytes(
                    start=0, end=limit
                )
            except gexc.NotFound:
                return None
        return data

    def has_subdir(self, rel: str) -> bool:
        return False  # the unmarked-Orbax fallback is local only; never list deeper on GCS

    @property
    def bucket(self) -> str:
        return self._bucket_name


class _ListingStore:
    """A local directory as a worker listed it (remote.sh `ckpt_listing`): one level of the
    root (and of `checkpoints/`), one level of each directory there, small metadata.json texts."""

    is_gcs = False

    def __init__(self, root: str, listing: dict[str, Any]) -> None:
        self.root = root
        dirs = listing.get("dirs")
        reads = listing.get("reads")
        self._dirs: dict[str, dict[str, Any]] = dirs if isinstance(dirs, dict) else {}
        self._reads: dict[str, str] = reads if isinstance(reads, dict) else {}

    def uri(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def list_dir(self, rel: str) -> _Listing | None:
        level = self._dirs.get(rel)
        if not isinstance(level, dict):
            return None
        files: dict[str, datetime | None] = {n: _mtime(m) for n, m in level.items() if isinstance(m, (int, float))}
        return _Listing(frozenset(n for n, m in level.items() if m is None), files)

    def stat(self, rel: str) -> _Stat | None:
        parent, _, name = rel.rpartition("/")
        level = self._dirs.get(parent)
        if not isinstance(level, dict) or name not in level:
            return None
        m = level[name]
        return _Stat(_mtime(m) if isinstance(m, (int, float)) else None)

    def read(self, rel: str, limit: int) -> bytes | None:
        text = self._reads.get(rel)
        return None if not isinstance(text, str) else text.encode("utf-8")[: limit + 1]

    def has_subdir(self, rel: str) -> bool:
        listing = self.list_dir(rel)
        return bool(listing and listing.dirs)


@contextmanager
def _gcs_errors(store: _GcsStore, verb: str, uri: str) -> Iterator[None]:
    """Turns google-cloud-storage and google-auth failures into tpuwatch errors."""
    try:
        yield
    except Exception as exc:
        translated = _translate_gcs_error(exc, store.bucket, verb, uri)
        if translated is exc:
            raise
        raise translated from None


_LOGIN = "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"


def _translate_gcs_error(exc: Exception, bucket: str, verb: str, uri: str) -> Exception:
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    if isinstance(exc, (CloudError, ConfigError, NotFoundError)):
        return exc
    if isinstance(exc, gexc.NotFound):
        return NotFoundError(
            f"bucket {bucket!r} not found while trying to {verb} {uri} ({DIR_KEY}); "
            "check the bucket name in the config and that the bucket exists"
        )
    if isinstance(exc, (gexc.Unauthorized, aexc.DefaultCredentialsError, aexc.RefreshError)):
        return CloudError(f"cannot {verb} {uri}: not logged in to Google Cloud ({exc}); {_LOGIN}")
    if isinstance(exc, gexc.Forbidden):
        return CloudError(
            f"permission denied to {verb} {uri} ({getattr(exc, 'message', exc)}); the account "
            f"needs storage.objects.list and storage.objects.get on bucket {bucket!r} "
            "(roles/storage.objectViewer)"
        )
    if isinstance(exc, gexc.GoogleAPICallError):
        return CloudError(f"Cloud Storage call failed to {verb} {uri}: {exc}")
    if isinstance(exc, (gexc.RetryError, aexc.TransportError, ConnectionError, OSError)):
        return CloudError(f"cannot reach Cloud Storage to {verb} {uri}: {exc}")
    try:
        import requests

        if isinstance(exc, requests.RequestException):
            return CloudError(f"cannot reach Cloud Storage to {verb} {uri}: {exc}")
    except ImportError:  # pragma: no cover - requests ships with google-cloud-storage
        pass
    return exc


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class _Candidate:
    name: str
    step: int
    kinds: tuple[str, ...]  # layouts that may own this name, checked in this order
    is_dir: bool
    time: datetime | None = None  # from the listing (GCS objects)


@dataclass(frozen=True)
class _Verdict:
    complete: bool
    layout: str
    reason: str = ""
    time: datetime | None = None
    weak: bool = False  # an unmarked local Orbax step: chosen only if no step has a marker
    # A GCS Orbax step with no commit file: complete if this marker exists and no step of the
    # directory is committed (atomic-rename temporary paths).
    unproven: str = ""


@dataclass
class _Classified:
    candidates: list[_Candidate] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)  # name-level rejections (temporary names)
    gda: set[int] = field(default_factory=set)  # steps with a Flax _gda directory
    unrecognised: list[str] = field(default_factory=list)
    dirs: frozenset[str] = frozenset()


def _classify(listing: _Listing, layout: str, store: _Store, rel: str) -> _Classified:
    """Sort the names of one directory into candidates and name-level skips."""
    want = set(LAYOUTS) if layout == "auto" else {layout}
    out = _Classified(dirs=listing.dirs)
    entries: list[tuple[str, bool, datetime | None]] = [(d, True, None) for d in listing.dirs]
    entries += [(f, False, t) for f, t in listing.files.items()]
    for name, is_dir, time in sorted(entries):
        path = store.uri(f"{rel}/{name}" if rel else name)
        m = _ORBAX_TMP.match(name)
        if m and want & {"orbax", "flax"}:
            out.skips.append(Skip(path, _step_of(m.group("base")),
                                  "temporary Orbax name: the save did not finish"))
            continue
        m = _T5X_TMP.match(name)
        if m and "t5x" in want:
            out.skips.append(Skip(path, int(m.group("step")),
                                  "temporary T5X name: the save did not finish"))
            continue
        if _FLAX_TMP.match(name) and "flax" in want:
            out.skips.append(Skip(path, None, "temporary Flax name: the save did not finish"))
            continue
        m = _FLAX_GDA.match(name)
        if m and is_dir and "flax" in want:
            out.gda.add(int(m.group("step")))
            continue
        kinds: tuple[str, ...] = ()
        m = _CHECKPOINT_N.match(name)
        if m:
            if is_dir:
                kinds = tuple(k for k in ("t5x", "flax", "orbax") if k in want)
                if "flax" in kinds and "orbax" in kinds:
                    kinds = ("t5x", "flax") if "t5x" in kinds else ("flax",)
            elif "flax" in want:
                kinds = ("flax",)
        elif (m := _LEVANTER.match(name)) and is_dir:
            kinds = ("levanter",) if "levanter" in want else ()
        elif (m := _PLAIN.match(name)) and is_dir:
            kinds = tuple(k for k in ("orbax", "pytorch_xla") if k in want)
        elif (m := _PREFIXED.match(name)) and is_dir:
            kinds = ("orbax",) if "orbax" in want else ()
        if m and kinds:
            out.candidates.append(_Candidate(name, int(m.group("step")), kinds, is_dir, time))
        else:
            out.unrecognised.append(name)
    return out


def _step_of(name: str) -> int | None:
    m = _PLAIN.match(name) or _PREFIXED.match(name) or _LEVANTER.match(name)
    return int(m.group("step")) if m else None


def _check(store: _Store, cand: _Candidate, rel: str) -> _Verdict:
    """Whether one candidate is complete, by the first layout among its kinds that says so."""
    base = f"{rel}/{cand.name}" if rel else cand.name
    reasons: list[str] = []
    weak: _Verdict | None = None
    unproven: _Verdict | None = None
    for kind in cand.kinds:
        verdict = _CHECKS[kind](store, cand, base)
        if verdict.complete and not verdict.weak:
            return verdict
        if verdict.weak and weak is None:
            weak = verdict
        if verdict.unproven and unproven is None:
            unproven = verdict
        reasons.append(verdict.reason)
    reason = "; ".join(r for r in reasons if r)
    if weak is not None:
        return _Verdict(True, weak.layout, reason, weak.time, weak=True)
    if unproven is not None:
        return _Verdict(False, unproven.layout, reason, unproven=unproven.unproven)
    return _Verdict(False, cand.kinds[0], reason)


def _check_orbax(store: _Store, cand: _Candidate, base: str, label: str = "orbax") -> _Verdict:
    commit = store.stat(f"{base}/{ORBAX_COMMIT}")
    if commit is not None:
        return _Verdict(True, label, time=commit.time)
    if store.is_gcs:
        # Atomic-rename temporary paths write no commit file: the final name is the commit when
        # no step of the directory has one. Its metadata is read only then (_scan_level).
        return _Verdict(False, label, f"no {ORBAX_COMMIT}: an Orbax save on GCS not committed",
                        unproven=f"{base}/{ORBAX_METADATA}")
    meta = store.stat(f"{base}/{ORBAX_METADATA}")
    if meta is not None:
        return _Verdict(True, label, time=meta.time)
    reason = (f"no {ORBAX_COMMIT} or {ORBAX_METADATA}: an Orbax step still being written "
              "or half copied")
    if _PLAIN.match(cand.name) and store.has_subdir(base):
        return _Verdict(True, label, reason, time=(store.stat(base) or _Stat(None)).time, weak=True)
    return _Verdict(False, label, reason)


def _check_flax(store: _Store, cand: _Candidate, base: str) -> _Verdict:
    if not cand.is_dir:
        # Written as checkpoint_tmp and renamed (a single-object copy on GCS): it is whole.
        time = cand.time or (store.stat(base) or _Stat(None)).time
        return _Verdict(True, "flax", time=time)
    return _check_orbax(store, cand, base, label="flax")


def _check_t5x(store: _Store, cand: _Candidate, base: str) -> _Verdict:
    marker = store.stat(f"{base}/{T5X_COMMIT}")
    if marker is not None:
        return _Verdict(True, "t5x", time=marker.time)
    return _Verdict(False, "t5x", f"no `{T5X_COMMIT}` file: a T5X save not finished")


def _check_levanter(store: _Store, cand: _Candidate, base: str) -> _Verdict:
    rel = f"{base}/{LEVANTER_COMMIT}"
    marker = store.stat(rel)
    if marker is None:
        return _Verdict(False, "levanter", f"no {LEVANTER_COMMIT}: a Levanter save not committed")
    raw = store.read(rel, _METADATA_LIMIT)
    if raw is None:
        return _Verdict(False, "levanter", f"{LEVANTER_COMMIT} vanished while reading it")
    if len(raw) > _METADATA_LIMIT:
        return _Verdict(False, "levanter", f"{LEVANTER_COMMIT} is larger than 1 MiB")
    try:
        meta = json.loads(raw)
    except ValueError:
        return _Verdict(False, "levanter", f"{LEVANTER_COMMIT} is not valid JSON (being written?)")
    if not isinstance(meta, dict):
        return _Verdict(False, "levanter", f"{LEVANTER_COMMIT} is not a JSON object")
    # `is_temporary` is retention, not completeness: see the module docstring.
    return _Verdict(True, "levanter", time=marker.time)


def _check_pytorch_xla(store: _Store, cand: _Candidate, base: str) -> _Verdict:
    marker = store.stat(f"{base}/{PTXLA_COMMIT}")
    if marker is not None:
        return _Verdict(True, "pytorch_xla", time=marker.time)
    return _Verdict(False, "pytorch_xla", f"no {PTXLA_COMMIT}: a PyTorch/XLA save not finished")


_CHECKS: dict[str, Callable[[_Store, _Candidate, str], _Verdict]] = {
    "orbax": _check_orbax,
    "flax": _check_flax,
    "t5x": _check_t5x,
    "levanter": _check_levanter,
    "pytorch_xla": _check_pytorch_xla,
}


def _scan_level(store: _Store, rel: str, layout: str) -> tuple[Scan, _Classified] | None:
    listing = store.list_dir(rel)
    if listing is None:
        return None
    found = _classify(listing, layout, store, rel)
    chosen: Checkpoint | None = None
    fallback: tuple[Checkpoint, int] | None = None  # (checkpoint, index of its skip)
    unproven: list[tuple[_Candidate, str, _Verdict, int]] = []  # newest first
    skips: list[Skip] = []
    for cand in sorted(found.candidates, key=lambda c: (c.step, c.name), reverse=True):
        path = store.uri(f"{rel}/{cand.name}" if rel else cand.name)
        verdict = _check(store, cand, rel)
        if verdict.complete and not verdict.weak:
            chosen = Checkpoint(path=path, step=cand.step, layout=verdict.layout, time=verdict.time)
            break
        if verdict.weak and fallback is None:
            fallback = (Checkpoint(path, cand.step, verdict.layout, verdict.time), len(skips))
        if verdict.unproven:
            unproven.append((cand, path, verdict, len(skips)))
        skips.append(Skip(path, cand.step, verdict.reason))
    if chosen is None and fallback is not None:
        # No step carries a marker at all: an Orbax that predates them; its rename is the commit.
        chosen, index = fallback
        del skips[index]
    for cand, path, verdict, index in unproven if chosen is None else ():
        # No step is committed: Orbax with atomic-rename temporary paths on GCS.
        meta = store.stat(verdict.unproven)
        if meta is not None:
            chosen = Checkpoint(path=path, step=cand.step, layout=verdict.layout, time=meta.time)
            del skips[index]
            break
        skips[index] = Skip(path, cand.step, f"{verdict.reason}; no {ORBAX_METADATA} either")
    for step in sorted(found.gda, reverse=True):
        if not any(c.step == step and not c.is_dir for c in found.candidates):
            skips.append(Skip(store.uri(f"{rel}/checkpoint_{step}_gda" if rel else
                                        f"checkpoint_{step}_gda"), step,
                              "Flax multi-process arrays without their checkpoint_"
                              f"{step} file: the save did not finish"))
    newest = chosen.step if chosen else None
    skips += [s for s in found.skips if newest is None or s.step is None or s.step > newest]
    skips = [s for s in skips if newest is None or s.step is None or s.step > newest]
    skips.sort(key=lambda s: (-(s.step if s.step is not None else -1), s.path))
    return Scan(chosen, tuple(skips)), found


def _scan(store: _Store, layout: str) -> Scan:
    level = _scan_level(store, "", layout)
    if level is None:
        return Scan(None, (Skip(store.root, None, "does not exist yet: the job has not saved a "
                                "checkpoint (fresh start)"),))
    scan, found = level
    if scan.latest is None and not found.candidates and not found.skips and not found.gda:
        names = found.unrecognised
        if MAXTEXT_SUBDIR in found.dirs and layout in ("auto", "orbax"):
            # MaxText: <run>/checkpoints/<step>/items, and the user pointed at <run>.
            inner = _scan_level(store, MAXTEXT_SUBDIR, layout)
            if inner is not None and (inner[0].latest or inner[0].skipped):
                return inner[0]
        if names:
            sample = ", ".join(repr(n) for n in names[:5])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            wanted = "any known layout" if layout == "auto" else f"the {layout} layout"
            return Scan(None, (Skip(store.root, None,
                                    f"no name matches {wanted} ({sample}{more}); set "
                                    f"{LAYOUT_KEY} or point {DIR_KEY} at the directory that "
                                    "holds the step directories"),))
    return scan


# --------------------------------------------------------------------------- public API


def _parse_location(checkpoint_dir: str) -> tuple[str, str | None, str]:
    """(root, bucket or None, prefix) for a valid job.checkpoint_dir, else ConfigError."""
    if not isinstance(checkpoint_dir, str) or not checkpoint_dir.strip():
        raise ConfigError(f"{DIR_KEY} is empty; set it to an absolute path or gs://bucket/prefix")
    if checkpoint_dir.startswith("gs://"):
        rest = checkpoint_dir[len("gs://"):]
        bucket, _, prefix = rest.partition("/")
        prefix = prefix.strip("/")
        if not _BUCKET.match(bucket):
            raise ConfigError(
                f"{DIR_KEY} = {checkpoint_dir!r} does not name a valid bucket; "
                "use gs://bucket/prefix"
            )
        root = f"gs://{bucket}/{prefix}" if prefix else f"gs://{bucket}"
        return root, bucket, prefix
    if "://" in checkpoint_dir:
        raise ConfigError(
            f"{DIR_KEY} = {checkpoint_dir!r}: only local paths and gs:// are supported"
        )
    if not os.path.isabs(checkpoint_dir):
        raise ConfigError(
            f"{DIR_KEY} = {checkpoint_dir!r} is relative; it must be an absolute path "
            "or gs://bucket/prefix (a relative path would depend on where tpuwatch runs)"
        )
    root = os.path.normpath(checkpoint_dir)
    if root.startswith("//"):
        root = "/" + root.lstrip("/")
    return root, None, ""


def _default_storage_client() -> Any:
    from tpuwatch.cloud.clients import storage_client

    return storage_client()


class CheckpointDir:
    """A job's checkpoint directory: the `CheckpointStore` port's real adapter."""

    def __init__(
        self,
        path: str,
        layout: str = "auto",
        *,
        storage_client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.root, self._bucket, self._prefix = _parse_location(path)
        self.layout = normalize_layout(layout)
        if self._bucket is None and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigError(
                f"{DIR_KEY} = {path!r} is a file, not a directory; point it at the directory "
                "the trainer saves its checkpoints in"
            )
        self._factory = storage_client_factory or _default_storage_client
        self._client: Any = None

    def _store(self) -> _Store:
        if self._bucket is None:
            if os.path.exists(self.root) and not os.path.isdir(self.root):
                raise ConfigError(f"{DIR_KEY} = {self.root!r} is a file, not a directory")
            return _LocalStore(self.root)
        if self._client is None:
            try:
                self._client = self._factory()
            except Exception as exc:
                raise _translate_gcs_error(exc, self._bucket, "open", self.root) from None
        return _GcsStore(self.root, self._bucket, self._prefix, self._client)

    def scan(self) -> Scan:
        """The newest complete checkpoint and the reasons newer candidates were skipped."""
        store = self._store()
        scan = _scan(store, self.layout)
        if (self._bucket is not None and self._prefix and scan.latest is None
                and not scan.skipped):
            # Nothing under the prefix: maybe the prefix is itself an object, not a folder.
            if store.stat("") is not None:
                raise ConfigError(
                    f"{DIR_KEY} = {self.root!r} is an object, not a folder; point it at the "
                    "folder the trainer saves its checkpoints in"
                )
            return Scan(None, (Skip(self.root, None, "no objects under this prefix yet: the "
                                    "job has not saved a checkpoint (fresh start), or the "
                                    "prefix has a typo"),))
        return scan

    def latest(self) -> Checkpoint | None:
        return self.scan().latest

    def __repr__(self) -> str:
        return f"CheckpointDir({self.root!r}, layout={self.layout!r})"


class WorkerCheckpoints:
    """The `CheckpointStore` port for a local `checkpoint_dir`: the path is on the TPU VM.

    The job writes it on its worker, not on the watcher's machine, so the first selected
    worker's probe lists it (workers.sshworkers.SshWorkers.on_listing feeds `feed`) and the layout rules
    above run on that listing. `latest` is what the newest probe of the node showed; a probe
    that could not read the directory keeps the last good answer for the same node.
    """

    def __init__(self, path: str, layout: str = "auto") -> None:
        self.root, bucket, _ = _parse_location(path)
        if bucket is not None:
            raise ConfigError(f"{DIR_KEY} = {path!r}: a gs:// location is read with CheckpointDir")
        self.layout = normalize_layout(layout)
        self._scan: Scan | None = None
        self._node_id = ""

    def feed(self, node: Any, listing: str) -> None:
        """Take a worker's listing of the directory (remote.sh `ckpt_listing`) of `node`."""
        try:
            data = json.loads(listing)
        except ValueError:
            data = {"error": "the worker's answer is not JSON"}
        if not isinstance(data, dict) or "error" in data:
            why = data.get("error") if isinstance(data, dict) else "the worker's answer is not a table"
            if self._scan is not None and self._node_id == node.id and self._scan.latest is not None:
                return  # keep the last good answer of this node
            self._scan = Scan(None, (Skip(self.root, None, f"cannot be read on the worker: {why}"),))
        else:
            self._scan = _scan(_ListingStore(self.root, data), self.layout)
        self._node_id = node.id

    def scan(self) -> Scan:
        if self._scan is None:
            return Scan(None, (Skip(self.root, None, "not read yet: a local checkpoint_dir is read on the "
                                    "job's first worker, by the probe of `watch` or `check`"),))
        return self._scan

    def latest(self) -> Checkpoint | None:
        return self.scan().latest

    def __repr__(self) -> str:
        return f"WorkerCheckpoints({self.root!r}, layout={self.layout!r})"


def find_latest(
    checkpoint_dir: str,
    *,
    layout: str = "auto",
    storage_client_factory: Callable[[], Any] | None = None,
) -> Scan:
    """Scan `checkpoint_dir` (absolute path or gs://bucket/prefix) for its newest complete step."""
    return CheckpointDir(
        checkpoint_dir, layout, storage_client_factory=storage_client_factory
    ).scan()


__all__ = [
    "CheckpointDir",
    "LAYOUTS",
    "LAYOUT_CHOICES",
    "Scan",
    "Skip",
    "WorkerCheckpoints",
    "find_latest",
    "normalize_layout",
]
