"""The build backend of drc's Python package (PEP 517, in tree: pyproject.toml's backend-path).

Why not setuptools: pip builds a package in an isolated environment into which it first installs the
backend from an index. On a machine without network (most GPU nodes) `pip install ./src/python` then
fails unless the user knows --no-build-isolation. This backend needs nothing outside the standard
library, so pip has nothing to fetch, and it writes nothing into the source folder (setuptools writes
egg-info there), so an installed, read-only copy of the package installs too.

The package is one pure-Python folder, drc_torch/; a wheel is a zip of it plus three metadata files
(the wheel format, PEP 427 and the core metadata spec). The name, version and description are read
from pyproject.toml's [project] table, which stays the one place they are written.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = "drc_torch"
_TORCH = "torch>=2.5"       # Pool needs torch.cuda.MemPool (drc_torch checks it and says so)


def _project():
    """name, version, description and requires-python of pyproject.toml's [project] table."""
    with open(os.path.join(_HERE, "pyproject.toml")) as f:
        text = f.read()
    table = text.split("[project]", 1)[1].split("\n[", 1)[0]
    values = dict(re.findall(r'^([a-z-]+)\s*=\s*"([^"]*)"', table, re.M))
    return values["name"], values["version"], values.get("description", ""), values.get("requires-python", "")


def _dist(name, version):
    return "%s-%s" % (re.sub(r"[-_.]+", "_", name).lower(), version)


def _metadata():
    name, version, summary, python = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version, "Summary: " + summary]
    if python:
        lines.append("Requires-Python: " + python)
    lines += ["Provides-Extra: torch", 'Requires-Dist: %s; extra == "torch"' % _TORCH]
    return "\n".join(lines) + "\n"


def _wheel(wheel_directory, files):
    """Write a py3-none-any wheel holding @files ([(archive name, bytes)]) and its metadata."""
    name, version = _project()[:2]
    dist = _dist(name, version)
    info = dist + ".dist-info"
    files = list(files) + [
        (info + "/METADATA", _metadata().encode()),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: drc_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = []
    path = os.path.join(wheel_directory, dist + "-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append(info + "/RECORD,,")
        z.writestr(info + "/RECORD", "\n".join(record) + "\n")
    return os.path.basename(path)


def _sources():
    folder = os.path.join(_HERE, _PACKAGE)
    for f in sorted(os.listdir(folder)):
        if f.endswith(".py"):
            with open(os.path.join(folder, f), "rb") as src:
                yield "%s/%s" % (_PACKAGE, f), src.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _sources())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install (pip install -e): a .pth file that puts this folder on sys.path."""
    return _wheel(wheel_directory, [(_PACKAGE + ".pth", (_HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version = _project()[:2]
    dist = _dist(name, version)
    path = os.path.join(sdist_directory, dist + ".tar.gz")
    members = [("pyproject.toml", None), ("drc_build.py", None)] + list(_sources())
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arc, data in members + [("PKG-INFO", _metadata().encode())]:
            if data is None:
                with open(os.path.join(_HERE, arc), "rb") as f:
                    data = f.read()
            ti = tarfile.TarInfo("%s/%s" % (dist, arc))
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    return os.path.basename(path)
