"""The package as installed: its parts, its stubs, its types."""

from __future__ import annotations

import importlib.resources
import io

import ext4kit


def test_the_package_ships_its_stubs_and_py_typed():
    files = importlib.resources.files("ext4kit")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_ext4kit.pyi").is_file()
    assert ext4kit.__version__


def test_public_names():
    assert issubclass(ext4kit.File, io.RawIOBase)
    assert issubclass(ext4kit.BuildError, OSError)
    assert issubclass(ext4kit.Filesystem, ext4kit._ext4kit.Filesystem)
    for name in ext4kit.__all__:
        assert hasattr(ext4kit, name), name
