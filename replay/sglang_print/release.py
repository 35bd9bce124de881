"""Run the logging code of a released SGLang wheel without torch, a GPU or SGLang's dependencies.

A wheel holds SGLang's Python source. What prints a log line is small: an f-string in a
method, a formatter, a dataclass repr. :class:`Release` loads the source files of one wheel
and runs exactly those pieces:

- :meth:`Release.module` executes a source file's top-level definitions (all of them, or the
  named ones) with every import it makes satisfied by a permissive stub, except the names
  listed as real, which are themselves taken from the wheel;
- :meth:`Release.method` takes one method out of a class (``Req.log_time_stats``) to call on
  a stand-in ``self``;
- :meth:`Release.message` compiles the f-string of the logging call that contains a marker
  (``"exceeds the maximum number of tokens"``) so it can be evaluated on chosen values.

Every piece of text a printed line holds therefore comes from the release's own code; what
we choose is only the values it formats (rids, lengths, times). It installs a stub finder on
``sys.meta_path`` and fills ``sys.modules`` with stand-ins: it runs in a process of its own
(``simulate --sglang-version``, scripts/make_sglang_fixtures.py), never inside an
investigation.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import importlib.abc
import importlib.machinery
import re
import sys
import types
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


class _StubType(type):
    """A class that is anything: called, subscripted, subclassed, used as a decorator."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub(name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a decorator
        return stub("instance")

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False


def stub(name: str) -> Any:
    """A fresh permissive stand-in named ``name``."""
    return _StubType(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: any module nothing else finds (torch, SGLang itself) is a stub;
    the SGLang modules a release has made real are in ``sys.modules`` already."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in sys.stdlib_module_names:
            return None  # (the standard library probes for modules it may lack: let it)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_FINDER = _Finder()


def _install_stubs() -> None:
    """Put the stub finder last on ``sys.meta_path``, with stub ``sglang`` packages for the real
    modules to sit in: only in a process that runs a release's code (a :class:`Release` made just
    for its version and SHA-256 changes nothing)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    for name in ("sglang", "sglang.srt"):
        if name not in sys.modules:
            importlib.import_module(name)


class Release:
    """One SGLang wheel: its version, SHA-256 and source, and the means to run pieces of it."""

    def __init__(self, wheel: Path):
        self.wheel = wheel
        self.sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
        self.version = wheel.name.split("-")[1]
        self._zip = zipfile.ZipFile(wheel)
        self._sources: dict[str, str] = {}
        self._trees: dict[str, ast.Module] = {}
        self._messages: dict[tuple[str, str, str | None], Callable[..., str]] = {}
        self._methods: dict[tuple[str, str, str], Any] = {}

    @property
    def key(self) -> tuple[int, ...]:
        """The version as numbers, for comparisons: ``(0, 5, 12)``."""
        return tuple(int(p) for p in re.findall(r"\d+", self.version)[:3])

    def path_of(self, module: str) -> str:
        """The wheel path of a module's source: ``sglang/srt/utils/request_logger.py``."""
        base = module.replace(".", "/")
        names = set(self._zip.namelist())
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in names:
                return candidate
        raise FileNotFoundError(f"{module} is not in {self.wheel.name}")

    def has(self, module: str) -> bool:
        """Whether this release has the module."""
        try:
            self.path_of(module)
        except FileNotFoundError:
            return False
        return True

    def source(self, module: str) -> str:
        """A module's source text."""
        path = self.path_of(module)
        if path not in self._sources:
            self._sources[path] = self._zip.read(path).decode("utf-8")
        return self._sources[path]

    def tree(self, module: str) -> ast.Module:
        """A module's syntax tree (parsed once)."""
        if module not in self._trees:
            self._trees[module] = ast.parse(self.source(module), filename=self.path_of(module))
        return self._trees[module]

    def line_of(self, module: str, marker: str) -> int:
        """The first source line holding ``marker`` (for a fixture's note of where a line type comes from)."""
        for n, text in enumerate(self.source(module).splitlines(), 1):
            if marker in text:
                return n
        raise LookupError(f"{marker!r} is not in {self.path_of(module)} of {self.version}")

    def module(self, name: str, names: Iterable[str] | None = None,
               real: Mapping[str, Iterable[str] | None] | None = None,
               values: Mapping[str, Any] | None = None) -> Any:
        """Execute a module of the wheel: its imports, then all its top-level statements or only
        those defining ``names`` (and ``logger``). Imports of the modules in ``real`` get those
        modules (the listed names, or all) from the wheel; everything else imported is a stub.
        ``values`` are set in the module before its statements run (stand-ins for imported
        names, such as ``envs``)."""
        _install_stubs()
        for dep, dep_names in (real or {}).items():
            sys.modules[dep] = self.module(dep, dep_names)
        tree = self.tree(name)
        wanted = None if names is None else {*names, "logger"}
        module = types.ModuleType(name)
        module.__file__ = self.path_of(name)
        module.__dict__["__builtins__"] = __builtins__
        module.__package__ = name.rpartition(".")[0]
        sys.modules[name] = module  # (dataclasses look their module up while the class is made)
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                    continue
                try:
                    self._run(stmt, module)
                except ImportError:
                    for alias in stmt.names:
                        module.__dict__[(alias.asname or alias.name).split(".")[0]] = stub(alias.name)
                continue
            if wanted is not None and not (_defines(stmt) & wanted):
                continue
            if isinstance(stmt, ast.If) and _is_type_checking(stmt):
                continue
            self._run(stmt, module, values)
        module.__dict__.update(values or {})
        if wanted is not None:  # names the kept definitions use that the module left out: stubs
            for name in _global_names(tree, wanted):
                if name not in module.__dict__ and not hasattr(builtins, name):
                    module.__dict__[name] = stub(name)
        return module

    def method(self, module: str, cls: str, name: str, namespace: Mapping[str, Any]) -> Callable[..., Any]:
        """Method ``cls.name`` of a module, as a plain function whose globals are ``namespace``."""
        key = (module, cls, name)
        if key not in self._methods:
            self._methods[key] = self._method_code(module, cls, name)
        scope = {"__builtins__": __builtins__, **namespace}
        exec(self._methods[key], scope)  # noqa: S102 (the release's own method definition)
        return scope[name]

    def _method_code(self, module: str, cls: str, name: str) -> Any:
        for stmt in self.tree(module).body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == cls:
                for item in stmt.body:
                    if isinstance(item, ast.FunctionDef) and item.name == name:
                        item = ast.FunctionDef(**{**item.__dict__, "decorator_list": []})
                        return compile(ast.Module(body=[item], type_ignores=[]), self.path_of(module), "exec")
        raise LookupError(f"{cls}.{name} is not in {self.path_of(module)} of {self.version}")

    def message(self, module: str, marker: str, *, within: str | None = None) -> Callable[..., str]:
        """The f-string (or string) containing ``marker`` in the module (inside function
        ``within`` if given), compiled to a function of keyword values: each free name of the
        expression is looked up in them; attribute chains and calls on a value resolve by the
        attribute's own name in the same values (``self.model_config.context_len`` ->
        ``context_len``)."""
        key = (module, marker, within)
        if key not in self._messages:
            self._messages[key] = self._message(module, marker, within)
        return self._messages[key]

    def _message(self, module: str, marker: str, within: str | None) -> Callable[..., str]:
        tree = self.tree(module)
        scope: ast.AST = tree
        if within is not None:
            scope = next(n for n in ast.walk(tree)
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == within)
        node = _string_holding(scope, marker)
        if node is None:
            raise LookupError(f"no string holding {marker!r} in {self.path_of(module)} of {self.version}")
        return self.message_of(module, node)

    def logged(self, module: str, marker: str, *, within: str) -> Callable[..., tuple[str, str]]:
        """The line function ``within`` of the module logs where a string holds ``marker``: the
        statements from the one holding it to the first logging call at or after it in the same
        block (``msg = ...; if ...: msg += ...; logger.warning(msg)``), run on keyword values as
        :meth:`message` renders one (a name with no value a :class:`Facts`); the level it logged
        at (``info`` or ``warning``) and what."""
        scope = next(n for n in ast.walk(self.tree(module))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == within)
        block = _logging_block(scope, marker)
        if block is None:
            raise LookupError(f"no logged string holding {marker!r} in {within} of {self.path_of(module)} of "
                              f"{self.version}")
        code = compile(block, self.path_of(module), "exec")
        names = {n.id for n in ast.walk(block) if isinstance(n, ast.Name)} - {"logger"}

        def render(**values: Any) -> tuple[str, str]:
            said: list[tuple[str, str]] = []
            logger = types.SimpleNamespace(**{level: functools.partial(_said, said, level)
                                              for level in ("info", "warning")})
            exec(code, {**_scope(names, values), "logger": logger})  # noqa: S102 (the release's own statements)
            assert len(said) == 1, said
            return said[0]

        return render

    def percent_message(self, module: str, marker: str) -> Callable[..., str]:
        """A logging call with %-style arguments (``logger.warning("KV pool holds %d ...", a, b)``)
        whose format holds ``marker``: a function of keyword values, as :meth:`message`, giving
        the line logging would print."""
        tree = self.tree(module)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and marker in node.args[0].value):
                fmt = node.args[0].value
                args = self.message_of(module, ast.Tuple(elts=list(node.args[1:]), ctx=ast.Load()))
                return lambda **values: fmt % args(**values)
        raise LookupError(f"no logging call with {marker!r} in {self.path_of(module)} of {self.version}")

    def message_of(self, module: str, node: ast.expr) -> Callable[..., str]:
        """:meth:`message` for a string expression already found in the module's tree."""
        node = ast.fix_missing_locations(node)
        expr = compile(ast.Expression(body=node), self.path_of(module), "eval")
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

        def render(**values: Any) -> str:
            return eval(expr, _scope(names, values))  # noqa: S307 (the release's own f-string)

        return render

    def _run(self, stmt: ast.stmt, module: types.ModuleType, values: Mapping[str, Any] | None = None) -> None:
        module.__dict__.update(values or {})
        code = compile(ast.Module(body=[stmt], type_ignores=[]), module.__file__ or "<wheel>", "exec")
        exec(code, module.__dict__)  # noqa: S102 (the release's own top-level statement)


class Facts:
    """Values for an f-string's expression: ``x.y.z`` and ``f().z`` resolve to ``z``. A name
    with no value fails when formatted, naming the path it was reached by."""

    def __init__(self, values: Mapping[str, Any], path: str = ""):
        self._values = values
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in self._values:
            return Facts(self._values, f"{self._path}.{name}")
        value = self._values[name]
        if isinstance(value, int) and not isinstance(value, bool):
            return _Count(value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Facts:
        return self

    def __format__(self, spec: str) -> str:
        raise KeyError(f"no value for {self._path or 'a name'} in the message")

    __str__ = __repr__ = lambda self: self.__format__("")  # noqa: E731


class _Count(int):
    """A count whose attributes are itself (``adder.log_input_tokens.total`` -> the count)."""

    def __getattr__(self, name: str) -> _Count:
        if name.startswith("__"):
            raise AttributeError(name)
        return self


def _defines(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, ast.Assign):
        return {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id}
    return set()


def _global_names(tree: ast.Module, wanted: set[str]) -> set[str]:
    """Names read inside the kept top-level definitions."""
    out: set[str] = set()
    for stmt in tree.body:
        if _defines(stmt) & wanted:
            out |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return out


def _is_type_checking(stmt: ast.If) -> bool:
    return isinstance(stmt.test, ast.Name) and stmt.test.id == "TYPE_CHECKING"


def _logging_block(scope: ast.AST, marker: str) -> ast.Module | None:
    """The statements of the innermost block of ``scope`` from a simple statement holding a string
    with ``marker`` to the first logging call at or after it."""
    for node in ast.walk(scope):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(body, list):
                continue
            first = next((k for k, stmt in enumerate(body) if isinstance(stmt, (ast.Assign, ast.Expr))
                          and _string_holding(stmt, marker) is not None), None)
            last = None if first is None else next((k for k in range(first, len(body)) if _logs(body[k])), None)
            if first is not None and last is not None:
                return ast.fix_missing_locations(ast.Module(body=body[first:last + 1], type_ignores=[]))
    return None


def _scope(names: set[str], values: Mapping[str, Any]) -> dict[str, Any]:
    """Globals for a release's expression or statements naming ``names``: each from ``values``,
    else a :class:`Facts` (a builtin as it is)."""
    scope: dict[str, Any] = {"__builtins__": __builtins__}
    for n in names:
        if n in values:
            scope[n] = values[n]
        elif not hasattr(builtins, n):
            scope[n] = Facts(values, n)
    return scope


def _said(said: list[tuple[str, str]], level: str, text: str) -> None:
    said.append((level, text))


def _logs(stmt: ast.stmt) -> bool:
    """Whether the statement is a call of ``logger.info`` or ``logger.warning``."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr in ("info", "warning")
            and isinstance(stmt.value.func.value, ast.Name) and stmt.value.func.value.id == "logger")


def _string_holding(scope: ast.AST, marker: str) -> ast.expr | None:
    """The outermost string expression (f-string, or implicit concatenation of them) whose
    literal parts hold ``marker``."""
    for node in ast.walk(scope):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if marker in text:
                return node
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and marker in node.value:
            return node
    return None
