"""The package's model code, flattened beside a saved model, so the folder loads without difftransformer.

transformers loads a folder's custom code (``trust_remote_code=True``) from the module files its config.json
names in ``auto_map``, together with the files those modules import from the same folder, recursively, as
``from .name import ...`` (``transformers.dynamic_module_utils``). Our configuration and modeling modules import
the rest of the package by absolute name, so ``custom_object_save`` alone would copy two files that still need
difftransformer installed. This module writes what the loader needs instead: the transitive closure of the
package modules that the Auto classes' modules import (at any depth, imports inside functions included), each
as one flat file with its package imports rewritten to relative ones. The files are generated from the
package's sources each time a folder is saved: a folder carries the code of the version that wrote it, and
there is no second copy of the model to keep in step (which committing the generated files would create).
Generation is deterministic, and every file's first line names its source and the content hash of the whole set
(:func:`code_digest`), so two folders run the same model code exactly when their stamps agree;
:func:`stale_model_code` lists what in a folder differs from what this version writes, and
``write_model_code(DIR)`` writes the files anywhere for review.

File names: a module is written as its last dotted name (``difftransformer.ops.common`` -> ``common.py``, a
package's ``__init__`` as the package's name, ``ops.py``); where two modules share a last name, every one of
them except an entry module is written under its whole dotted path below the package
(``ops_diff_attention.py``). The entry modules keep their own names, which are the ones ``auto_map`` and
transformers' ``custom_object_save`` use.

Loaded from such a folder, the code has no C++ kernel source beside it; the attention operators then take their
PyTorch paths (same logits to float32 rounding; docs/sharing.md).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import keyword
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from difftransformer.storage import atomic_write

PACKAGE = "difftransformer"
# The modules whose classes are registered with register_for_auto_class; a test checks this against the package.
ENTRY_MODULES: tuple[str, ...] = (f"{PACKAGE}.models.configuration", f"{PACKAGE}.models.modeling")


class ExportError(RuntimeError):
    """The package's model code uses a construct that cannot be shipped as flat module files."""


@dataclass(frozen=True)
class _Module:
    name: str
    path: Path
    is_package: bool
    source: str
    tree: ast.Module


def running_from_package() -> bool:
    """True in the installed package; False in a copy that transformers loaded from a saved folder, where
    transformers' own ``custom_object_save`` already copies every flat file along (they import each other
    relatively)."""
    return __name__.startswith(PACKAGE + ".")


def _load(name: str) -> _Module:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ExportError(f"cannot find the Python source of module {name!r}")
    path = Path(spec.origin)
    source = path.read_text(encoding="utf-8")
    return _Module(name, path, spec.submodule_search_locations is not None, source, ast.parse(source))


def _is_ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _absolute(module: _Module, node: ast.ImportFrom) -> str:
    """The absolute module name a ``from ... import`` refers to."""
    if node.level == 0:
        return node.module or ""
    base = module.name if module.is_package else module.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _package_imports(module: _Module) -> list[tuple[ast.ImportFrom, str]]:
    """Every ``from <package module> import names`` statement of ``module`` (anywhere in it), with the module
    name it imports from; other import forms of package modules are refused with the reason."""
    found = []
    for node in ast.walk(module.tree):
        where = f"{module.path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ours(alias.name):
                    raise ExportError(
                        f"{where}: `import {alias.name}` cannot be shipped as flat files; "
                        "import names from the module instead (`from module import name`)"
                    )
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            if not _is_ours(target):
                continue
            namespace = vars(importlib.import_module(target))
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if isinstance(namespace.get(alias.name), ModuleType) or (
                    alias.name not in namespace and alias.name != "*" and importlib.util.find_spec(submodule)
                ):
                    raise ExportError(
                        f"{where}: `from {target} import {alias.name}` imports a module as a name, which "
                        f"transformers' loader does not follow; import names from {submodule} instead"
                    )
            found.append((node, target))
    return found


def _closure() -> dict[str, _Module]:
    """The entry modules and every package module they import, transitively."""
    modules: dict[str, _Module] = {}
    pending = list(ENTRY_MODULES)
    while pending:
        name = pending.pop()
        if name in modules:
            continue
        modules[name] = module = _load(name)
        pending.extend(target for _, target in _package_imports(module))
    return modules


def _file_stems(names: list[str]) -> dict[str, str]:
    """Module name -> flat file stem (see the module docstring for the rule)."""

    def below_package(name: str) -> list[str]:
        return name.split(".")[1:] or [PACKAGE]

    leaves = {name: below_package(name)[-1] for name in names}
    shared = {leaf for leaf in leaves.values() if list(leaves.values()).count(leaf) > 1}
    stems = {
        name: "_".join(below_package(name)) if leaf in shared and name not in ENTRY_MODULES else leaf
        for name, leaf in leaves.items()
    }
    clashes = {stem for stem in stems.values() if list(stems.values()).count(stem) > 1}
    bad = sorted(stem for stem in stems.values() if keyword.iskeyword(stem) or not stem.isidentifier())
    if clashes or bad:
        raise ExportError(
            f"the package's model modules do not map onto distinct flat file names: clashes {sorted(clashes)}, "
            f"invalid names {bad}"
        )
    return stems


def _offset(line_starts: list[int], line: int, column: int) -> int:
    return line_starts[line - 1] + column


def _rewrite(module: _Module, stems: dict[str, str]) -> str:
    """The module's source with each package import rewritten to ``from .stem import ...`` on as many lines."""
    line_starts = [0]
    for line in module.source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line.encode("utf-8")))
    data = module.source.encode("utf-8")  # ast columns are byte offsets
    edits = []
    for node, target in _package_imports(module):
        names = ", ".join(
            alias.name + (f" as {alias.asname}" if alias.asname else "") for alias in node.names
        )
        text = f"from .{stems[target]} import {names}" + "\n" * (node.end_lineno - node.lineno)
        start = _offset(line_starts, node.lineno, node.col_offset)
        end = _offset(line_starts, node.end_lineno, node.end_col_offset)
        edits.append((start, end, text.encode("utf-8")))
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text + data[end:]
    return data.decode("utf-8")


def _header(module: _Module, digest: str) -> str:
    try:
        version = f" {importlib.metadata.version(PACKAGE)}"
    except importlib.metadata.PackageNotFoundError:
        version = ""
    relative = Path(*module.name.split(".")).with_suffix(".py")
    if module.is_package:
        relative = relative.with_suffix("") / "__init__.py"
    return (
        f"# Written by {PACKAGE}{version} from {relative.as_posix()}, model code {digest}; "
        "change the package, not this copy.\n"
    )


def code_digest(bodies: dict[str, str]) -> str:
    """The content hash stamped on every file: SHA-256 (first 16 hex digits) over the file names and their text
    without the header line, so two folders carry the same code exactly when their stamps agree."""
    digest = hashlib.sha256()
    for name in sorted(bodies):
        digest.update(f"{name}\0{bodies[name]}\0".encode())
    return digest.hexdigest()[:16]


def model_code() -> dict[str, str]:
    """File name -> text of every flat module file a saved folder needs to load without the package. The same
    sources always give the same text (file names, contents and the stamped :func:`code_digest`)."""
    modules = _closure()
    stems = _file_stems(sorted(modules))
    bodies = {f"{stems[name]}.py": _rewrite(module, stems) for name, module in modules.items()}
    digest = code_digest(bodies)
    return {
        name: _header(modules[module_name], digest) + bodies[name]
        for module_name in sorted(modules)
        for name in [f"{stems[module_name]}.py"]
    }


def stale_model_code(folder: str | os.PathLike) -> list[str]:
    """The code files of a saved ``folder`` that differ from (or are missing against) what this package writes
    now; empty when regenerating would change nothing. Lets a user see whether a folder runs this version's
    model code."""
    folder = Path(folder)
    stale = []
    for name, text in model_code().items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def auto_map() -> dict[str, str]:
    """config.json's ``auto_map``: each class of the entry modules registered with ``register_for_auto_class``,
    as ``{auto class: "module.Class"}`` (empty outside the package: a loaded copy keeps its folder's)."""
    if not running_from_package():
        return {}
    entries = {}
    for name in ENTRY_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, type) and value.__module__ == name and value.__dict__.get("_auto_class"):
                entries[value._auto_class] = f"{name.rpartition('.')[2]}.{value.__name__}"
    return entries


def write_model_code(folder: str | os.PathLike) -> list[Path]:
    """Write :func:`model_code`'s files into ``folder`` (atomically, each replacing what custom_object_save
    copied there); returns their paths. Does nothing in a copy loaded from a folder (see
    :func:`running_from_package`)."""
    if not running_from_package():
        return []
    return [atomic_write(Path(folder) / name, text) for name, text in model_code().items()]


def remove_foreign_sources(folder: str | os.PathLike, model_class: type) -> list[Path]:
    """Delete from ``folder`` the source files transformers' ``custom_object_save`` copied for ``model_class``
    when that class is not the package's own but a wrapper's subclass of it (FSDP2's generated
    ``FSDPDiffTransformerForCausalLM`` lives in torch, so torch's ``_fsdp_*.py`` would land beside our code); the
    folder's code is :func:`model_code`'s alone. Returns the deleted paths."""
    if model_class.__module__.startswith(f"{PACKAGE}.") or not running_from_package():
        return []
    from transformers.dynamic_module_utils import get_relative_import_files

    source = Path(sys.modules[model_class.__module__].__file__)
    copied = {source.name} | {Path(name).name for name in get_relative_import_files(source)}
    removed = []
    for name in sorted(copied - set(model_code())):
        path = Path(folder) / name
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed
