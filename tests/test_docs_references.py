"""Every module, folder and function the docs name in backticks exists, and so does every
name the package's docstrings give with a path: a module moved or a function renamed must not
leave them pointing at nothing (``observability/queue.py`` was named long after it was gone).
Tests named by docs/robustness.md are checked by test_robustness_doc.py; Scrapy's own tests
named by docs/scrapy-suite.md are Scrapy's."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "meteorseed_scrapy"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# `queue/keys.py`, `keys.py`, `ack.lua`; `queue/plumbing/replies.text_of`; `worker/`;
# `TaskWriter.enqueue` (a class of the package, and its attribute)
FILE = re.compile(r"((?:[a-z_0-9]+/)*)([a-z_0-9]+\.(?:py|lua))")
NAME = re.compile(r"((?:[a-z_0-9]+/)+[a-z_0-9]+)\.([A-Za-z_][A-Za-z_0-9.]*)")
FOLDER = re.compile(r"(?:[a-z_0-9]+/)+")
METHOD = re.compile(r"([A-Z][A-Za-z0-9]+)\.([a-z_][a-z_0-9]*)")
DATA_SUFFIXES = ("md", "txt", "yml", "yaml", "json", "toml", "cfg", "html", "js", "css", "sh")


def references() -> list[tuple[str, str]]:
    found = set()
    for doc in DOCS:
        for ref in re.findall(r"`([^`\s]+)`", doc.read_text(encoding="utf-8")):
            if ref.startswith("test_") or "/test_" in ref:
                continue  # (tests: test_robustness_doc.py; Scrapy's: not ours)
            if FILE.fullmatch(ref) or FOLDER.fullmatch(ref) or METHOD.fullmatch(ref) or (
                    NAME.fullmatch(ref) and ref.rsplit(".", 1)[1] not in DATA_SUFFIXES):
                found.add((doc.name, ref))
    return sorted(found)


FILES_BY_NAME: dict[str, list[Path]] = {}
CLASSES: dict[str, list[str]] = {}  # class name -> the modules defining one
for _path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.lua")]:
    FILES_BY_NAME.setdefault(_path.name, []).append(_path)
    if _path.suffix == ".py":
        _module = ".".join(_path.relative_to(ROOT).with_suffix("").parts)
        for _name in re.findall(r"^class ([A-Za-z0-9_]+)", _path.read_text(), re.MULTILINE):
            CLASSES.setdefault(_name, []).append(_module.removesuffix(".__init__"))


def has(cls: type, attribute: str) -> bool:
    """``cls`` has ``attribute``, or declares it (a dataclass field without a default)."""
    return hasattr(cls, attribute) or any(
        attribute in getattr(klass, "__annotations__", {}) for klass in cls.__mro__)


def problem(ref: str) -> str | None:
    """Why ``ref`` names nothing, or None when it names something."""
    if FOLDER.fullmatch(ref):
        ok = (PACKAGE / ref).is_dir() or (ROOT / ref).is_dir()
        return None if ok else "no such folder in the package or the repository"
    method = METHOD.fullmatch(ref)
    if method:
        name, attribute = method.groups()
        if name not in CLASSES:
            return None  # (Scrapy's, Python's: not the package's to check)
        if any(has(getattr(importlib.import_module(module), name), attribute)
               for module in CLASSES[name]):
            return None
        return f"{name} has no {attribute}"
    file = FILE.fullmatch(ref)
    if file:
        folder, name = file.groups()
        found = (PACKAGE / ref).is_file() or (ROOT / ref).is_file() or any(
            # a bare name, in the folder the text names; a path from a folder within
            not folder or str(path).endswith("/" + ref) for path in FILES_BY_NAME.get(name, []))
        return None if found else "no such file"
    module, attributes = NAME.fullmatch(ref).groups()  # type: ignore[union-attr]
    dotted = module.replace("/", ".")
    for name in (f"meteorseed_scrapy.{dotted}", dotted):
        try:
            target: object = importlib.import_module(name)
        except ImportError:
            continue
        for attribute in attributes.split("."):
            if not hasattr(target, attribute):
                return f"{name} has no {attribute}"
            target = getattr(target, attribute)
        return None
    return f"no module {dotted}"


def test_the_docs_name_code() -> None:
    assert len(references()) > 100


@pytest.mark.parametrize(("doc", "ref"), references())
def test_what_the_docs_name_exists(doc: str, ref: str) -> None:
    assert problem(ref) is None, f"{doc} names `{ref}`: {problem(ref)}"


@pytest.mark.parametrize(("ref", "expected"), [
    ("observability/queue.py", "no such file"),
    ("queue.py", "no such file"),
    ("queue/plumbing/replies.text_off", "meteorseed_scrapy.queue.plumbing.replies has no"
                                        " text_off"),
    ("worker/nowhere/", "no such folder in the package or the repository"),
    ("nowhere/module.name", "no module nowhere.module"),
    ("TaskWriter.enqueue_all", "TaskWriter has no enqueue_all"),
])
def test_a_dangling_name_is_found(ref: str, expected: str) -> None:
    assert problem(ref) == expected


# -- the package's own docstrings --------------------------------------------------------------

#: ``:mod:`~meteorseed_scrapy.x.y```, ``:func:`.y.f```: full names, and names with a leading
#: dot, from the module or its package. (Sphinx would also take any name ending so: that hid
#: ``.liveness`` written in queue/consume for queue/fleet's.) Bare names are left: they may be
#: Scrapy's or Python's.
ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):"
                  r"`~?((?:meteorseed_scrapy)?\.[\w.]+)`")
#: Every module of the package, by dotted name: its source file.
MODULES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
           for p in PACKAGE.rglob("*.py")}


def resolves(name: str) -> bool:
    """``name`` (dotted, absolute) is a module of the package, or an attribute chain of one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module not in MODULES:
            continue
        target: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if isinstance(target, type) and has(target, attribute):
                target = getattr(target, attribute, None)
            elif hasattr(target, attribute):
                target = getattr(target, attribute)
            else:
                return False
        return True
    return False


def docstring_problem(module: str, ref: str) -> str | None:
    if not ref.startswith("."):
        return None if resolves(ref) else "names nothing"
    package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
    if resolves(module + ref) or resolves(package + ref):
        return None
    return "names nothing in its module or its package"


def docstring_references() -> list[tuple[str, str]]:
    return sorted({(module, ref) for module, path in MODULES.items()
                   for ref in ROLE.findall(path.read_text(encoding="utf-8"))})


def test_the_package_names_its_own_code() -> None:
    assert len(docstring_references()) > 200
    wrong = [f"{module}: `{ref}` {problem}" for module, ref in docstring_references()
             if (problem := docstring_problem(module, ref)) is not None]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("module", "ref"), [
    ("meteorseed_scrapy.queue.consume.consumer", ".tasks"),
    ("meteorseed_scrapy.queue.keys", ".events.append_event"),
    ("meteorseed_scrapy.cli.seeds", "meteorseed_scrapy.task.TaskError"),
])
def test_a_dangling_docstring_name_is_found(module: str, ref: str) -> None:
    assert docstring_problem(module, ref) is not None
