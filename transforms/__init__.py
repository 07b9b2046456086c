"""The transforms. Each module registers one transform (see :mod:`prepline.registry`)."""
