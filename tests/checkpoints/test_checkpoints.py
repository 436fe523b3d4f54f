"""Checkpoint discovery (tpuwatch.checkpoints) on a local directory and on gs://.

Every layout case runs twice: on a real directory tree, and on gcp-storage-emulator through
the real google-cloud-storage client (STORAGE_EMULATOR_HOST). Each case is a tree as a
trainer of one layout leaves it, including the debris of saves that did not finish, and the
step tpuwatch must pick. `only` limits a case to one backend where the rule differs (locally an
Orbax step is complete with `_CHECKPOINT_METADATA`; on GCS only `commit_success.txt` counts).

Emulator quirks seen with google-cloud-storage 3.x (gcp-storage-emulator 2026.x): listings
honour prefix+delimiter and fill `prefixes`, but ignore `page_size`/`max_results` (one page)
and `fields`; every object write re-serialises the whole in-memory store, so seeding
thousands of objects over HTTP is quadratic and slow (the bulk test seeds through the
emulator's own storage object instead).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tpuwatch.checkpoints import LAYOUT_CHOICES, CheckpointDir, Scan, WorkerCheckpoints, find_latest
from tpuwatch.errors import EXIT_CLOUD, EXIT_USAGE, CloudError, ConfigError, NotFoundError
from tpuwatch.model import Checkpoint, NodeSnapshot
from tpuwatch.ports import CheckpointStore

BUCKET = "tpuwatch-ckpt-test"

def levanter_meta(step: int, temporary: bool = False) -> str:
    return json.dumps({"step": step, "timestamp": "2024-05-01T10:00:00", "is_temporary": temporary})


@dataclass(frozen=True)
class Case:
    id: str
    tree: dict[str, str]
    expect: str | None  # relative path of the chosen checkpoint, None = fresh start
    step: int | None
    layout: str | None
    skipped: tuple[str, ...] = ()  # relative paths that must appear among the skips
    only: str | None = None  # "local" or "gcs"
    sub: str = ""  # scan this subdirectory of the tree instead of its root


CASES = [
    Case(
        "orbax-plain-killed-save",
        {
            "100/_CHECKPOINT_METADATA": "{}",
            "100/commit_success.txt": "ok",
            "100/default/manifest.ocdbt": "x",
            # A save killed halfway, under each temporary name Orbax has used.
            "200.orbax-checkpoint-tmp-1714550000/default/manifest.ocdbt": "x",
            "300.orbax-checkpoint-tmp-7/default/manifest.ocdbt": "x",
            "400.orbax-checkpoint-tmp/_CHECKPOINT_METADATA": "{}",
        },
        "100", 100, "orbax",
        skipped=("200.orbax-checkpoint-tmp-1714550000", "300.orbax-checkpoint-tmp-7",
                 "400.orbax-checkpoint-tmp"),
    ),
    Case(
        "orbax-gcs-uncommitted-in-place",
        {
            "100/commit_success.txt": "ok",
            "100/_CHECKPOINT_METADATA": "{}",
            "100/default/d/0": "x",
            # Orbax writes in place on GCS; no commit_success.txt yet.
            "200/_CHECKPOINT_METADATA": "{}",
            "200/default/d/0": "x",
        },
        "100", 100, "orbax", skipped=("200",), only="gcs",
    ),
    Case(
        "orbax-gcs-atomic-rename-no-commit-file-anywhere",
        {
            # Orbax with atomic-rename temporary paths on GCS: no step has commit_success.txt;
            # the final name is the commit, and a save in progress has a temporary name.
            "100/_CHECKPOINT_METADATA": "{}",
            "100/default/d/0": "x",
            "200/_CHECKPOINT_METADATA": "{}",
            "200/default/d/0": "x",
            "300.orbax-checkpoint-tmp-1714550000/_CHECKPOINT_METADATA": "{}",
            "300.orbax-checkpoint-tmp-1714550000/default/d/0": "x",
            "400/default/d/0": "x",  # no metadata: still being written or half copied
        },
        "200", 200, "orbax", skipped=("300.orbax-checkpoint-tmp-1714550000", "400"), only="gcs",
    ),
    Case(
        "orbax-local-marker-beats-half-copied",
        {
            "100/_CHECKPOINT_METADATA": "{}",
            "100/default/d/0": "x",
            # Renamed-looking but no marker while older steps have one: half copied.
            "200/default/d/0": "x",
        },
        "100", 100, "orbax", skipped=("200",), only="local",
    ),
    Case(
        "orbax-local-no-markers-anywhere",
        {
            # An Orbax that wrote no marker: the rename is the commit.
            "100/default/d/0": "x",
            "200/default/d/0": "x",
            "300.orbax-checkpoint-tmp-1714550000/default/d/0": "x",
        },
        "200", 200, "orbax", skipped=("300.orbax-checkpoint-tmp-1714550000",), only="local",
    ),
    Case(
        "orbax-step-prefix",
        {
            "step_100/commit_success.txt": "ok",
            "step_100/_CHECKPOINT_METADATA": "{}",
            "step_100/state/d": "x",
            "step_200.orbax-checkpoint-tmp-1714550000/state/d": "x",
            "step_300/state/d": "x",  # prefixed names always need a marker
        },
        "step_100", 100, "orbax", skipped=("step_200.orbax-checkpoint-tmp-1714550000", "step_300"),
    ),
    Case(
        "orbax-fixed-length",
        {
            "00000900/commit_success.txt": "ok",
            "00000900/_CHECKPOINT_METADATA": "{}",
            "00001000.orbax-checkpoint-tmp-3/x": "x",
        },
        "00000900", 900, "orbax", skipped=("00001000.orbax-checkpoint-tmp-3",),
    ),
    Case(
        "maxtext-run-dir",
        {
            "checkpoints/100/items/manifest.ocdbt": "x",
            "checkpoints/100/commit_success.txt": "ok",
            "checkpoints/100/_CHECKPOINT_METADATA": "{}",
            "checkpoints/200.orbax-checkpoint-tmp-1714550000/items/x": "x",
            "metrics/metrics.txt": "loss",
            "tensorboard/events": "x",
        },
        "checkpoints/100", 100, "orbax",
        skipped=("checkpoints/200.orbax-checkpoint-tmp-1714550000",),
    ),
    Case(
        "maxtext-checkpoints-dir",
        {
            "checkpoints/100/items/manifest.ocdbt": "x",
            "checkpoints/100/commit_success.txt": "ok",
            "checkpoints/100/_CHECKPOINT_METADATA": "{}",
            "checkpoints/200/items/manifest.ocdbt": "x",  # no marker yet
        },
        "checkpoints/100", 100, "orbax", skipped=("checkpoints/200",), sub="checkpoints",
    ),
    Case(
        "flax-file",
        {
            "checkpoint_100": "msgpack",
            "checkpoint_100_gda/commit_success.txt": "ok",  # counts with its base
            "checkpoint_tmp": "half a msgpack",
            "checkpoint_200_gda/x": "x",  # arrays written, main file never renamed in
        },
        "checkpoint_100", 100, "flax", skipped=("checkpoint_tmp", "checkpoint_200_gda"),
    ),
    Case(
        "flax-orbax-backed",
        {
            "checkpoint_100/commit_success.txt": "ok",
            "checkpoint_100/_CHECKPOINT_METADATA": "{}",
            "checkpoint_100/default/x": "x",
            "checkpoint_200.orbax-checkpoint-tmp-1714550000/default/x": "x",
        },
        "checkpoint_100", 100, "flax",
        skipped=("checkpoint_200.orbax-checkpoint-tmp-1714550000",),
    ),
    Case(
        "t5x",
        {
            "checkpoint_100/checkpoint": "msgpack",
            "checkpoint_100/target.encoder.kernel/.zarray": "{}",
            "checkpoint_200.tmp-1714550000/checkpoint": "msgpack",
            # A rename on GCS copies object by object: the `checkpoint` file is not there yet.
            "checkpoint_300/target.encoder.kernel/.zarray": "{}",
        },
        "checkpoint_100", 100, "t5x",
        skipped=("checkpoint_200.tmp-1714550000", "checkpoint_300"),
    ),
    Case(
        "levanter",
        {
            "step-100/metadata.json": levanter_meta(100),
            "step-100/model/x": "x",
            "step-200/model/x": "x",  # arrays written, metadata.json (the commit) not yet
            "step-300/metadata.json": '{"step": 3',  # torn write
        },
        "step-100", 100, "levanter", skipped=("step-200", "step-300"),
    ),
    Case(
        "levanter-temporary-is-resumable",
        {
            "step-100/metadata.json": levanter_meta(100),
            # A time-based save: complete, deleted by Levanter once the next one commits.
            "step-150/metadata.json": levanter_meta(150, temporary=True),
            "step-200/model/x": "x",
        },
        "step-150", 150, "levanter", skipped=("step-200",),
    ),
    Case(
        "pytorch-xla",
        {
            "100/.manager_metadata": "pickle",
            "100/.metadata": "dcp",
            "100/__0_0.distcp": "x",
            "200/.metadata": "dcp",  # distributed save done, manager metadata not yet
            "200/__0_0.distcp": "x",
        },
        "100", 100, "pytorch_xla", skipped=("200",),
    ),
    Case(
        "foreign-dir",
        {"README.md": "hi", "logs/train.log": "x", "events.out.tfevents.1": "x"},
        None, None, None, skipped=("",),
    ),
    Case(
        "mixed-layouts-newest-wins",
        {
            "50/commit_success.txt": "ok",
            "50/_CHECKPOINT_METADATA": "{}",
            "checkpoint_80/checkpoint": "x",
            "step-90/metadata.json": levanter_meta(90),
        },
        "step-90", 90, "levanter",
    ),
    Case(
        "shell-metacharacters-in-names",
        {
            "it's $(touch pwned)_7/commit_success.txt": "ok",
            "it's $(touch pwned)_7/_CHECKPOINT_METADATA": "{}",
            "it's $(touch pwned)_9.orbax-checkpoint-tmp-1/x": "x",
        },
        "it's $(touch pwned)_7", 7, "orbax",
        skipped=("it's $(touch pwned)_9.orbax-checkpoint-tmp-1",),
    ),
]


# --------------------------------------------------------------------------- backends


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def emulator() -> Iterator[Any]:
    """gcp-storage-emulator in this process, on a free loopback port, with one bucket."""
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        server.stop()


_prefixes = itertools.count()


@dataclass
class Backend:
    name: str
    make: Callable[[dict[str, str]], str]  # writes a tree, returns its root (path or gs:// URI)


@pytest.fixture(params=["local", "gcs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        def make_local(tree: dict[str, str]) -> str:
            root = tmp_path / "ckpt root"  # a space, for good measure
            root.mkdir(exist_ok=True)
            for rel, content in tree.items():
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            return str(root)

        return Backend("local", make_local)

    server = request.getfixturevalue("emulator")
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    from tpuwatch.cloud.clients import storage_client

    def make_gcs(tree: dict[str, str]) -> str:
        prefix = f"run-{next(_prefixes)}/ckpt root"
        bucket = storage_client().bucket(BUCKET)
        for rel, content in tree.items():
            bucket.blob(f"{prefix}/{rel}").upload_from_string(content.encode())
        return f"gs://{BUCKET}/{prefix}"

    return Backend("gcs", make_gcs)


def _join(root: str, rel: str) -> str:
    return f"{root}/{rel}" if rel else root


# --------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layout_picks_newest_complete(case: Case, backend: Backend) -> None:
    if case.only and case.only != backend.name:
        pytest.skip(f"{case.id} is a {case.only}-only rule")
    root = backend.make(case.tree)
    scan = find_latest(_join(root, case.sub))

    if case.expect is None:
        assert scan.latest is None
    else:
        assert scan.latest == Checkpoint(
            path=_join(root, case.expect), step=case.step or 0, layout=case.layout or "",
            time=scan.latest.time if scan.latest else None,
        )
        assert scan.latest.time is not None
        assert not scan.latest.path.endswith("/")
    skipped = {s.path for s in scan.skipped}
    for rel in case.skipped:
        assert _join(root, rel) in skipped, (rel, scan.explain())
    # Nothing older than the chosen step is reported: skips explain why newer ones lost.
    if scan.latest is not None:
        assert all(s.step is None or s.step > scan.latest.step for s in scan.skipped)
    assert all(s.reason for s in scan.skipped)


def test_killed_orbax_save_reason_names_the_temporary_name(backend: Backend) -> None:
    root = backend.make({
        "100/commit_success.txt": "ok",
        "100/_CHECKPOINT_METADATA": "{}",
        "200.orbax-checkpoint-tmp-1714550000/default/x": "x",
    })
    scan = find_latest(root)
    assert scan.latest is not None and scan.latest.step == 100
    (skip,) = scan.skipped
    assert skip.step == 200 and "temporary Orbax name" in skip.reason
    assert any("200.orbax-checkpoint-tmp-1714550000" in line for line in scan.explain())


@pytest.mark.parametrize(
    ("layout", "expect"),
    [("auto", "step-90"), ("orbax", "50"), ("t5x", "checkpoint_80"), ("levanter", "step-90"),
     ("flax", None), ("pytorch_xla", None), ("T5X", "checkpoint_80")],
)
def test_forced_layout_only_considers_its_own(backend: Backend, layout: str, expect: str | None) -> None:
    root = backend.make({
        "50/commit_success.txt": "ok",
        "50/_CHECKPOINT_METADATA": "{}",
        "checkpoint_80/checkpoint": "x",
        "step-90/metadata.json": levanter_meta(90),
    })
    scan = find_latest(root, layout=layout)
    if expect is None:
        assert scan.latest is None
        assert scan.skipped, "a forced layout that finds nothing says why"
    else:
        assert scan.latest is not None and scan.latest.path == _join(root, expect)


def test_unknown_layout_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        CheckpointDir("/tmp", layout="orbx")
    message = str(err.value)
    assert "job.checkpoint_layout" in message and "'orbax'" in message
    for name in LAYOUT_CHOICES:
        assert name in message
    assert err.value.exit_code == EXIT_USAGE


# --------------------------------------------------------------------------- local bad input


def test_empty_directory_is_a_fresh_start(tmp_path: Path) -> None:
    scan = find_latest(str(tmp_path))
    assert scan == Scan(None, ())


def test_missing_directory_is_a_fresh_start_with_a_reason(tmp_path: Path) -> None:
    missing = tmp_path / "not yet"
    scan = find_latest(str(missing))
    assert scan.latest is None
    (skip,) = scan.skipped
    assert skip.path == str(missing) and "does not exist" in skip.reason


def test_a_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    path.write_text("not a dir")
    with pytest.raises(ConfigError, match="job.checkpoint_dir") as err:
        find_latest(str(path))
    assert "is a file" in str(err.value) and err.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("value", ["ckpt", "./ckpt", "~/ckpt", "", "s3://b/ckpt", "gs://", "gs://A_B/x"])
def test_relative_or_foreign_paths_are_config_errors(value: str) -> None:
    with pytest.raises(ConfigError, match="job.checkpoint_dir"):
        find_latest(value)


def test_checkpoint_dir_store_satisfies_the_port(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "commit_success.txt").write_text("ok")
    store: CheckpointStore = CheckpointDir(str(tmp_path) + "/")
    latest = store.latest()
    assert latest is not None and latest.path == str(tmp_path / "7") and latest.step == 7
    # A second look sees a newer commit: nothing is cached between calls.
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "_CHECKPOINT_METADATA").write_text("{}")
    latest = store.latest()
    assert latest is not None and latest.step == 8


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_directory_is_a_config_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        with pytest.raises(ConfigError, match="job.checkpoint_dir"):
            find_latest(str(locked))
    finally:
        locked.chmod(0o755)


def test_names_with_shell_metacharacters_come_back_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "it's $(touch pwned)"
    step = root / "it's $(touch pwned)_12"
    step.mkdir(parents=True)
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    (root / 'a "quoted" `dir`_3').mkdir()
    (root / 'a "quoted" `dir`_3' / "commit_success.txt").write_text("ok")

    scan = find_latest(str(root))
    assert scan.latest is not None
    assert scan.latest.path == str(root) + "/it's $(touch pwned)_12"
    assert scan.latest.step == 12
    assert not list(tmp_path.rglob("pwned")), "a name was handed to a shell"


# --------------------------------------------------------------------------- gs:// specifics


@pytest.fixture
def gcs_env(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    return emulator


def test_gcs_checkpoint_named_with_shell_metacharacters(gcs_env: Any) -> None:
    from tpuwatch.cloud.clients import storage_client

    bucket = storage_client().bucket(BUCKET)
    prefix = "meta/it's $(touch pwned)"
    bucket.blob(f"{prefix}/it's $(touch pwned)_5/commit_success.txt").upload_from_string(b"ok")
    scan = find_latest(f"gs://{BUCKET}/{prefix}/")
    assert scan.latest is not None
    assert scan.latest.path == f"gs://{BUCKET}/{prefix}/it's $(touch pwned)_5"
    assert scan.latest.step == 5


def test_gcs_bucket_not_found_names_the_bucket(gcs_env: Any) -> None:
    with pytest.raises(NotFoundError, match="no-such-bucket-xyz") as err:
        find_latest("gs://no-such-bucket-xyz/run1/ckpt")
    assert "job.checkpoint_dir" in str(err.value)


def test_gcs_empty_prefix_is_a_fresh_start(gcs_env: Any) -> None:
    scan = find_latest(f"gs://{BUCKET}/nothing-here-yet")
    assert scan.latest is None
    (skip,) = scan.skipped
    assert "no objects" in skip.reason


def test_gcs_prefix_that_is_an_object_is_a_config_error(gcs_env: Any) -> None:
    from tpuwatch.cloud.clients import storage_client

    storage_client().bucket(BUCKET).blob("a-file").upload_from_string(b"x")
    with pytest.raises(ConfigError, match="job.checkpoint_dir"):
        find_latest(f"gs://{BUCKET}/a-file")


def test_gcs_without_credentials_says_how_to_log_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No emulator, no key file, no gcloud config, and no metadata server to fall back on.
    for var in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
                "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(CloudError) as err:
        find_latest(f"gs://{BUCKET}/run1/ckpt")
    assert err.value.exit_code == EXIT_CLOUD
    assert "gcloud auth application-default login" in str(err.value)
    assert time.monotonic() - started < 10


class CountingSession(requests.Session):
    """Records every HTTP request google-cloud-storage makes.

    This wraps a boundary we do not own (the client's HTTP session, passed through the
    client's `_http` argument) purely to count calls; the client and server stay real.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((str(method), str(url)))
        return super().request(method, url, *args, **kwargs)


def _seed_quickly(server: Any, names: list[str]) -> None:
    """Put many empty objects into the emulator without an HTTP round trip each.

    The emulator re-serialises its whole store on every write, so seeding thousands of
    objects through the API is quadratic; this uses the emulator's own storage object
    (not ours, not the code under test) and writes its index once at the end.
    """
    from gcp_storage_emulator.handlers.objects import _make_object_resource

    storage = server._storage
    save = storage._write_config_to_file
    storage._write_config_to_file = lambda: None
    try:
        for name in names:
            obj = _make_object_resource(server.url, BUCKET, name, "application/octet-stream", "0")
            storage.create_file(BUCKET, name, b"", obj)
    finally:
        storage._write_config_to_file = save
    save()


def test_gcs_scan_cost_does_not_grow_with_objects(gcs_env: Any) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    prefix = "big/run1/ckpt"
    steps = list(range(100, 4100, 100))  # 40 steps
    names = []
    for step in steps:
        # Orbax without OCDBT: one object per array shard, hundreds per step.
        names += [f"{prefix}/{step}/default/layer{i}/0.0" for i in range(60)]
        names.append(f"{prefix}/{step}/_CHECKPOINT_METADATA")
        if step <= 3700:  # the three newest saves were cut short
            names.append(f"{prefix}/{step}/commit_success.txt")
    _seed_quickly(gcs_env, names)
    assert len(names) > 2000

    session = CountingSession()

    def factory() -> Any:
        return storage.Client(project="test", credentials=AnonymousCredentials(), _http=session)

    scan = find_latest(f"gs://{BUCKET}/{prefix}", storage_client_factory=factory)
    assert scan.latest is not None and scan.latest.step == 3700
    assert scan.latest.path == f"gs://{BUCKET}/{prefix}/3700"
    assert [s.step for s in scan.skipped] == [4000, 3900, 3800]

    urls = [url.split("/storage/v1/b/", 1)[1] for _, url in session.calls]
    lists = [u for u in urls if u.startswith(f"{BUCKET}/o?")]
    reads = [u for u in urls if u.startswith(f"{BUCKET}/o/")]
    other = [u for u in urls if u not in lists and u not in reads]
    assert len(lists) == 1, urls
    assert "delimiter=%2F" in lists[0], "a listing without a delimiter recurses"
    # Then one marker read per candidate until the first committed one; a plain <step>/ can
    # be Orbax or PyTorch/XLA, so each cut-short step costs two reads.
    assert len(reads) == 3 * 2 + 1, urls
    # google-cloud-storage 3.x itself fetches the bucket's metadata once per client, in a
    # background thread, for its tracing attributes (a `buckets.get`, not a listing).
    assert all(u.startswith(f"{BUCKET}?") for u in other) and len(other) <= 1, urls


@pytest.fixture
def refusing_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """A loopback HTTP server answering every Cloud Storage call with a chosen error status."""
    import http.server
    import threading

    state = {"status": 403}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"error": {"code": state["status"], "message": "refused by test",
                                         "errors": [{"reason": "forbidden"}]}}).encode()
            self.send_response(state["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_gcs_permission_denied_is_a_cloud_error(refusing_server: dict[str, int]) -> None:
    with pytest.raises(CloudError) as err:
        find_latest(f"gs://{BUCKET}/run1/ckpt")
    assert err.value.exit_code == EXIT_CLOUD
    assert "permission denied" in str(err.value) and "roles/storage.objectViewer" in str(err.value)


def test_gcs_unauthenticated_says_how_to_log_in(refusing_server: dict[str, int]) -> None:
    refusing_server["status"] = 401
    with pytest.raises(CloudError) as err:
        find_latest(f"gs://{BUCKET}/run1/ckpt")
    assert "gcloud auth application-default login" in str(err.value)


def test_gcs_bucket_root_as_checkpoint_dir(gcs_env: Any) -> None:
    from tpuwatch.cloud.clients import storage_client

    bucket = storage_client().create_bucket("tpuwatch-root-ckpt")
    bucket.blob("step-3/metadata.json").upload_from_string(levanter_meta(3).encode())
    bucket.blob("step-4/model/x").upload_from_string(b"x")
    scan = find_latest("gs://tpuwatch-root-ckpt")
    assert scan.latest is not None
    assert (scan.latest.path, scan.latest.step) == ("gs://tpuwatch-root-ckpt/step-3", 3)
    assert [s.path for s in scan.skipped] == ["gs://tpuwatch-root-ckpt/step-4"]
    assert scan.explain()[-1] == (
        "latest complete checkpoint: gs://tpuwatch-root-ckpt/step-3 (step 3, levanter)"
    )


def _listed_on_a_worker(root: str, home: Path) -> str:
    """The `ckpt_listing` answer of the real probe script (remote.sh) run by bash on this host."""
    import subprocess

    from tpuwatch.workers import protocol

    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = subprocess.run(["bash", "-s"], input=protocol.probe_script("job", root), env=env,
                         capture_output=True, timeout=60, check=True).stdout.decode()
    records = protocol.parse_records(out)
    assert records.get("result") == "ok", out
    return protocol.parse_probe(0, records).checkpoint_listing


@pytest.mark.parametrize("case", [c for c in CASES if c.only in (None, "local")], ids=lambda c: c.id)
def test_a_local_directory_read_on_the_worker_gives_the_same_answer(case: Case, tmp_path: Path) -> None:
    root = tmp_path / "ckpt root"
    for rel, content in case.tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    where = str(root / case.sub) if case.sub else str(root)
    here = find_latest(where)
    remote = WorkerCheckpoints(where)
    remote.feed(NodeSnapshot("pod", "p", "z", "1", None, "READY", "HEALTHY", "", None),
                _listed_on_a_worker(where, tmp_path))
    got, want = remote.latest(), here.latest
    assert got is not None if case.expect else got is None
    assert (got.path, got.step, got.layout) == (want.path, want.step, want.layout) if got and want else got == want
    assert [s.path for s in remote.scan().skipped] == [s.path for s in here.skipped]


def test_a_missing_local_directory_on_the_worker_is_a_fresh_start(tmp_path: Path) -> None:
    remote = WorkerCheckpoints(str(tmp_path / "nothing"))
    assert "not read yet" in remote.scan().explain()[0]
    node = NodeSnapshot("pod", "p", "z", "1", None, "READY", "HEALTHY", "", None)
    remote.feed(node, _listed_on_a_worker(str(tmp_path / "nothing"), tmp_path))
    assert remote.latest() is None and "does not exist yet" in remote.scan().explain()[0]
