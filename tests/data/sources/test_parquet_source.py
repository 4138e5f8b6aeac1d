"""source: {type: parquet}: Parquet written by pyarrow in the Hugging Face layout (an image struct
{bytes, path} and a ClassLabel label, its names in the schema's `huggingface` metadata).

The contract is the folder source's: the same images in the same order give the same batches on
both CPU backends; ranks share each epoch exactly once; a run resumes exactly; unreadable rows
follow `on_error`; `convert` packs the rows into shards byte for byte.
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.backends import backend_params
from tests.helpers.paths import TRAIN

pa = pytest.importorskip("pyarrow", reason="needs the [parquet] extra (pip install dali-bridge[parquet])")
import pyarrow.parquet as pq  # noqa: E402

from dali_bridge import build_loader  # noqa: E402
from dali_bridge.data.sources import parquet as parquet_module  # noqa: E402
from dali_bridge.errors import SampleError  # noqa: E402
from dali_bridge.errors import SourceError  # noqa: E402
from dali_bridge.data.sources.webdataset import list_webdataset  # noqa: E402
from dali_bridge.data.sources.local import list_folder, list_source  # noqa: E402
from dali_bridge.spec.model import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS  # noqa: E402
from dali_bridge.spec.pipeline import load_spec, spec_from_dict  # noqa: E402
from dali_bridge.spec.problems import SpecError  # noqa: E402

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hf_metadata(names: list[str]) -> dict[bytes, bytes]:
    """The schema metadata `datasets` writes for features {image: Image(), label: ClassLabel(names)}."""
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def write_hf(path: Path, images: list[bytes | None], labels: list[int | None], *, names: list[str] | None,
             row_group_size: int = 4, struct: bool = True, image_column: str = "image") -> Path:
    if struct:
        column = pa.array([None if b is None else {"bytes": b, "path": f"img_{i}.jpg"} for i, b in enumerate(images)],
                          type=IMAGE_STRUCT)
    else:
        column = pa.array(images, type=pa.binary())
    table = pa.table({image_column: column, "label": pa.array(labels, type=pa.int64())})
    if names is not None:
        table = table.replace_schema_metadata(hf_metadata(names))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture(scope="module")
def hf_dataset(sample_root: Path, tmp_path_factory) -> tuple[Path, list]:
    """The 37 sample images in the folder listing's order, as two Parquet files of 20 and 17 rows
    in row groups of 4, with the class folders' names as ClassLabel names."""
    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    data = [Path(p).read_bytes() for p in folder.paths]
    labels = folder.labels.tolist()
    out = tmp_path_factory.mktemp("hf") / "data"
    write_hf(out / "train-00000-of-00002.parquet", data[:20], labels[:20], names=list(folder.classes))
    write_hf(out / "train-00001-of-00002.parquet", data[20:], labels[20:], names=list(folder.classes))
    return out, data


def parquet_source(root: Path, files="train-*.parquet") -> dict:
    return {"type": "parquet", "files": files if isinstance(files, list) else str(root / files)}


def loader_overrides(source: dict, **extra) -> dict:
    return {"source": source, "batch_size": 5, "loader.workers": 1, "ops.0.random_resized_crop.size": 24,
            "outputs": ["image", "label", "index"], **extra}


def epoch(loader) -> list[tuple]:
    return [(image.cpu().numpy().tobytes(), label.tolist(), index.tolist()) for image, label, index in loader]


def test_the_listing_is_the_files_rows_in_order_with_the_classlabel_names(hf_dataset, sample_root):
    root, data = hf_dataset
    spec = load_spec(TRAIN, {"source": parquet_source(root)})
    listing = list_source(spec.source)
    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    assert listing.classes == folder.classes and listing.labels.tolist() == folder.labels.tolist()
    first, second = sorted(str(p) for p in root.glob("*.parquet"))
    assert listing.paths[:2] == (f"{first}#0", f"{first}#1") and listing.paths[20] == f"{second}#0"
    assert [listing.read(i) for i in range(len(listing))] == data   # the stored bytes, untouched


def test_files_may_be_a_list_a_brace_pattern_or_a_glob_and_keep_their_order(hf_dataset):
    root, _ = hf_dataset
    first, second = sorted(str(p) for p in root.glob("*.parquet"))
    listed = list_source(load_spec(TRAIN, {"source": parquet_source(root, [second, first])}).source)
    braced = list_source(load_spec(TRAIN, {"source": parquet_source(root, "train-0000{1,0}-of-00002.parquet")}).source)
    assert listed.paths[0] == braced.paths[0] == f"{second}#0"
    assert listed.paths == braced.paths


@pytest.mark.parametrize("backend", backend_params())
def test_parquet_gives_the_folders_batches_on_each_backend(hf_dataset, sample_root, backend):
    root, _ = hf_dataset
    with build_loader(TRAIN, backend, overrides=loader_overrides(parquet_source(root))) as loader:
        from_parquet = epoch(loader)
    folder = {"type": "folder", "root": str(sample_root)}
    with build_loader(TRAIN, backend, overrides=loader_overrides(folder)) as loader:
        from_folder = epoch(loader)
    assert from_parquet == from_folder and len(from_parquet) == 8


def test_ranks_share_each_epoch_exactly_once(hf_dataset):
    root, _ = hf_dataset
    seen = []
    for rank in range(3):
        with build_loader(TRAIN, "torchvision", overrides=loader_overrides(parquet_source(root)), rank=rank,
                          world_size=3) as loader:
            seen += [i for _, _, indices in epoch(loader) for i in indices]
    assert sorted(seen) == list(range(37))


def test_a_resumed_loader_continues_with_the_next_batch(hf_dataset):
    root, _ = hf_dataset
    overrides = loader_overrides(parquet_source(root))
    with build_loader(TRAIN, "torchvision", overrides=overrides) as loader:
        whole = epoch(loader)
    with build_loader(TRAIN, "torchvision", overrides=overrides) as loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        state = loader.state_dict()
    with build_loader(TRAIN, "torchvision", overrides=overrides) as loader:
        loader.load_state_dict(state)
        assert epoch(loader) == whole[3:]


def broken_dataset(tmp_path: Path, sample_root: Path) -> Path:
    """8 rows: row 2 a JPEG cut short, row 5 a null image, the others whole."""
    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    images: list[bytes | None] = [Path(p).read_bytes() for p in folder.paths[:8]]
    images[2] = images[2][: len(images[2]) // 2]
    images[5] = None
    return write_hf(tmp_path / "broken.parquet", images, folder.labels[:8].tolist(), names=list(folder.classes))


@pytest.mark.parametrize("backend", backend_params())
def test_unreadable_rows_follow_on_error(tmp_path, sample_root, backend):
    path = broken_dataset(tmp_path, sample_root)
    source = {"type": "parquet", "files": str(path)}
    skip = loader_overrides(source, **{"loader.on_error": "skip", "loader.shuffle": False, "batch_size": 4})
    with build_loader(TRAIN, backend, overrides=skip) as loader:
        kept = [i for _, _, indices in epoch(loader) for i in indices]
        skipped = {item.index: (item.path, item.reason) for item in loader.skipped}
    assert kept == [0, 1, 3, 4, 6, 7]
    assert sorted(skipped) == [2, 5]
    assert skipped[2][0] == f"{path}#2" and skipped[5][0] == f"{path}#5"
    assert "no image bytes (null" in skipped[5][1]
    with build_loader(TRAIN, backend, overrides={**skip, "loader.on_error": "raise"}) as loader:
        with pytest.raises(SampleError) as caught:
            epoch(loader)
    assert caught.value.index == 2 and f"{path}#2" in str(caught.value)


def test_a_plain_binary_column_without_metadata_numbers_the_classes(tmp_path, hf_dataset):
    _, data = hf_dataset
    path = write_hf(tmp_path / "plain.parquet", data[:6], [0, 2, 2, 1, 0, 4], names=None, struct=False,
                    image_column="jpg")
    listing = list_source(spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": 8}], "source": {
        "type": "parquet", "files": str(path), "image_column": "jpg"}}).source)
    assert listing.classes == ("0", "1", "2", "3", "4") and listing.read(3) == data[3]


def test_every_listing_problem_is_reported_at_once(tmp_path, hf_dataset):
    _, data = hf_dataset
    write_hf(tmp_path / "a.parquet", data[:2], [0, None], names=["x", "y"])
    write_hf(tmp_path / "b.parquet", data[:2], [0, -1], names=["x", "y"])
    write_hf(tmp_path / "c.parquet", data[:2], [0, 1], names=["x", "z"])
    pq.write_table(pa.table({"image": pa.array([1, 2]), "label": pa.array(["a", "b"])}), tmp_path / "d.parquet")
    with pytest.raises(SourceError) as caught:
        parquet_module.list_parquet((str(tmp_path / "*.parquet"), str(tmp_path / "missing.parquet")))
    assert "missing.parquet does not exist" in str(caught.value)
    write_hf(tmp_path / "e.parquet", data[:1], [0], names=["x", "y"])
    (tmp_path / "missing.parquet").write_bytes(b"not parquet")
    with pytest.raises(SourceError) as caught:
        parquet_module.list_parquet((str(tmp_path / "*.parquet"),))
    message = str(caught.value)
    assert "a.parquet: 1 row without a label (null), e.g. row(s) 1" in message
    assert "b.parquet: row 1: labels must be >= 0, found -1" in message
    assert "c.parquet: its ClassLabel names for 'label' differ from those of" in message
    assert "d.parquet: image column 'image' holds int64, not encoded images" in message
    assert "d.parquet: label column 'label' holds string, expected integer class numbers" in message
    assert "missing.parquet: not a readable Parquet file" in message


def test_the_spec_checks_the_parquet_keys_and_round_trips():
    base = {"version": 1, "batch_size": 2, "ops": [{"center_crop": 8}]}
    with pytest.raises(SpecError) as caught:
        spec_from_dict({**base, "source": {"type": "parquet", "image_column": "", "label_column": 3}})
    text = str(caught.value)
    assert "missing required key 'source.files'" in text and "source.image_column" in text
    assert "source.label_column: expected a column name, found an integer 3" in text
    with pytest.raises(SpecError, match="source.label_column: label_column 'image' is also the image column"):
        spec_from_dict({**base, "source": {"type": "parquet", "files": "/d/a.parquet", "label_column": "image"}})
    with pytest.raises(SpecError, match="did you mean 'files'"):
        spec_from_dict({**base, "source": {"type": "parquet", "file": "/d/a.parquet"}})
    spec = spec_from_dict({**base, "source": {"type": "parquet", "files": ["/d/a.parquet", "/d/b-*.parquet"]}})
    assert spec.source.files == ("/d/a.parquet", "/d/b-*.parquet")
    assert (spec.source.image_column, spec.source.label_column) == ("image", "label")
    assert spec_from_dict(spec.to_dict()) == spec


def test_the_row_group_cache_stays_within_its_bound(hf_dataset, monkeypatch):
    root, data = hf_dataset
    monkeypatch.setattr(parquet_module, "MAX_CACHED_BYTES", 1)   # one row group at a time
    listing = list_source(load_spec(TRAIN, {"source": parquet_source(root)}).source)
    order = np.random.default_rng(0).permutation(len(listing))
    assert [listing.read(int(i)) for i in order] == [data[i] for i in order]
    assert len(listing.shards._cache) == 1
    copy = pickle.loads(pickle.dumps(listing.shards))   # to spawned workers: no cache, no open files
    assert not copy._cache and not copy._open and copy.read(36) == data[36]


def test_convert_packs_parquet_rows_into_shards_byte_for_byte(hf_dataset, tmp_path):
    from dali_bridge.tools.convert import convert

    root, data = hf_dataset
    result = convert(str(root / "train-*.parquet"), str(tmp_path / "train-%06d.tar"), shard_size=16)
    shards = list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS)
    parquet = list_source(load_spec(TRAIN, {"source": parquet_source(root)}).source)
    assert result.samples == 37 and shards.classes == parquet.classes
    assert shards.labels.tolist() == parquet.labels.tolist()
    assert [shards.read(i) for i in range(37)] == data
    assert shards.paths[0].endswith("#train-00000-of-00002/00000000.jpg")


@pytest.mark.slow
def test_without_pyarrow_the_listing_names_the_extra(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["pyarrow"] = None
        from dali_bridge.data.sources.parquet import list_parquet
        from dali_bridge.data.sources.local import SourceError
        try:
            list_parquet(({str(tmp_path / 'x.parquet')!r},))
        except SourceError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install dali-bridge[parquet]" in out


def test_relative_files_resolve_against_the_pipeline_file_and_the_cli_converts_them(hf_dataset, tmp_path, capsys):
    from dali_bridge.cli.main import main

    root, data = hf_dataset
    pipeline = root.parent / "pipeline.yaml"
    pipeline.write_text("version: 1\nbatch_size: 4\nops: [{center_crop: 8}]\n"
                        "source: {type: parquet, files: [data/train-00001-of-00002.parquet]}\n")
    assert list_source(load_spec(pipeline).source).read(0) == data[20]
    assert main(["convert", str(root / "train-*.parquet"), str(tmp_path / "s-%03d.tar"), "-q"]) == 0
    assert "source: {type: webdataset" in capsys.readouterr().out
    assert [list_webdataset(str(tmp_path / "s-000.tar"), DEFAULT_IMAGE_KEYS).read(i) for i in (0, 36)] == \
        [data[0], data[36]]


def test_an_image_over_max_pixels_is_a_sample_error(hf_dataset):
    root, _ = hf_dataset
    overrides = loader_overrides({**parquet_source(root), "max_pixels": 100}, **{"loader.on_error": "skip"})
    with build_loader(TRAIN, "torchvision", overrides=overrides) as loader:
        assert epoch(loader) == []
        assert len(loader.skipped) == 37 and "pixels" in loader.skipped[0].reason


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_an_image_over_max_bytes_is_a_sample_error_on_each_backend(hf_dataset, backend):
    root, _ = hf_dataset
    overrides = loader_overrides({**parquet_source(root), "max_bytes": 1000}, **{"loader.on_error": "skip"})
    with build_loader(TRAIN, backend, overrides=overrides) as loader:
        assert epoch(loader) == []
        assert len(loader.skipped) == 37 and "bytes" in loader.skipped[0].reason


def test_a_damaged_row_group_is_a_sample_error_for_its_rows_only(tmp_path, hf_dataset):
    _, data = hf_dataset
    path = write_hf(tmp_path / "damaged.parquet", data[:8], [0] * 8, names=None, struct=False)
    damaged = bytearray(path.read_bytes())
    damaged[4:40] = b"\xff" * 36   # the first row group's first page header
    path.write_bytes(bytes(damaged))
    overrides = loader_overrides({"type": "parquet", "files": str(path)},
                                 **{"loader.on_error": "skip", "loader.shuffle": False, "batch_size": 4})
    with build_loader(TRAIN, "torchvision", overrides=overrides) as loader:
        kept = [i for _, _, indices in epoch(loader) for i in indices]
        reasons = {item.index: item.reason for item in loader.skipped}
    assert kept == [4, 5, 6, 7] and sorted(reasons) == [0, 1, 2, 3]
    assert reasons[0].startswith(f"cannot read row group 0 of {path}: ") and "\n" not in reasons[0]


# ---- Parquet files at a URL (moto's S3 server on 127.0.0.1, tests/helpers/s3_fixtures.py)

from tests.helpers import s3_fixtures  # noqa: E402
from tests.helpers.backends import CPU_BACKENDS  # noqa: E402

moto_endpoint, fault_proxy = s3_fixtures.moto_endpoint, s3_fixtures.fault_proxy


@pytest.fixture(scope="module")
def s3_parquet(moto_endpoint, hf_dataset) -> str:
    """The two Parquet files uploaded to s3://parquet-bucket/data; the prefix's URL."""
    return s3_fixtures.upload_folder(moto_endpoint, hf_dataset[0], "parquet-bucket", "data")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_parquet_at_a_url_gives_the_local_files_batches_with_faults_retried(hf_dataset, s3_parquet, moto_endpoint,
                                                                            fault_proxy, backend):
    proxy = fault_proxy(moto_endpoint)
    proxy.every = (4, ["503", "reset"])  # every fourth ranged GET fails: footers, labels and images alike
    remote = {"type": "parquet", "files": f"{s3_parquet}/train-*.parquet",
              "storage_options": {"endpoint_url": proxy.endpoint}, "timeout": 30}
    with build_loader(TRAIN, backend, overrides=loader_overrides(remote)) as loader:
        from_url = epoch(loader)
        assert loader.listing.paths[0] == f"{s3_parquet}/train-00000-of-00002.parquet#0"
    with build_loader(TRAIN, backend, overrides=loader_overrides(parquet_source(hf_dataset[0]))) as loader:
        from_disk = epoch(loader)
    assert from_url == from_disk and len(from_url) == 8
    assert proxy.ranged > 0 and set(proxy.injected) == {"503", "reset"}


def parquet_spec(source: dict, base_dir: Path):
    return spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": 8}], "source": source},
                          base_dir=base_dir)


def test_parquet_at_a_url_names_a_missing_file_and_keeps_urls_in_the_spec(s3_parquet, tmp_path):
    files = [f"{s3_parquet}/train-00000-of-00002.parquet", f"{s3_parquet}/train-00009-of-00002.parquet"]
    with pytest.raises(SourceError, match=r"train-00009-of-00002.parquet does not exist") as caught:
        list_source(parquet_spec({"type": "parquet", "files": files}, tmp_path).source)
    assert s3_fixtures.PLANTED_SECRET not in str(caught.value) and s3_fixtures.PLANTED_KEY_ID not in str(caught.value)
    pattern = f"{s3_parquet}/train-{{00000..00001}}-of-00002.parquet"
    spec = parquet_spec({"type": "parquet", "files": pattern, "max_requests": 8}, tmp_path)
    assert spec.source.files == (pattern,) and spec.source.max_requests == 8
    assert spec_from_dict(spec.to_dict(), base_dir=tmp_path).source == spec.source
    assert len(list_source(spec.source)) == 37
    with pytest.raises(SpecError, match="all local or all at URLs"):
        parquet_spec({"type": "parquet", "files": [f"{s3_parquet}/a.parquet", "b.parquet"]}, tmp_path)
    with pytest.raises(SpecError, match="applies to a source at a URL"):
        parquet_spec({"type": "parquet", "files": "b.parquet", "timeout": 3}, tmp_path)


def test_a_row_group_that_keeps_failing_at_a_url_is_a_sample_error_without_credentials(s3_parquet, moto_endpoint,
                                                                                       fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    remote = {"type": "parquet", "files": f"{s3_parquet}/train-00000-of-00002.parquet",
              "storage_options": {"endpoint_url": proxy.endpoint}, "timeout": 5}
    loader = build_loader(TRAIN, "torchvision", overrides=loader_overrides(
        remote, **{"loader.workers": 0, "loader.on_error": "skip", "loader.shuffle": False}))
    proxy.every = (1, ["500"])  # after listing: every read of a row group fails
    seen = [i for _, _, indices in epoch(loader) for i in indices]
    loader.close()
    assert seen == [] and len(loader.skipped) == 20
    reason = loader.skipped[0].reason
    assert "cannot read row group 0 of s3://parquet-bucket/data/train-00000-of-00002.parquet" in reason
    assert s3_fixtures.PLANTED_SECRET not in reason and s3_fixtures.PLANTED_KEY_ID not in reason
