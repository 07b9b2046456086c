"""The one place image names come from: one registry and one tag for the three runtime images.

``ImageSet(registry, tag)`` names them; :data:`DEFAULT` is what the repository's ``compiled/`` and
``elyra_templates/`` reference. ``prepline compile --registry R --tag T`` (and
``scripts/build_images.sh --registry R --tag T``) builds, pushes and compiles for another
registry from this one setting. No environment variable changes an image at compile time.

========== ========================== =================================================================
image      Dockerfile                 runs
========== ========================== =================================================================
launcher   runtime_images/launcher    every KFP step but fine_tune, and the Elyra catalog's steps but fine_tune;
                                      it trains the run's shared tokenizer (train_tokenizer), so it holds
                                      the ``tokenize`` extra besides ``kfp``
ray        runtime_images/ray         the head and workers of every stage's KubeRay cluster (the Ray jobs)
trainer    runtime_images/trainer     the fine_tune step (``train_mode=local`` trains in it) and the
                                      TrainJob's trainer nodes (``train_mode=cluster``): the Ray image
                                      plus torch (the ``train`` extra) and kfp
========== ========================== =================================================================

Which prepline extras each image holds is :data:`EXTRAS` (the Dockerfiles' ``PREPLINE_EXTRAS``
agree: ``tests/runtime_images`` checks it, and that every step's imports are in its image).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REGISTRY = "ghcr.io/prepline"
VERSION = "0.1.0"
NAMES = {"launcher": "prepline-launcher", "ray": "prepline-ray", "trainer": "prepline-trainer"}
#: the prepline extras installed in each image (the trainer image is built FROM the Ray image)
EXTRAS = {
    # tokenize: train_tokenizer trains the run's BPE in the launcher (tokenizers); the image still has no Ray
    "launcher": ("kfp", "tokenize"),
    "ray": ("ray", "langid", "fuzzy", "pii", "hap", "tokenize", "ingest"),  # ingest: WARC, zstd, HTML to text
    "trainer": ("ray", "langid", "fuzzy", "pii", "hap", "tokenize", "ingest", "train", "kfp"),
}
_REGISTRY = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ImageSet:
    """The runtime images of one registry and tag."""

    registry: str = REGISTRY
    tag: str = VERSION

    def __post_init__(self) -> None:
        from prepline.errors import ConfigError

        if not _REGISTRY.match(self.registry):
            raise ConfigError(f"image registry {self.registry!r} is not a registry/repository prefix",
                              "e.g. --registry ghcr.io/my-org or --registry registry.example.com:5000/team")
        if not _TAG.match(self.tag):
            raise ConfigError(f"image tag {self.tag!r} is not a valid tag", "letters, digits, '_', '.', '-' (at most 128), e.g. 0.1.0")

    def image(self, kind: str) -> str:
        return f"{self.registry}/{NAMES[kind]}:{self.tag}"

    @property
    def launcher(self) -> str:
        return self.image("launcher")

    @property
    def ray(self) -> str:
        return self.image("ray")

    @property
    def trainer(self) -> str:
        return self.image("trainer")

    def all(self) -> dict[str, str]:
        return {k: self.image(k) for k in NAMES}


DEFAULT = ImageSet()
#: the default images (what code outside a compiled pipeline falls back to)
RAY_IMAGE = DEFAULT.ray
LAUNCHER_IMAGE = DEFAULT.launcher
TRAINER_IMAGE = DEFAULT.trainer
