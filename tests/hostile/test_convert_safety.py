"""``convert`` writes only inside its folder and never leaves a mixed or half-written set: links
planted at temporary or final names are never followed or replaced, a second convert into the same
pattern is refused while one runs, and a failed (disk full) or interrupted ``--overwrite`` leaves
the previous set intact with no temporary file behind."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.tools.convert import convert, verify_shards
from dali_bridge.tools.convert_staging import ConvertError
from dali_bridge.data.shards.tar import manifest_path

pytestmark = pytest.mark.slow  # killed converts, held locks and a full tmpfs

# Child processes import this checkout's package.
_ENV = {**os.environ, "PYTHONPATH": str(REPO)}
LIMIT = 120  # seconds: a convert of 37 small images that takes longer is stuck


def _cli(*args: str, timeout: float = LIMIT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dali_bridge", *args], env=_ENV, capture_output=True, text=True,
                          timeout=timeout)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "precious.txt"
    victim.parent.mkdir()
    victim.write_text("keep me")
    return victim


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial") or p.name.endswith(".lock"))


def test_links_planted_at_the_old_temporary_names_are_never_written_through(sample_root, tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    planted = ["s-000000.tar.partial", "s-000000.idx.partial", "s-000001.tar.partial", "s.manifest.json.partial"]
    for name in planted:
        os.symlink(victim, out / name)
    done = _cli("convert", str(sample_root), str(out / "s-%06d.tar"), "--shard-size", "20", "-q")
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "keep me"
    assert all((out / name).is_symlink() for name in planted)  # not ours: left as they were
    assert verify_shards(out / "s.manifest.json") == []
    assert not any(name.startswith(".") for name in os.listdir(out))


@pytest.mark.parametrize("name", ["s-000001.tar", "s-000000.idx", "s.manifest.json"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_link_at_a_final_name_is_refused_never_replaced_or_followed(sample_root, tmp_path, name, overwrite):
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    if overwrite:
        convert(sample_root, str(out / "s-%06d.tar"), shard_size=20)
        (out / name).unlink()
    else:
        out.mkdir()
    os.symlink(victim, out / name)
    done = _cli("convert", str(sample_root), str(out / "s-%06d.tar"), "--shard-size", "20", "-q",
                *(["--overwrite"] if overwrite else []))
    assert done.returncode == EXIT_INVALID, done.stderr
    assert f"output name(s) taken by a link or other non-file: {out / name}" in done.stderr
    assert "Traceback" not in done.stderr
    assert victim.read_text() == "keep me" and (out / name).is_symlink()
    assert _temporaries(out) == []


def test_a_link_planted_at_the_lock_name_is_refused(sample_root, tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / ".s.manifest.json.lock")
    with pytest.raises(ConvertError, match=r"cannot open the lock file .*\.s\.manifest\.json\.lock.*a link"):
        convert(sample_root, str(out / "s-%06d.tar"))
    assert victim.read_text() == "keep me"


_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_convert_into_the_same_pattern_is_refused_until_the_first_ends_even_killed(sample_root, tmp_path):
    out = tmp_path / "out"
    convert(sample_root, str(out / "s-%06d.tar"), shard_size=20)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(out / ".s.manifest.json.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = _cli("convert", str(sample_root), str(out / "s-%06d.tar"), "--shard-size", "10", "-q",
                    "--overwrite")
        assert done.returncode == EXIT_INVALID
        assert f"another convert is writing {out / 's-%06d.tar'}" in done.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.name in before} == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=LIMIT)
    result = convert(sample_root, str(out / "s-%06d.tar"), shard_size=10, overwrite=True)  # released by the kill
    assert len(result.shards) == 4 and verify_shards(result.manifest) == []
    assert _temporaries(out) == []


def test_the_lock_is_held_only_while_converting(sample_root, tmp_path):
    out = tmp_path / "out"
    convert(sample_root, str(out / "s-%06d.tar"), shard_size=20)
    lock = out / ".s.manifest.json.lock"
    assert not lock.exists()
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a convert that went away holds nothing
        with pytest.raises(ConvertError, match="another convert is writing"):
            convert(sample_root, str(out / "s-%06d.tar"), shard_size=20, overwrite=True)
    finally:
        os.close(descriptor)


def _old_set(sample_root: Path, out: Path) -> dict[str, bytes]:
    convert(sample_root, str(out / "s-%06d.tar"), shard_size=20)
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_a_full_disk_during_overwrite_is_a_clear_error_leaving_the_old_set_intact(sample_root, tmp_path,
                                                                                  monkeypatch, capsys):
    import dali_bridge.tools.convert as module

    out = tmp_path / "out"
    before = _old_set(sample_root, out)
    real_write = module._HashingWriter.write

    def fill_up(self, data):
        if self.written + len(data) > 100_000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data)

    monkeypatch.setattr(module._HashingWriter, "write", fill_up)
    code = main(["convert", str(sample_root), str(out / "s-%06d.tar"), "--shard-size", "10", "-q", "--overwrite"])
    assert code == EXIT_INVALID
    err = capsys.readouterr().err
    assert "No space left on device" in err and "the temporary files were removed" in err
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert verify_shards(out / "s.manifest.json") == []


def test_an_interrupt_after_every_shard_is_written_but_before_the_switch_leaves_the_old_set(sample_root, tmp_path,
                                                                                           monkeypatch):
    import dali_bridge.tools.convert as module

    out = tmp_path / "out"
    before = _old_set(sample_root, out)

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(module.Staging, "commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(sample_root, str(out / "s-%06d.tar"), shard_size=10, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root with mount rights only): a real full disk."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                                       capture_output=True).returncode:
        pytest.skip("mounting a 1 MiB tmpfs needs root with mount rights")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_convert_on_a_really_full_disk_exits_2_and_keeps_the_old_set(sample_root, tmp_path, tiny_disk):
    few = tmp_path / "few"
    for path in sorted(sample_root.rglob("*.jpg"))[:8]:
        (few / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, few / path.parent.name / path.name)
    pattern = str(tiny_disk / "s-%06d.tar")
    assert _cli("convert", str(few), pattern, "-q").returncode == 0
    before = {p.name: p.read_bytes() for p in tiny_disk.iterdir()}
    done = _cli("convert", str(sample_root), pattern, "--shard-size", "10", "-q", "--overwrite")
    assert done.returncode == EXIT_INVALID, done.stderr
    assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in tiny_disk.iterdir()} == before
    assert verify_shards(manifest_path(pattern)) == []


def test_temporaries_left_by_a_killed_convert_are_removed_by_the_next_one(sample_root, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    leftovers = [".s-000003.tar.abcd_123.partial", ".s-000000.idx.zz99zz99.partial",
                 ".s.manifest.json.q1w2e3r4.partial"]
    unrelated = [".t-000000.tar.abcd_123.partial", ".notes.txt", "s-000000.tar.partial.bak"]
    for name in leftovers + unrelated:
        (out / name).write_text("left over")
    convert(sample_root, str(out / "s-%06d.tar"), shard_size=20)
    assert all(not (out / name).exists() for name in leftovers)
    assert all((out / name).read_text() == "left over" for name in unrelated)


def test_a_convert_killed_while_writing_leaves_no_shard_and_the_next_one_cleans_up(sample_root, tmp_path):
    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "dali_bridge", "convert", str(sample_root),
                              str(out / "s-%06d.tar"), "--shard-size", "1", "-q"], env=_ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def fifth_shard_under_way() -> bool:
        return out.exists() and any("s-000004.tar" in p.name and p.name.endswith(".partial") for p in out.iterdir())

    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline and child.poll() is None and not fifth_shard_under_way():
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    if child.wait(timeout=LIMIT) == -signal.SIGKILL:  # killed while writing (not already done)
        assert not any(p.name.endswith((".tar", ".idx", ".json")) for p in out.iterdir())
    result = convert(sample_root, str(out / "s-%06d.tar"), shard_size=20)
    assert verify_shards(result.manifest) == [] and _temporaries(out) == []
    assert json.loads(Path(result.manifest).read_text())["samples"] == 37


def test_an_output_folder_that_cannot_be_made_exits_2_without_a_traceback(sample_root, tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    assert main(["convert", str(sample_root), str(tmp_path / "file" / "out" / "s-%06d.tar"), "-q"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"dali-bridge convert: {tmp_path / 'file'}") and "Not a directory" in err


def test_a_failure_between_the_renames_says_the_set_may_be_mixed(sample_root, tmp_path, monkeypatch):
    import dali_bridge.tools.convert as module

    out = tmp_path / "out"
    _old_set(sample_root, out)
    real_replace, calls = os.replace, []

    def second_fails(source, target):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO), target)
        return real_replace(source, target)

    monkeypatch.setattr(module.os, "replace", second_fails)
    with pytest.raises(ConvertError) as info:
        convert(sample_root, str(out / "s-%06d.tar"), shard_size=10, overwrite=True)
    assert "only 1 of 9 files were renamed into place, so the set may be mixed" in str(info.value)
    assert _temporaries(out) == []


def test_shards_get_the_permissions_a_plain_file_would(sample_root, tmp_path):
    mask = os.umask(0o027)
    try:
        result = convert(sample_root, str(tmp_path / "out" / "s-%06d.tar"), shard_size=20)
    finally:
        os.umask(mask)
    for path in [*result.shards, result.manifest]:
        assert os.stat(path).st_mode & 0o777 == 0o640
