"""Put on PYTHONPATH by tests/runtime_images/test_image_contents.py. In every Python process of a step
(and its subprocesses, which inherit the environment):

* with $PREPLINE_IMPORT_ALLOW (a file of top-level folder names under site-packages): a top-level
  module that would load from site-packages outside those folders is not found, as in an image
  without that package (a guarded ``try: import x`` takes its fallback, an unguarded one fails the
  step); what was hidden is logged to $PREPLINE_IMPORT_LOG.hidden;
* with $PREPLINE_IMPORT_LOG: the top-level modules imported, with their files, are appended there at exit.
"""

import atexit
import importlib.machinery
import os
import sys

_LOG = os.environ.get("PREPLINE_IMPORT_LOG")
_ALLOW = os.environ.get("PREPLINE_IMPORT_ALLOW")


def _site_top(origin: str) -> str | None:
    parts = os.path.realpath(origin).split(os.sep)
    return parts[parts.index("site-packages") + 1].split(".")[0] if "site-packages" in parts[:-1] else None


class _ImageOnly:
    """Stands in for the path finder: top-level modules that would load from site-packages outside
    the image's folders are not found (``find_spec`` None, ``import`` ModuleNotFoundError), as in the
    image; everything else is the path finder's answer."""

    def __init__(self, allowed: set):
        self.allowed = allowed

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name:
            return importlib.machinery.PathFinder.find_spec(name, path, target)
        namespace = None
        for entry in list(sys.path):
            spec = importlib.machinery.PathFinder.find_spec(name, [entry or os.getcwd()], target)
            if spec is None:
                continue
            origin = spec.origin if spec.origin not in (None, "namespace") else next(iter(spec.submodule_search_locations or []), "")
            top = _site_top(origin) if origin else None
            if top is None or top in self.allowed or top.startswith("__editable__"):
                if spec.loader is None or spec.origin in (None, "namespace"):
                    # a folder without __init__ (e.g. Ray's session folder /tmp/ray in the current directory):
                    # as the path finder does, a regular module later on the path wins over a namespace portion
                    namespace = namespace or spec
                    continue
                return spec
            if _LOG:
                with open(_LOG + ".hidden", "a") as f:
                    f.write(f"{name}\t{origin}\n")
        return namespace

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()

    def find_distributions(self, *args, **kwargs):  # importlib.metadata (package metadata only)
        return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)


if _ALLOW:
    with open(_ALLOW) as f:
        _at = next((i for i, m in enumerate(sys.meta_path) if m is importlib.machinery.PathFinder), None)
        if _at is not None:
            sys.meta_path[_at] = _ImageOnly(set(f.read().split()))


def _dump() -> None:
    lines = set()
    for name, mod in list(sys.modules.items()):
        if name and "." not in name:
            lines.add(f"{name}\t{getattr(mod, '__file__', None) or ''}")
    with open(_LOG, "a") as f:
        f.write("\n".join(sorted(lines)) + "\n")


if _LOG:
    atexit.register(_dump)
