"""The pipeline reference page is generated from the op registry and the spec's keys, and the
committed page is the one they give today."""
from __future__ import annotations

from tests.helpers.paths import REPO, TRAIN
from dali_bridge.spec import reference
from dali_bridge.ops.registry import OPS
from dali_bridge.spec.pipeline import load_spec, spec_from_dict

PAGE = REPO / "docs" / "pipeline-reference.md"


def _dotted_keys(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        if isinstance(value, dict) and key in ("source", "decode", "loader"):
            keys |= _dotted_keys(value, f"{prefix}{key}.")
        else:
            keys.add(prefix + key)
    return keys


def test_committed_page_is_the_one_the_registry_gives():
    assert PAGE.read_text() == reference.render_reference(), (
        "docs/pipeline-reference.md is stale: "
        "run python -m dali_bridge.spec.reference --write docs/pipeline-reference.md")


def test_check_mode_fails_on_a_stale_page(tmp_path, capsys):
    stale = tmp_path / "page.md"
    stale.write_text(reference.render_reference().replace("random_resized_crop", "random_crop"))
    assert reference.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert reference.main(["--write", str(stale)]) == 0 and reference.main(["--check", str(stale)]) == 0


def test_every_op_and_parameter_of_the_registry_is_documented():
    page = reference.render_reference()
    for name, op in OPS.items():
        section = page.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        assert op.doc in section
        for param in op.params:
            assert f"| `{param.name}` |" in section, (name, param.name)


def test_every_key_a_resolved_pipeline_holds_is_documented(tmp_path):
    documented = set(reference.documented_keys())
    folder = load_spec(TRAIN).to_dict()
    file_list = spec_from_dict({**folder, "source": {"type": "file_list", "file_list": str(tmp_path / "list.txt")}})
    shards = spec_from_dict({**folder, "source": {"type": "webdataset", "shards": str(tmp_path / "s-{0..1}.tar"),
                                                  "manifest": str(tmp_path / "s.manifest.json")}})
    for spec_data in (folder, file_list.to_dict(), shards.to_dict()):
        missing = _dotted_keys(spec_data) - documented
        assert not missing, f"keys not in the reference: {sorted(missing)}"
