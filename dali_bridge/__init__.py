"""dali-bridge: a YAML-declared image pipeline, iterated as a PyTorch loader on DALI or torchvision."""
from .spec import PipelineSpec, SpecError, load_spec

__version__ = "0.1.0"

__all__ = ["PipelineSpec", "SpecError", "load_spec", "build_loader", "Loader", "from_timm", "from_torchvision",
           "__version__"]


def __getattr__(name: str):
    # The loader pulls in torch; keep `import dali_bridge` (and spec validation) light.
    if name in ("build_loader", "Loader"):
        from . import loader
        return getattr(loader, name)
    if name in ("from_torchvision", "from_timm"):  # the recipes import torchvision only when converting
        from . import recipes
        return getattr(recipes, name)
    raise AttributeError(name)
