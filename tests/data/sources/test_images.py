"""The header probe the DALI feeder uses must agree with what the reference decoder produces."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from dali_bridge.errors import ImageError
from dali_bridge.data.sources.images import decode_rgb, probe

from tests.helpers.corpus import write_unusual_images
from tests.helpers.exif import with_exif_orientation


def _jpeg(height: int, width: int) -> bytes:
    buffer = io.BytesIO()
    ramp = np.linspace(0, 255, height * width * 3).reshape(height, width, 3).astype(np.uint8)
    Image.fromarray(ramp).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.mark.slow
def test_probe_matches_the_decoded_size_of_every_unusual_image(tmp_path):
    for kind, path in write_unusual_images(tmp_path).items():
        data = path.read_bytes()
        assert probe(data) == tuple(decode_rgb(data).shape[-2:]), kind


@pytest.mark.parametrize("byte_order", ["II", "MM"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_header_probe_applies_exif_orientation_in_either_byte_order(orientation, byte_order):
    data = with_exif_orientation(_jpeg(30, 50), orientation, byte_order)
    expected = (50, 30) if orientation >= 5 else (30, 50)
    assert probe(data) == expected
    assert tuple(decode_rgb(data).shape[-2:]) == expected  # the reference decoder agrees


def test_jpeg_header_probe_refuses_a_scan_without_a_frame_header_before_it():
    data = _jpeg(30, 50)
    sof = data.index(b"\xff\xc0")
    with pytest.raises(ImageError, match="no frame header"):
        probe(data[:sof] + b"\xff\xda\x00\x02" + data[-2:])
    assert probe(data) == (30, 50)
