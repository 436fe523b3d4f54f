"""tpuwatch.workers.hostkeys on its own: the known_hosts file it keeps, fingerprints, and when it
asks the API again. The keys come in through its source (the TPU adapter's `host_keys` in real
use, a function here: the file and the timing are what is tested, and test_hostkeys_sim.py
drives it through the simulator's API)."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest

from tpuwatch.errors import HostKeysRefused, JobFailed
from tpuwatch.model import NodeSnapshot, WorkerEndpoint
from tpuwatch.workers import hostkeys


def _node(node_id: str = "77", n: int = 2) -> NodeSnapshot:
    return NodeSnapshot(name="pod", project="p", zone="us-central2-b", id=node_id, create_time=None,
                        state="READY", health="HEALTHY", health_description="", maintenance_time=None,
                        workers=tuple(WorkerEndpoint(i, f"10.0.0.{i}", "") for i in range(n)))


def _key() -> str:
    """A new key as guest attributes publish it: "ssh-ed25519 AAAA..." (no comment)."""
    return " ".join(asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().split()[:2])


def test_fingerprints_are_what_ssh_prints() -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    text = key.export_public_key("openssh").decode()
    assert hostkeys.fingerprint(text) == key.get_fingerprint("sha256")
    assert hostkeys.fingerprint("ssh-ed25519 not-base64!") == "(not a key)"
    warning = ("The fingerprint for the ED25519 key sent by the remote host is\n"
               "SHA256:pjxUWG6b+s0Jw4Hvw2B1Bmjr/nrCqWPBxzzIROhEJr8.\nPlease contact your system administrator.")
    assert hostkeys.presented_fingerprint(warning) == "SHA256:pjxUWG6b+s0Jw4Hvw2B1Bmjr/nrCqWPBxzzIROhEJr8"


def test_published_keys_replace_an_aliases_lines_and_keep_everyone_elses(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    other = "tpuwatch-5-w0 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther"
    kh.write_text(f"{other}\ntpuwatch-77-w1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStale\n")
    keys = {0: (_key(),), 1: (_key(),)}
    pins = hostkeys.PinnedHostKeys(kh, lambda n: keys)
    node = _node()
    pins.prepare(node, node.workers)
    lines = kh.read_text().splitlines()
    assert other in lines and not any("Stale" in ln for ln in lines)
    assert f"tpuwatch-77-w0 {keys[0][0]} {hostkeys.MARK}" in lines
    assert f"tpuwatch-77-w1 {keys[1][0]} {hostkeys.MARK}" in lines
    assert pins.strict("tpuwatch-77-w0") and pins.strict("tpuwatch-77-w1") and not pins.strict("tpuwatch-5-w0")
    assert kh.stat().st_mode & 0o777 == 0o600 and pins.take_notes() == []


def test_a_worker_publishing_no_keys_is_trusted_on_first_use_said_once_and_asked_again_later(
        tmp_path: Path) -> None:
    now = [0.0]
    calls = []
    published: dict[int, tuple[str, ...]] = {0: (_key(),)}

    def source(node: NodeSnapshot) -> dict[int, tuple[str, ...]]:
        calls.append(node.id)
        return dict(published)

    pins = hostkeys.PinnedHostKeys(tmp_path / "kh", source, clock=lambda: now[0])
    node = _node()
    pins.prepare(node, node.workers)
    assert not pins.strict("tpuwatch-77-w1") and pins.strict("tpuwatch-77-w0")
    (note,) = pins.take_notes()
    assert "publishes no SSH host keys for worker(s) 1" in note and "trust on first use" in note
    pins.prepare(node, node.workers)
    assert len(calls) == 1 and pins.take_notes() == []  # not asked again at once, not said twice
    published[1] = (_key(),)  # the guest agent publishes it late
    now[0] = hostkeys.REREAD_UNPUBLISHED
    pins.prepare(node, node.workers)
    assert len(calls) == 2 and pins.strict("tpuwatch-77-w1")
    assert published[1][0] in (tmp_path / "kh").read_text()


def test_separate_runs_share_when_they_last_asked_and_a_late_key_becomes_strict(tmp_path: Path) -> None:
    """cron's `check` runs are separate processes: one that finds a worker trusted on first use
    asks the API again once the last run's question is old, and from then on checks strictly."""
    wall = [1_000_000.0]
    calls = []
    published: dict[int, tuple[str, ...]] = {0: (_key(),)}

    def source(node: NodeSnapshot) -> dict[int, tuple[str, ...]]:
        calls.append(node.id)
        return dict(published)

    kh = tmp_path / "kh"
    node = _node()

    def run() -> hostkeys.PinnedHostKeys:  # a new process: nothing in memory, only the file
        pins = hostkeys.PinnedHostKeys(kh, source, wall=lambda: wall[0])
        pins.prepare(node, node.workers)
        return pins

    first = run()
    assert len(calls) == 1 and not first.strict("tpuwatch-77-w1")
    assert len(first.take_notes()) == 1
    with kh.open("a") as f:  # what ssh's accept-new then adds for worker 1
        f.write(f"tpuwatch-77-w1 {_key()}\n")
    wall[0] += 60
    second = run()
    assert len(calls) == 1 and not second.strict("tpuwatch-77-w1")  # asked a minute ago: not again
    assert second.take_notes() == []
    published[1] = (_key(),)  # the guest agent publishes it late
    wall[0] += hostkeys.REREAD_UNPUBLISHED
    third = run()
    assert len(calls) == 2 and third.strict("tpuwatch-77-w1")
    text = kh.read_text()
    assert f"tpuwatch-77-w1 {published[1][0]} {hostkeys.MARK}" in text
    assert hostkeys.ASKED not in text  # no worker is unpublished any more
    assert sum(ln.startswith("tpuwatch-77-w1 ") for ln in text.splitlines()) == 1  # the TOFU line is gone
    # and the stamp never reaches ssh as a host: it is a comment
    assert all(ln.startswith(("#", "tpuwatch-")) for ln in text.splitlines())


def test_the_refusal_names_worker_alias_and_both_fingerprints(tmp_path: Path) -> None:
    key = _key()
    pins = hostkeys.PinnedHostKeys(tmp_path / "kh", lambda n: {0: (key,)})
    node = _node(n=1)
    pins.refresh(node)
    msg = pins.describe_mismatch(node, node.workers[0], "10.0.0.0",
                                 "key sent by the remote host is\nSHA256:abc+/def.")
    for words in ("worker 0 of pod", "node id 77", "alias tpuwatch-77-w0", "presented SHA256:abc+/def",
                  hostkeys.fingerprint(key), "nothing was run there"):
        assert words in msg, (words, msg)


def _refused(node: NodeSnapshot) -> dict[int, tuple[str, ...]]:
    raise HostKeysRefused("Compute Engine API get_guest_attributes(...): missing permission "
                          "compute.instances.getGuestAttributes in project p", permission="compute.instances.getGuestAttributes")


def test_a_refused_read_of_the_keys_is_warned_once_naming_the_permission_and_trusted_on_first_use(
        tmp_path: Path) -> None:
    now = [0.0]
    pins = hostkeys.PinnedHostKeys(tmp_path / "kh", _refused, clock=lambda: now[0])
    node = _node()
    pins.prepare(node, node.workers)
    assert not pins.strict("tpuwatch-77-w0") and not pins.strict("tpuwatch-77-w1")  # accept-new
    (note,) = pins.take_notes()
    for words in ("WARNING", "cannot read the SSH host keys", "compute.instances.getGuestAttributes",
                  "trust on first use", "machine in the middle", "ssh.trust_first_use = false"):
        assert words in note, (words, note)
    assert "publishes no SSH host keys" not in note  # the keys may well be there: it was refused
    now[0] = hostkeys.REREAD_UNPUBLISHED  # asked again later, and refused again: not said twice
    pins.prepare(node, node.workers)
    assert pins.take_notes() == []


def test_without_trust_on_first_use_a_worker_whose_keys_cannot_be_read_is_refused(tmp_path: Path) -> None:
    node = _node()
    pins = hostkeys.PinnedHostKeys(tmp_path / "kh", _refused, trust_first_use=False)
    with pytest.raises(JobFailed) as err:
        pins.prepare(node, node.workers)
    for words in ("refusing to connect to worker(s) 0, 1 of pod", "compute.instances.getGuestAttributes",
                  "ssh.trust_first_use = false"):
        assert words in err.value.message, (words, err.value.message)
    with pytest.raises(JobFailed):  # and again on the next tick, from what it remembers
        pins.prepare(node, node.workers)
    # guest attributes off: worker 1 publishes none, the same setting refuses it
    key = _key()
    unpublished = hostkeys.PinnedHostKeys(tmp_path / "kh2", lambda n: {0: (key,)}, trust_first_use=False)
    with pytest.raises(JobFailed, match=r"worker\(s\) 1 of pod.*publish none"):
        unpublished.prepare(node, node.workers)
    # every worker's keys read: connected to, strictly
    both = hostkeys.PinnedHostKeys(tmp_path / "kh3", lambda n: {0: (key,), 1: (_key(),)}, trust_first_use=False)
    both.prepare(node, node.workers)
    assert both.strict("tpuwatch-77-w0") and both.strict("tpuwatch-77-w1") and both.take_notes() == []
