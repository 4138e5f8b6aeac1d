"""The memory check with views counts every view's batch, and names each view's shape."""
from __future__ import annotations

from dali_bridge.loader.limits import HostLimits, loader_limit_problems
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict


def _spec(count: int):
    return spec_from_dict({"version": 1, "batch_size": 64, "source": {"type": "folder", "root": "/x"},
                           "views": {"crops": {"count": count, "ops": [{"center_crop": 224}]}},
                           "outputs": ["views", "label"], "loader": {"workers": 2, "prefetch": 100}},
                          origin="p.yaml")


def test_the_batch_buffers_of_every_view_count_against_the_memory():
    host = HostLimits(cores=2, open_files=1024, memory_available=8 << 30)
    # 102 float32 batches of 64 x 3 x 224 x 224 (38.5 MB) fit half of 8 GiB; of ten views each, they do not
    one = loader_limit_problems(_spec(1), build_plan(_spec(1)), backend="dali-cpu", host=host)
    ten = loader_limit_problems(_spec(10), build_plan(_spec(10)), backend="dali-cpu", host=host)
    assert one == []
    assert [p.path for p in ten] == ["loader.prefetch"]
    assert " + ".join(["64x3x224x224"] * 10) in ten[0].message
