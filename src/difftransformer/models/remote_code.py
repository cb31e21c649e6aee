"""The model's code as flat files beside a saved model, so the folder loads without difftransformer.

transformers loads a folder's custom code (``trust_remote_code=True``) from the files its config.json names in
``auto_map``, together with the files those import relatively (``transformers.dynamic_module_utils``). A folder we
write holds transformers' layout, generated from the package's sources as transformers generates its
``modeling_*.py`` from modular sources:

- ``configuration_difftransformer.py``: the configuration module with the plain-data modules it reads held before
  it (:data:`CONFIGURATION_MODULES`: the space of attention parts and the kinds declared in it), each other name it
  imports from the package written as the literal it is (tuples, dicts, strings, numbers);
- the model's modules (``models/modeling.py`` and the ``ops``, ``layers`` and ``models`` modules it imports, at any
  depth) in three files (:data:`MODEL_FILES`): ``operators_difftransformer.py`` (the attention operators, as
  transformers keeps Llama's SDPA call in its own module), ``loading_difftransformer.py`` (the strict load) and
  ``modeling_difftransformer.py`` (layers and model classes, as ``modeling_llama.py``); package imports become the
  file's own names or relative imports of the file before it.

The flat files hold what the model runs, and no more. Each module is written under a comment naming its source,
dependencies first, without its documentation (its docstring, its definitions' docstrings and its comment lines
stay in that source; a docstring that is a definition's whole body stays, and so do the formatter's and linters'
pragmas) and without the definitions only the package uses (:data:`PACKAGE_ONLY_DEFINITIONS`: the
parameter-matching rules, the quantizer's and the evaluation's readings of the parts, the conversion's rotary
permutation, the check of a folder's files before a resume); the modules' outside imports are gathered at the top,
less the names no code in the file uses.

The configuration and modeling files end by registering their classes for the Auto classes, so that a model loaded
from the folder and saved again carries the files along (transformers' ``custom_object_save`` copies the relative
imports too). The package-only modules (:data:`PACKAGE_ONLY`: the C++ kernels, the blocked CPU path, the decode
step, FlexAttention, the evaluation's logits hook, this writer) are left out: each name imported from one is None
in the flat files, so the operators take their exact PyTorch paths and a folder's configuration writes no code.
Generation is deterministic; every file's first line stamps the content hash of the set (:func:`code_digest`). The
repository commits the generated files under ``hub/`` (and the vLLM plugin a copy, for its strict check of a
folder), a test checks them against the sources, and ``make hub`` writes them again, :func:`write_model_code`
anywhere.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import os
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from difftransformer.storage import atomic_write

PACKAGE = "difftransformer"
CONFIGURATION_MODULE = f"{PACKAGE}.models.configuration"
MODELING_MODULE = f"{PACKAGE}.models.modeling"
CONFIGURATION_FILE = "configuration_difftransformer.py"
MODELING_FILE = "modeling_difftransformer.py"
OPERATORS_FILE = "operators_difftransformer.py"
LOADING_FILE = "loading_difftransformer.py"
# The files the model's modules are written into, in import order: (file, the modules it holds (a module or
# subpackage of the package, "" for the rest; the first that matches), its docstring). The modeling file reads as
# transformers' modeling_llama.py: layers and model classes, with the operators and the strict load beside it as
# transformers' own modules are.
MODEL_FILES = (
    (
        OPERATORS_FILE,
        "ops",
        "Differential and softmax attention operators: the float64-exact reference, the SDPA path and the\n"
        "dispatcher that picks between them, generated from the package's sources named below.",
    ),
    (
        LOADING_FILE,
        "models.loading",
        "Strict loading: a saved folder loads only when its weights are exactly what its config.json describes,\n"
        "generated from the package's source named below.",
    ),
    (
        MODELING_FILE,
        "",
        "The Differential Transformer (DIFF V1, DIFF V2), the kinds compared with it (GDA, gated attention, Motif's\n"
        "attention) and the matched softmax Transformer as transformers models: their layers and model classes,\n"
        "generated from the package's sources named below (documented there).",
    ),
)
# Plain-data modules (no torch) the configuration file holds whole; the modeling file imports their names from it.
CONFIGURATION_MODULES = frozenset({f"{PACKAGE}.layers.parts", f"{PACKAGE}.layers.kinds"})
# Modules the flat files leave out (what they need the package for): a name imported from one is None there.
PACKAGE_ONLY = frozenset(
    {
        f"{PACKAGE}.ops.fused_cpu",
        f"{PACKAGE}.ops.blocked",
        f"{PACKAGE}.ops.decode",
        f"{PACKAGE}.ops.flex",
        f"{PACKAGE}.layers.hooks",
        f"{PACKAGE}.models.remote_code",
    }
)
PACKAGE_ONLY_NOTE = "# package-only (models/remote_code.py): not in this file"
# Definitions in the model's modules that only the package uses (module -> a function or class, or a class's
# method, by qualified name): the parameter-matching rules (models/matching.py), the quantizer's and the
# evaluation's readings of the parts, the conversion's rotary permutation and the check of a folder's files before
# Trainer resumes it. The flat files leave them out, and nothing in them may use one.
PACKAGE_ONLY_DEFINITIONS = {
    f"{PACKAGE}.models.configuration": frozenset(
        {"DiffTransformerConfig.with_attention", "DiffTransformerConfig.matched_baseline"}
    ),
    f"{PACKAGE}.layers.parts": frozenset({"AttentionParts.full_precision", "AttentionParts.maps"}),
    f"{PACKAGE}.layers.rotary": frozenset({"interleaved_to_half_permutation"}),
    f"{PACKAGE}.models.loading": frozenset({"folder_problems"}),
}
LINE_LENGTH = 110  # the project's formatter's (pyproject.toml)
# Comments the flat files keep: they tell the formatter and linters how to read a line.
PRAGMAS = ("# fmt:", "# noqa", "# type:")


class ExportError(RuntimeError):
    """The package's model code uses a construct that cannot be written as the two flat files."""


@dataclass(frozen=True)
class _Module:
    name: str
    path: Path
    source: str
    tree: ast.Module

    @property
    def source_path(self) -> str:
        return Path(*self.name.split(".")).with_suffix(".py").as_posix()


def _load(name: str) -> _Module:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ExportError(f"cannot find the Python source of module {name!r}")
    if spec.submodule_search_locations is not None:
        raise ExportError(f"{name} is a package: import names from its modules, not from the package")
    path = Path(spec.origin)
    source = path.read_text(encoding="utf-8")
    return _Module(name, path, source, ast.parse(source))


def _is_ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _package_imports(module: _Module) -> list[ast.ImportFrom]:
    """The module's ``from <package module> import names`` statements; any other way of importing from the package
    (``import difftransformer...``, relative imports, imports inside functions) is refused with the reason."""
    found = []
    top_level = set(map(id, module.tree.body))
    for node in ast.walk(module.tree):
        where = f"{module.path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import) and any(_is_ours(alias.name) for alias in node.names):
            raise ExportError(f"{where}: import names from the module (`from module import name`)")
        if isinstance(node, ast.ImportFrom) and (node.level or _is_ours(node.module or "")):
            if node.level:
                raise ExportError(f"{where}: use absolute imports of the package's modules")
            if id(node) not in top_level:
                raise ExportError(f"{where}: the flat files need package imports at the top of the module")
            found.append(node)
    return found


def _closure(entry: str, stop: frozenset[str] = frozenset()) -> list[_Module]:
    """``entry`` and every package module it imports, transitively (not past ``stop``), dependencies first, then
    ops before layers before models and in name order (so the order is deterministic)."""
    modules: dict[str, _Module] = {}
    pending = [entry]
    while pending:
        name = pending.pop()
        if name not in modules:
            modules[name] = module = _load(name)
            pending.extend(
                n.module
                for n in _package_imports(module)
                if n.module not in stop and n.module not in PACKAGE_ONLY
            )
    ordered: list[_Module] = []
    placed: set[str] = set()

    def place(name: str, chain: tuple[str, ...]) -> None:
        if name in placed:
            return
        if name in chain:
            raise ExportError(f"import cycle among the model modules: {' -> '.join((*chain, name))}")
        for node in sorted(_package_imports(modules[name]), key=lambda n: n.module):
            if node.module in modules:
                place(node.module, (*chain, name))
        placed.add(name)
        ordered.append(modules[name])

    layers = ("ops", "layers", "models")  # read bottom-up: operators, then modules, then the model
    for name in sorted(modules, key=lambda n: (layers.index(n.split(".")[1]), n)):
        place(name, ())
    return ordered


def _section_header(module: _Module) -> str:
    return f"# ---- {module.source_path} " + "-" * max(0, 100 - len(module.source_path))


def _documentation_lines(module: _Module) -> set[int]:
    """The line numbers of the module's documentation: the docstrings of its functions and classes, at any depth,
    except where the docstring is a definition's whole body, and its comment lines (a line holding only a comment,
    but for the formatter's and linters' pragmas)."""
    lines = module.source.splitlines()
    found: set[int] = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(module.source).readline)
        if token.type == tokenize.COMMENT
        and not token.line[: token.start[1]].strip()
        and not token.string.startswith(PRAGMAS)
    }
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and len(node.body) > 1:
            if ast.get_docstring(node, clean=False) is not None:
                end = node.body[0].end_lineno
                while not lines[end].strip():  # the blank lines after it: a block starts with a statement
                    end += 1
                found.update(range(node.body[0].lineno, end + 1))
    return found


def _package_only_lines(module: _Module) -> set[int]:
    """The line numbers of the module's package-only methods (:data:`PACKAGE_ONLY_DEFINITIONS`), each with the
    blank and comment lines above it; refuses a name the module does not define."""
    wanted = PACKAGE_ONLY_DEFINITIONS.get(module.name, frozenset())
    lines = module.source.splitlines()
    found: set[int] = set()
    seen = {node.name for node in module.tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for cls in (node for node in module.tree.body if isinstance(node, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seen.add(f"{cls.name}.{node.name}")
                if f"{cls.name}.{node.name}" in wanted:
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    while not lines[start - 2].strip() or lines[start - 2].lstrip().startswith("#"):
                        start -= 1
                    found.update(range(start, node.end_lineno + 1))
    if wanted - seen:
        raise ExportError(
            f"{module.path}: PACKAGE_ONLY_DEFINITIONS names {sorted(wanted - seen)}, not defined here"
        )
    return found


def _body(module: _Module) -> tuple[list[str], list[str]]:
    """The module's outside imports (as source lines) and the rest of its top level, without its docstring, its
    package imports, ``from __future__``, ``__all__``, its package-only definitions
    (:data:`PACKAGE_ONLY_DEFINITIONS`) and its documentation (:func:`_documentation_lines`)."""
    imports, body = [], []
    lines = module.source.splitlines()
    dropped = _documentation_lines(module) | _package_only_lines(module)
    package_only = PACKAGE_ONLY_DEFINITIONS.get(module.name, frozenset())
    previous_end = 0
    for index, node in enumerate(module.tree.body):
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        while start - 2 >= previous_end and lines[start - 2].lstrip().startswith("#"):
            start -= 1  # the comment lines right above a statement belong to it
        previous_end = node.end_lineno
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring, written as a comment
        if isinstance(node, ast.ImportFrom) and (node.module == "__future__" or _is_ours(node.module or "")):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        if getattr(node, "name", None) in package_only:
            continue
        text = "\n".join(
            line
            for number, line in enumerate(lines[start - 1 : node.end_lineno], start)
            if number not in dropped
        )
        (imports if isinstance(node, (ast.Import, ast.ImportFrom)) else body).append(text)
    return imports, body


def _defined_names(module: _Module) -> set[str]:
    """The names the module's part of a flat file defines (its package-only definitions left out)."""
    names = set()
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names - {"__all__"} - PACKAGE_ONLY_DEFINITIONS.get(module.name, frozenset())


def _check_imported_names(module: _Module, available: set[str]) -> list[str]:
    """Assignments for the package names ``module`` imports under another name; refuses names nobody defines."""
    aliases = []
    for node in _package_imports(module):
        for alias in node.names:
            if alias.name not in available:
                raise ExportError(
                    f"{module.path}: `{alias.name}` from {node.module} is not defined in the flat file"
                )
            if alias.asname and alias.asname != alias.name:
                aliases.append(f"{alias.asname} = {alias.name}")
    return aliases


def _header(digest: str) -> str:
    try:
        version = f" {importlib.metadata.version(PACKAGE)}"
    except importlib.metadata.PackageNotFoundError:
        version = ""
    return (
        f"# Written by {PACKAGE}{version} from its sources (src/{PACKAGE}: ops, layers, models), model code "
        f"{digest}; change the package, not this file.\n"
    )


def _literal_imports(module: _Module) -> list[str]:
    """The configuration's package imports, each name written as the literal value it has (None for a name from a
    package-only module)."""
    lines = []
    for node in _package_imports(module):
        if node.module in CONFIGURATION_MODULES:
            continue  # held whole in the file
        if node.module in PACKAGE_ONLY:
            lines += [f"{alias.asname or alias.name} = None  {PACKAGE_ONLY_NOTE}" for alias in node.names]
            continue
        namespace = vars(importlib.import_module(node.module))
        for alias in node.names:
            value = namespace[alias.name]
            text = _literal(value)
            try:
                if ast.literal_eval(text) != value:
                    raise ValueError
            except (ValueError, SyntaxError) as err:
                raise ExportError(
                    f"{module.path}: the configuration imports {alias.name} from {node.module}, which is not a "
                    "literal; the configuration file can only carry literals"
                ) from err
            lines.append(f"{alias.asname or alias.name} = {text}")
    return lines


def _auto_registrations(module_file: str) -> list[str]:
    stem = module_file.removesuffix(".py")
    # read here, not imported above: the configuration imports this module
    auto_map = getattr(importlib.import_module(CONFIGURATION_MODULE), "AUTO_MAP", {})
    return [
        f'{target.rpartition(".")[2]}.register_for_auto_class("{auto}")'
        for auto, target in auto_map.items()
        if target.startswith(stem + ".")
    ]


def _name_order(alias: ast.alias) -> tuple[int, str]:
    """isort's order of imported names: constants, then classes, then the rest."""
    name = alias.name
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def _import_block(statements: list[str], used: set[str]) -> str:
    """The modules' outside import statements merged (one ``from`` line per module, aliased names on their own),
    without the names the file does not use (``used``: those a package-only definition alone used), and grouped
    as isort groups them: standard library, third party, then the relative import."""
    plain: set[str] = set()
    names: dict[tuple[int, str], dict[str, ast.alias]] = {}
    aliased: set[tuple[int, str, str, str]] = set()
    for node in (n for statement in statements for n in ast.parse(statement).body):
        bound = [a for a in node.names if (a.asname or a.name.partition(".")[0]) in used]
        if isinstance(node, ast.Import):
            plain.update(ast.unparse(ast.Import(names=[alias])) for alias in bound)
            continue
        for alias in bound:
            if alias.asname:
                aliased.add((node.level, node.module, alias.name, alias.asname))
            else:
                names.setdefault((node.level, node.module), {})[alias.name] = alias
    groups: dict[int, list[tuple[int, str, str]]] = {0: [], 1: [], 2: []}

    def group(level: int, module: str) -> int:
        return 2 if level else 0 if module.partition(".")[0] in sys.stdlib_module_names else 1

    for line in plain:
        module = line.removeprefix("import ").split(" as ")[0]
        groups[group(0, module)].append((0, module, line))
    for (level, module), found in names.items():
        ordered = [a.name for a in sorted(found.values(), key=_name_order)]
        line = f"from {'.' * level}{module} import {', '.join(ordered)}"
        if len(line) > LINE_LENGTH:  # as the formatter wraps it: one name a line, a trailing comma
            line = (
                f"from {'.' * level}{module} import (\n" + "".join(f"    {name},\n" for name in ordered) + ")"
            )
        groups[group(level, module)].append((1, module, line))
    for level, module, name, asname in aliased:
        groups[group(level, module)].append(
            (1, module, f"from {'.' * level}{module} import {name} as {asname}")
        )
    return "\n\n".join("\n".join(line for *_, line in sorted(lines)) for lines in groups.values() if lines)


def _literal(value: object, indent: str = "") -> str:
    """``value`` as source, as the formatter writes it: strings in double quotes, tuples on one line, a non-empty
    dict one item a line with a trailing comma (which keeps it so)."""
    if isinstance(value, tuple):
        items = ", ".join(_literal(item) for item in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, dict) and value:
        inner = indent + "    "
        items = "".join(f"{inner}{_literal(k)}: {_literal(v, inner)},\n" for k, v in value.items())
        return "{\n" + items + indent + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _file(docstring: str, imports: list[str], sections: list[str], epilogue: list[str]) -> str:
    registrations = "# transformers copies this file along when a model loaded from it is saved again\n"
    body = "\n\n\n".join([*sections, *([registrations + "\n".join(epilogue)] if epilogue else [])])
    used = {node.id for node in ast.walk(ast.parse(body)) if isinstance(node, ast.Name)}
    head = f'"""{docstring}"""\n\nfrom __future__ import annotations\n\n{_import_block(imports, used)}'
    first_code = next(line for line in body.splitlines() if line and not line.startswith("#"))
    # as isort writes it: two blank lines after the imports before a definition, one before anything else
    gap = "\n\n\n" if first_code.startswith(("def ", "class ", "@")) else "\n\n"
    return f"{head}{gap}{body}\n"


def _held_modules() -> list[_Module]:
    """The :data:`CONFIGURATION_MODULES`, dependencies first."""
    module = _load(CONFIGURATION_MODULE)
    others = frozenset(n.module for n in _package_imports(module) if n.module not in CONFIGURATION_MODULES)
    return [m for m in _closure(CONFIGURATION_MODULE, stop=others) if m.name in CONFIGURATION_MODULES]


def _configuration_body() -> str:
    module = _load(CONFIGURATION_MODULE)
    imports, body = _body(module)
    sections = []
    for held in _held_modules():
        held_imports, held_body = _body(held)
        imports += held_imports
        sections.append(_section_header(held) + "\n" + "\n\n\n".join(held_body))
    constants = "\n".join(_literal_imports(module))
    doc = f"The Differential Transformer's configuration, generated from {module.source_path} and the modules it holds."
    sections += [constants, "\n\n\n".join(body)]
    return _file(doc, imports, sections, _auto_registrations(CONFIGURATION_FILE))


def _file_of(module: str) -> str:
    inner = module.removeprefix(PACKAGE + ".")
    return next(name for name, held, _ in MODEL_FILES if held in ("", inner) or inner.startswith(held + "."))


def _model_bodies() -> dict[str, str]:
    """The model's files (:data:`MODEL_FILES`) as text; a package import becomes the file's own name, a relative
    import from the file that defines it, or None where it comes from a package-only module."""
    in_configuration = frozenset({CONFIGURATION_MODULE, *CONFIGURATION_MODULES})
    modules = _closure(MODELING_MODULE, stop=in_configuration)
    defined: dict[str, str] = {
        name: CONFIGURATION_MODULE
        for held in (_load(CONFIGURATION_MODULE), *_held_modules())
        for name in _defined_names(held)
    }
    # each file's outside imports, its sections, and the (file, name) pairs it imports from the files before it
    files = {name: ([], [], set()) for name, _, _ in MODEL_FILES}
    none_in = {name: set() for name in files}  # the package-only names each file sets to None
    for module in modules:
        clashes = {name: defined[name] for name in _defined_names(module) if name in defined}
        if clashes:
            raise ExportError(
                f"{module.name} defines names another model module defines too, which the flat files cannot hold: "
                + ", ".join(f"{name} ({where})" for name, where in sorted(clashes.items()))
            )
        file = _file_of(module.name)
        imports, sections, taken = files[file]
        absent = [
            alias.asname or alias.name
            for node in _package_imports(module)
            if node.module in PACKAGE_ONLY
            for alias in node.names
            if (alias.asname or alias.name) not in none_in[file]
        ]
        none_in[file].update(absent)
        aliases = [f"{name} = None  {PACKAGE_ONLY_NOTE}" for name in absent]
        aliases += _check_imported_names(module, set(defined) | set(absent))
        for node in _package_imports(module):
            if node.module in in_configuration:
                taken.update((CONFIGURATION_FILE, alias.name) for alias in node.names)
            elif node.module not in PACKAGE_ONLY and _file_of(node.module) != file:
                taken.update((_file_of(node.module), alias.name) for alias in node.names)
        defined.update(dict.fromkeys(_defined_names(module), module.name))
        module_imports, body = _body(module)
        imports += module_imports
        sections.append(_section_header(module) + "\n" + "\n\n\n".join(aliases + body))
    bodies = {}
    for name, _, doc in MODEL_FILES:
        imports, sections, taken = files[name]
        # a name a module only re-exports (its __all__, which the flat files drop) is not imported
        used = {node.id for node in ast.walk(ast.parse("\n\n".join(sections))) if isinstance(node, ast.Name)}
        for source in sorted({source for source, n in taken if n in used}):
            names = sorted(n for s, n in taken if s == source and n in used)
            imports.append(f"from .{source.removesuffix('.py')} import {', '.join(names)}")
        bodies[name] = _file(doc, imports, sections, _auto_registrations(name))
    return bodies


def _check_package_only_unused(bodies: dict[str, str]) -> None:
    """Refuse flat files that use a definition they leave out (:data:`PACKAGE_ONLY_DEFINITIONS`): a function or
    class by its name, a method as an attribute."""
    left_out = {q.rpartition(".")[2]: q for names in PACKAGE_ONLY_DEFINITIONS.values() for q in names}
    for name, text in bodies.items():
        for node in ast.walk(ast.parse(text)):
            qualified = left_out.get(node.id if isinstance(node, ast.Name) else getattr(node, "attr", None))
            if qualified is not None and ("." in qualified) == isinstance(node, ast.Attribute):
                raise ExportError(
                    f"{name} uses {qualified}, which only the package has (PACKAGE_ONLY_DEFINITIONS)"
                )


def code_digest(bodies: dict[str, str]) -> str:
    """The content hash stamped on both files: SHA-256 (first 16 hex digits) over the file names and their text
    without the header line, so two folders carry the same code exactly when their stamps agree."""
    digest = hashlib.sha256()
    for name in sorted(bodies):
        digest.update(f"{name}\0{bodies[name]}\0".encode())
    return digest.hexdigest()[:16]


def model_code() -> dict[str, str]:
    """File name -> text of the files a saved folder carries. The same sources always give the same text."""
    bodies = {CONFIGURATION_FILE: _configuration_body(), **_model_bodies()}
    _check_package_only_unused(bodies)
    digest = code_digest(bodies)
    return {name: _header(digest) + body for name, body in bodies.items()}


def stale_model_code(folder: str | os.PathLike) -> list[str]:
    """The code files of a saved ``folder`` that differ from (or are missing against) what this package writes
    now; empty when regenerating would change nothing."""
    folder = Path(folder)
    return [
        name
        for name, text in model_code().items()
        if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != text
    ]


def write_model_code(folder: str | os.PathLike) -> list[Path]:
    """Write :func:`model_code`'s files into ``folder`` (atomically); returns their paths."""
    return [atomic_write(Path(folder) / name, text) for name, text in model_code().items()]
