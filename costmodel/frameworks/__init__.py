"""Framework profiles: what Megatron-Core, torchtitan, DeepSpeed or the Hugging Face Trainer keep and run."""

from costmodel.frameworks.profiles import (
    DEFAULT,
    FrameworkProfile,
    builtin_frameworks,
    load_framework,
)

__all__ = ["DEFAULT", "FrameworkProfile", "builtin_frameworks", "load_framework"]
