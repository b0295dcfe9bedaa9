"""The build backend (PEP 517, PEP 660) of the cupool Python package: the standard library only.

`pip install ./python` then needs nothing from an index (pyproject.toml's build-system requires
nothing, so build isolation fetches nothing) and writes nothing into the source tree: the wheel,
the sdist and the metadata are written straight into the directories pip gives.

The wheel holds the package (``cupool/``: its .py files and py.typed) and its .dist-info; the
sdist holds pyproject.toml, README.md, the package and this backend, with PKG-INFO. The metadata
comes from pyproject.toml's [project] table. Archives are reproducible: their timestamps are
$SOURCE_DATE_EPOCH, else 1980-01-01.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "get_requires_for_build_wheel", "get_requires_for_build_sdist", "get_requires_for_build_editable",
    "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable",
    "build_wheel", "build_sdist", "build_editable",
]

_TAG = "py3-none-any"
_SDIST_FILES = ("pyproject.toml", "README.md")


def _forget_own_bytecode() -> None:
    """Python caches this module's bytecode in backend/__pycache__ as it imports it: a cache this
    import wrote (seconds ago) is removed, so that a build leaves the source tree as it found it
    (nothing else is imported from the tree); one that was there before is left alone."""
    cached = globals().get("__cached__")
    here = os.path.dirname(os.path.abspath(__file__))
    if not cached or os.path.dirname(os.path.dirname(os.path.abspath(cached))) != here:
        return
    try:
        if os.stat(cached).st_mtime < time.time() - 5:
            return
        os.remove(cached)
        os.rmdir(os.path.dirname(cached))  # only when nothing else is in it
    except OSError:
        pass


_forget_own_bytecode()


# ---- the hooks ----

def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = _Project(os.getcwd())
    folder = os.path.join(metadata_directory, project.dist_info)
    os.makedirs(folder, exist_ok=True)
    for name, data in project.dist_info_files():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return project.dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    project = _Project(os.getcwd())
    return project.wheel(wheel_directory, project.package_files())


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """A wheel with a .pth file that puts this source tree on sys.path (`pip install -e ./python`)."""
    project = _Project(os.getcwd())
    pth = (project.root + "\n").encode()
    return project.wheel(wheel_directory, [(f"__editable__.{project.name}-{project.version}.pth", pth)])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    project = _Project(os.getcwd())
    base = f"{project.name}-{project.version}"
    here = os.path.dirname(os.path.abspath(__file__))
    files = [(name, _read(os.path.join(project.root, name))) for name in _SDIST_FILES]
    files += project.package_files()
    backend = os.path.relpath(here, project.root).replace(os.sep, "/")
    files += [(f"{backend}/{name}", _read(os.path.join(here, name))) for name in _sources(here)]
    files.append(("PKG-INFO", project.metadata()))
    path = os.path.join(sdist_directory, base + ".tar.gz")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files):
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size, info.mtime, info.mode = len(data), _epoch(), 0o644
            tar.addfile(info, io.BytesIO(data))
    with open(path, "wb") as out, gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=_epoch()) as gz:
        gz.write(raw.getvalue())
    return os.path.basename(path)


# ---- the project ----

class _Project:
    """What pyproject.toml's [project] says, and the package's files."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        table = _load_toml(os.path.join(self.root, "pyproject.toml")).get("project", {})
        self.name: str = table["name"]
        self.version: str = table["version"]
        self.table = table
        self.package = self.name  # the one import package, cupool/
        stem = re.sub(r"[-_.]+", "_", self.name).lower()
        self.dist_info = f"{stem}-{self.version}.dist-info"
        self.wheel_name = f"{stem}-{self.version}-{_TAG}.whl"

    def package_files(self) -> List[Tuple[str, bytes]]:
        """(path in the wheel, content) of the package: .py files and py.typed, no caches."""
        top = os.path.join(self.root, self.package)
        return [(f"{self.package}/{name}", _read(os.path.join(top, name))) for name in _sources(top)]

    def metadata(self) -> bytes:
        """Core metadata 2.1 (METADATA, PKG-INFO)."""
        t = self.table
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        if t.get("description"):
            lines.append(f"Summary: {t['description']}")
        if t.get("requires-python"):
            lines.append(f"Requires-Python: {t['requires-python']}")
        lines += [f"Requires-Dist: {d}" for d in t.get("dependencies", [])]
        for extra, deps in t.get("optional-dependencies", {}).items():
            lines.append(f"Provides-Extra: {extra}")
            lines += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
        body = ""
        readme = t.get("readme")
        if readme:
            lines.append("Description-Content-Type: text/markdown")
            body = "\n" + _read(os.path.join(self.root, readme)).decode()
        return ("\n".join(lines) + "\n" + body).encode()

    def dist_info_files(self) -> List[Tuple[str, bytes]]:
        wheel = f"Wheel-Version: 1.0\nGenerator: cupool_build\nRoot-Is-Purelib: true\nTag: {_TAG}\n"
        return [("METADATA", self.metadata()), ("WHEEL", wheel.encode()),
                ("top_level.txt", (self.package + "\n").encode())]

    def wheel(self, directory: str, files: List[Tuple[str, bytes]]) -> str:
        """Writes the wheel of `files` and the .dist-info (RECORD last) into `directory`."""
        files = files + [(f"{self.dist_info}/{name}", data) for name, data in self.dist_info_files()]
        record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in files)
        files.append((f"{self.dist_info}/RECORD", (record + f"{self.dist_info}/RECORD,,\n").encode()))
        path = os.path.join(directory, self.wheel_name)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in files:
                info = zipfile.ZipInfo(name, date_time=time.gmtime(_epoch())[:6])
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        return self.wheel_name


# ---- helpers ----

def _sources(folder: str) -> List[str]:
    """The files of a package folder that ship: .py files and py.typed, sorted."""
    return sorted(n for n in os.listdir(folder)
                  if (n.endswith(".py") or n == "py.typed") and os.path.isfile(os.path.join(folder, n)))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _epoch() -> int:
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)  # zip starts at 1980


def _load_toml(path: str) -> Dict[str, Any]:
    """pyproject.toml through tomllib (Python 3.11+), else a reader of the subset it uses: tables,
    and keys whose values are strings or one-line arrays of strings."""
    try:
        import tomllib
    except ImportError:
        tomllib = None  # type: ignore[assignment]
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f)
    doc: Dict[str, Any] = {}
    table = doc
    for number, line in enumerate(_read(path).decode().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line)
        if header:
            table = doc
            for key in header.group(1).split("."):
                table = table.setdefault(key, {})
            continue
        pair = re.fullmatch(r'([A-Za-z0-9_-]+|"[^"]*")\s*=\s*("(?:[^"\\]|\\.)*"|\[.*\])', line)
        if not pair:
            raise ValueError(f"{path}:{number}: this backend reads only strings and one-line string arrays")
        key, value = pair.group(1).strip('"'), pair.group(2)
        table[key] = re.findall(r'"((?:[^"\\]|\\.)*)"', value) if value.startswith("[") else value[1:-1]
    return doc
