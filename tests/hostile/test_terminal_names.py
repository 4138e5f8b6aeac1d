"""Names from data or files reach the terminal escaped: a downloaded dataset whose file, class or
pipeline names hold escape sequences, newlines, carriage returns or bidi overrides cannot clear the
screen, retitle the window or forge log lines in `run`'s table, the bad-sample error, the skip
warnings or `convert`'s left-out list."""
from __future__ import annotations

import logging

import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import VAL
from dali_bridge.cli.main import main
from dali_bridge.tools.convert import convert
from dali_bridge.errors import SampleError
from dali_bridge.util.quoting import MAX_NAME, safe_name
from dali_bridge.spec.model import DEFAULT_EXTENSIONS
from dali_bridge.data.sources.local import list_folder
from tests.helpers.hostile import break_file, write_image_folder

HOSTILE = ["\x1b[2J", "\n", "\r", "\u202e"]
# What may not reach a terminal from a name: ESC, line breaks and the right-to-left override.
RAW = ("\x1b", "\r", "\u202e")


def _clean(text: str) -> bool:
    return not any(char in text for char in RAW)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_safe_name_escapes_control_format_and_line_characters(hostile):
    shown = safe_name(f"cls{hostile}x.jpg")
    assert _clean(shown) and "\n" not in shown
    assert shown == repr(f"cls{hostile}x.jpg")


def test_safe_name_keeps_printable_names_as_they_are_and_shortens_long_ones():
    assert safe_name("data/日本 photo é.jpg") == "data/日本 photo é.jpg"
    long = safe_name("a" * 20_000_000)
    assert len(long) <= MAX_NAME and "characters ..." in long


@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_bad_sample_error_escapes_the_file_name(hostile):
    message = str(SampleError(3, f"/data/evil{hostile}name.jpg", "not a JPEG"))
    assert _clean(message) and "\n" not in message
    assert message.startswith("sample 3 (") and message.endswith("): not a JPEG")


def _hostile_folder(tmp_path, hostile: str):
    """A two-class folder whose first class and first file carry ``hostile`` in their names, the file broken."""
    files = write_image_folder(tmp_path / "data", classes=2, per_class=3)
    evil_class = files[0].parent.with_name(f"class{hostile}0")
    files[0].parent.rename(evil_class)
    evil = evil_class / f"img{hostile}000.jpg"
    (evil_class / files[0].name).rename(evil)
    break_file(evil, "zero_bytes")
    return tmp_path / "data", evil


@pytest.mark.parametrize("hostile", HOSTILE)
def test_skip_warnings_escape_the_file_name(tmp_path, hostile, caplog, write_pipeline):
    from dali_bridge.loader.loader import build_loader
    from dali_bridge.spec.pipeline import load_spec

    root, evil = _hostile_folder(tmp_path, hostile)
    spec = load_spec(write_pipeline(VAL, source={"type": "folder", "root": str(root)},
                                    loader={"workers": 0, "on_error": "skip", "shuffle": False}, batch_size=2))
    loader = build_loader(spec, "torchvision")
    try:
        with caplog.at_level(logging.WARNING, logger="dali_bridge"):
            for _ in loader:
                pass
    finally:
        loader.close()
    warnings = [r.getMessage() for r in caplog.records if "skipped sample" in r.getMessage()]
    assert len(warnings) == 1 and _clean(warnings[0]) and "\n" not in warnings[0]
    assert repr(str(evil)) in warnings[0]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_converts_left_out_list_escapes_the_file_name(tmp_path, hostile, capsys):
    root, evil = _hostile_folder(tmp_path, hostile)
    assert main(["convert", str(root), str(tmp_path / "out" / "s-%06d.tar"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "left out 1 file(s)" in err and repr(str(evil)) in err
    assert _clean(err) and len(err.splitlines()) == 2


@pytest.mark.parametrize("hostile", HOSTILE)
def test_runs_table_and_bad_sample_error_escape_file_and_pipeline_names(tmp_path, hostile, capsys,
                                                                          write_pipeline):
    root, evil = _hostile_folder(tmp_path, hostile)
    pipeline = write_pipeline(VAL, name=f"evil{hostile}pipe", source={"type": "folder", "root": str(root)})
    code = main(["run", str(pipeline), "--backends", ",".join(CPU_BACKENDS), "-q",
                 "--set", "batch_size=2", "--set", "loader.workers=0", "--set", "loader.shuffle=false"])
    assert code == 1
    captured = capsys.readouterr()
    assert _clean(captured.out) and _clean(captured.err)
    assert repr(f"evil{hostile}pipe") in captured.out and repr(str(evil)) in captured.err
    table = captured.out.splitlines()
    assert len(table) == 2 + len(CPU_BACKENDS)  # header, rule, one line per run: no forged lines


@pytest.mark.parametrize("hostile", ["\x1b[2J", "\u202e"])
def test_listing_messages_escape_class_folder_names(tmp_path, hostile):
    from dali_bridge.errors import SourceError

    write_image_folder(tmp_path / "data", classes=1, per_class=2)
    (tmp_path / "data" / f"empty{hostile}").mkdir()
    with pytest.raises(SourceError) as info:
        list_folder(tmp_path / "data", DEFAULT_EXTENSIONS)
    assert _clean(str(info.value)) and repr(f"empty{hostile}") in str(info.value)


def test_convert_result_lists_at_most_twenty_left_out_files_escaped(tmp_path):
    files = write_image_folder(tmp_path / "data", classes=1, per_class=23)
    for number, path in enumerate(files[:22]):
        evil = path.with_name(f"bad\x1b]0;title\x07{number}.jpg")
        path.rename(evil)
        break_file(evil, "zero_bytes")
    result = convert(tmp_path / "data", str(tmp_path / "out" / "s-%06d.tar"))
    text = result.describe_skipped()
    assert _clean(text) and "\x07" not in text and text.endswith("... and 2 more")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_shard_listing_problems_escape_member_names(tmp_path, hostile):
    import io
    import tarfile

    from dali_bridge.errors import SourceError
    from dali_bridge.data.sources.webdataset import list_webdataset
    from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
    from tests.helpers.hostile import tiny_jpeg

    shard = tmp_path / "s-0.tar"
    with tarfile.open(shard, "w") as archive:
        data = tiny_jpeg(1)
        info = tarfile.TarInfo(f"evil{hostile}key.jpg")  # an image without its label member
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(SourceError) as info:
        list_webdataset(str(shard), DEFAULT_IMAGE_KEYS)
    message = str(info.value)
    assert "has no label member" in message and repr(f"evil{hostile}key") in message
    assert _clean(message) and len(message.splitlines()) == 2


@pytest.mark.parametrize("hostile", HOSTILE)
def test_compares_worst_list_escapes_file_names(hostile):
    import numpy as np
    import torch

    from dali_bridge.tools.compare import compare_batches
    from dali_bridge.ops.finish import Finish

    images = torch.from_numpy(np.random.default_rng(0).integers(0, 200, (2, 3, 4, 4), dtype=np.uint8))
    indices = torch.arange(2)
    paths = [f"/data/evil{hostile}0.jpg", "/data/ok.jpg"]
    result = compare_batches([(images, indices)], [(images + 1, indices)], ["image", "index"], Finish(), paths,
                             keep_worst=2)
    text = result.format()
    assert repr(paths[0]) in text and _clean(text)
    assert sum("/data/" in line for line in text.splitlines()) == 2


def test_verify_escapes_shard_names_from_the_manifest(sample_root, tmp_path, capsys):
    import json
    from pathlib import Path

    result = convert(sample_root, str(tmp_path / "out" / "s-%d.tar"), shard_size=40)
    manifest = json.loads(Path(result.manifest).read_text())
    manifest["shards"][0]["file"] = "gone\x1b[2J\r.tar"
    Path(result.manifest).write_text(json.dumps(manifest))
    assert main(["verify", result.manifest]) == 1
    out = capsys.readouterr().out
    assert _clean(out) and repr(str(tmp_path / "out" / "gone\x1b[2J\r.tar")) + ": missing" in out
