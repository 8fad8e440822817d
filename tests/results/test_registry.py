"""The table of loadable result classes is exactly identifiable's `Result` subclasses: a new
result class that is not listed could be saved but never loaded, and a listed name that no
longer exists (a module moved) would make every file of that class unloadable."""

from __future__ import annotations

import importlib
import pkgutil

import identifiable
from identifiable.results import Result
from identifiable.results.files import RESULT_CLASSES, class_name, resolve_class


def _all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_all_subclasses(sub)}
    return out


def test_every_result_class_of_the_package_is_listed() -> None:
    for info in pkgutil.walk_packages(identifiable.__path__, "identifiable."):
        if info.name != "identifiable.__main__":
            importlib.import_module(info.name)
    ours = {
        class_name(c) for c in _all_subclasses(Result) if c.__module__.startswith("identifiable.")
    }
    assert ours == set(RESULT_CLASSES)
    assert len(RESULT_CLASSES) == len(set(RESULT_CLASSES))


def test_every_listed_name_resolves_to_that_class() -> None:
    for name in RESULT_CLASSES:
        cls = resolve_class(name, "f.st")
        assert issubclass(cls, Result) and class_name(cls) == name


def test_files_naming_a_moved_class_still_load_it() -> None:
    """attention/certify.py became attention/intervals.py: files written before name the
    old module, and still resolve to the class, which is the only one of that name."""
    from identifiable.attention.intervals import IntervalMap, Witness
    from identifiable.results.files import FORMER_NAMES

    assert resolve_class("identifiable.attention.certify:Witness", "old.safetensors") is Witness
    assert resolve_class("identifiable.attention.certify:IntervalMap", "f") is IntervalMap
    assert all(new in RESULT_CLASSES for new in FORMER_NAMES.values())
    assert not set(FORMER_NAMES) & set(RESULT_CLASSES)
