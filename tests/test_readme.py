"""README's code, checked against the code it describes, so a renamed argument, flag, script or
variable fails here instead of in a reader's first script.

From README.md and every docs/*.md page, each check over all of them (each snippet run once,
wherever it lives):
- every fenced ```python and ```bash snippet is run (in a subprocess, this venv's python or bash,
  60 s at most each), unless the line right before its fence is
  ``<!-- not run by tests: REASON -->`` (REASON required);
- every command in a bash snippet or an inline span, run or not, is checked: the scripts and
  repository paths it names exist, every ``--flag`` it passes to a batchlab script, to
  ``python -m batchlab...`` or to pytest is in that command's ``--help`` (for a shell script: in
  its text or the scripts it runs), every variable it sets is read by the code;
- every inline span that is a call (``name(arg=...)``), a name (``batchlab.loadgen.prom``,
  ``LlamaWeights.widen_bf16``, ``FinishReason``), a keyword (``grounded=False``), a path, a bare
  ``--flag`` or a ``BATCHLAB_*`` variable refers to something the code still has; calls are bound
  to the real signature (``inspect.signature``), the check that catches ``max_num_seqs`` for
  ``num_slots``.
- every relative Markdown link (``[text](path)``) resolves from the page that has it;
- README stays a newcomer's page: under ``README_MAX_LINES`` lines, linking every docs page;
- README's package map is the package's one map: every file it lists exists, every module is in it.
``test_the_checks_catch_drift`` feeds each check a broken line, so none of them passes vacuously.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest


ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPET_TIMEOUT_S = 60
RUN_LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
NOT_RUN = re.compile(r"<!--\s*not run by tests:(?P<reason>.*?)-->")
# Directories whose paths a doc names as this repository's (anything else may be another repo's).
REPO_DIRS = ("scripts/", "benchmarks/", "tests/", "batchlab/", "notebooks/", "data/", "solutions/", ".ci/")
# Paths in other repositories that the docs cite (Vidur's profile folders, microsoft/vidur).
FOREIGN_PATHS = {"data/profiling/compute/...", "data/profiling/a100/cpu_overheads.csv"}
# Roots of dotted names and calls that belong to other libraries or to Python.
PROJECT_ROOTS = ("batchlab", "benchmarks")     # importable from the checkout (benchmarks: pytest's pythonpath)
EXTERNAL_ROOTS = {"torch", "ray", "vllm", "LLM", "transformers", "httpx", "np", "pd", "max", "min",
                  "LLMEngine", "EngineCore", "TpKVTopology",    # (nano-vllm's and vLLM's engines, vLLM's KV layout)
                  "os", "numpy"}
FLAG = re.compile(r"--[A-Za-z][\w-]*")
IDENT = r"[A-Za-z_]\w*"
README_MAX_LINES = 250          # README is a newcomer's page; long notes go to docs/*.md


# ---------------------------------------------------------------- parsing the docs

@dataclass
class Fence:
    """A fenced code block: its language, first body line (1-based) and text."""
    doc: str
    line: int
    lang: str
    body: str
    not_run: str | None = None          # the marker's reason, if the block is marked not to run

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang} snippet)"


@dataclass
class Doc:
    """One markdown file: its fences, its inline code spans and link targets (text, line) and
    marker problems."""
    name: str
    fences: list[Fence] = field(default_factory=list)
    spans: list[tuple[str, int]] = field(default_factory=list)
    links: list[tuple[str, int]] = field(default_factory=list)
    marker_problems: list[str] = field(default_factory=list)
    text: str = ""


def parse_doc(text: str, name: str) -> Doc:
    """Split markdown into fenced blocks and inline spans (a span may run across one line break)."""
    doc = Doc(name, text=text)
    lines = text.splitlines()
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^\s*```\s*([\w+-]*)", lines[i])
        if not opening:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), None)
        assert end is not None, f"{name}:{i + 1}: a code fence that is never closed"
        before = next((j for j in range(i - 1, -1, -1) if lines[j].strip()), None)
        marker = NOT_RUN.search(lines[before]) if before is not None else None
        reason = marker.group("reason").strip() if marker else None
        if marker and len(reason) < 10:
            doc.marker_problems.append(f"{name}:{before + 1}: a 'not run by tests' marker must state its "
                                       f"reason, got {lines[before].strip()!r}")
        doc.fences.append(Fence(name, i + 2, opening.group(1).lower(), "\n".join(lines[i + 1:end]), reason))
        i = end + 1
    for number, line in prose:
        if NOT_RUN.search(line):
            nxt = next((l for l in lines[number:] if l.strip()), "")
            if not re.match(r"^\s*```\s*\w", nxt):
                doc.marker_problems.append(f"{name}:{number}: a 'not run by tests' marker must come right "
                                           f"before a code fence, not before {nxt.strip()!r}")
    # Inline spans: a backtick pair within one paragraph line or across one line break.
    joined = "\n".join(line for _, line in prose)
    numbers = [n for n, _ in prose]
    for m in re.finditer(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", joined):
        doc.spans.append((m.group(1), numbers[joined.count("\n", 0, m.start())]))
    # Links: ``[text](target)``, the text possibly across a line break.
    for m in re.finditer(r"\]\((?P<target>[^)\s]+)\)", joined):
        doc.links.append((m.group("target"), numbers[joined.count("\n", 0, m.start())]))
    return doc


@functools.cache
def docs() -> list[Doc]:
    """README.md and docs/*.md, parsed."""
    return [parse_doc(p.read_text(), str(p.relative_to(ROOT))) for p in DOCS]


# ---------------------------------------------------------------- what the code has

def code_files() -> Iterator[Path]:
    """The product's code: the package, the scripts, the benchmarks, CI's entry and the notebooks' sources."""
    yield from sorted((ROOT / "batchlab").rglob("*.py"))
    yield from sorted(p for p in (ROOT / "scripts").iterdir() if p.is_file())
    yield from sorted((ROOT / "benchmarks").rglob("*.py"))
    yield from sorted((ROOT / ".ci").glob("*"))
    yield from sorted((ROOT / "notebooks" / "src").glob("*.py"))


@functools.cache
def code_text() -> str:
    """All the product's code as one text."""
    return "\n".join(p.read_text(errors="replace") for p in code_files())


@functools.cache
def shell_scripts_text() -> str:
    """The shell scripts, whose flags are their own (a ``case`` pattern, a command they run)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted((ROOT / "scripts").glob("*.sh")))


@functools.cache
def code_words() -> frozenset[str]:
    """Every identifier-like word in the code, plus the package's file and folder names."""
    words = set(re.findall(IDENT, code_text()))
    for p in (ROOT / "batchlab").rglob("*"):
        words.update({p.name, p.stem})
    return frozenset(words)


def env_is_read(name: str) -> bool:
    """True if some Python file reads ``name`` (as a string) or some shell script expands it."""
    for p in code_files():
        text = p.read_text(errors="replace")
        if p.suffix == ".py" and re.search(rf"[\"']{name}[\"']", text):
            return True
        if p.suffix != ".py" and re.search(rf"\$\{{?{name}\b", text):
            return True
    return False


@functools.cache
def package_index() -> tuple[dict[str, list[str]], dict[str, list[str]], frozenset[str]]:
    """Static index of batchlab: module basename -> modules; top-level name -> defining modules;
    every parameter name of every function."""
    modules: dict[str, list[str]] = {}
    toplevel: dict[str, list[str]] = {}
    params: set[str] = set()
    for path in sorted((ROOT / "batchlab").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for n in names:
                toplevel.setdefault(n, []).append(dotted)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params.update(x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs])
    return modules, toplevel, frozenset(params)


class Unresolved(LookupError):
    """A name a doc uses that the code does not have."""


@dataclass
class Resolved:
    """What a dotted name points at, and the class it was read from (for methods)."""
    obj: object
    owner: object | None = None
    attr: str = ""


def _instance_attribute(cls: type, attr: str) -> bool:
    """True if instances of ``cls`` get ``attr`` (``self.attr = ...`` or an annotation)."""
    for klass in cls.__mro__[:-1]:
        if attr in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"self\.{attr}\s*(:[^=\n]*)?=", source):
            return True
    return False


def _step(base: Resolved, attr: str) -> Resolved:
    """``base.attr``: an attribute, a submodule, or an instance attribute of a class."""
    obj = base.obj
    if hasattr(obj, attr):
        return Resolved(getattr(obj, attr), obj, attr)
    if isinstance(obj, ModuleType):
        try:
            return Resolved(importlib.import_module(f"{obj.__name__}.{attr}"), obj, attr)
        except ModuleNotFoundError:
            pass
    if isinstance(obj, type) and _instance_attribute(obj, attr):
        return Resolved(None, obj, attr)        # an instance's attribute: nothing further to check
    raise Unresolved(f"{getattr(obj, '__name__', obj)!s} has no attribute {attr!r}")


def resolve(name: str) -> Resolved | None:
    """Resolve a dotted name a doc uses against batchlab; None for another library's name.

    Its first part may be ``batchlab``, a batchlab module's or package's basename
    (``prom.scrape``, ``steptime.cost_model``) or a name defined at the top of a batchlab module
    (``ModelBackend``)."""
    parts = name.split(".")
    modules, toplevel, _ = package_index()
    if parts[0] in PROJECT_ROOTS:
        starts = [parts[0]]
    elif parts[0] in modules or parts[0] in toplevel:
        starts = modules.get(parts[0], []) + [f"{m}.{parts[0]}" for m in toplevel.get(parts[0], [])]
    elif parts[0] in EXTERNAL_ROOTS:
        return None
    else:
        raise Unresolved(f"{parts[0]!r} is not a batchlab module or name (if it is another library's, "
                         "add it to EXTERNAL_ROOTS in tests/test_readme.py)")
    errors = []
    for start in starts:
        try:
            if start in modules.get(parts[0], []) or start in PROJECT_ROOTS:
                here = Resolved(importlib.import_module(start))
            else:
                module_name, attr = start.rsplit(".", 1)
                here = _step(Resolved(importlib.import_module(module_name)), attr)
            for attr in parts[1:]:
                if here.obj is None:
                    break
                here = _step(here, attr)
            return here
        except (Unresolved, ImportError) as e:
            errors.append(f"{start}: {e}")
    raise Unresolved("; ".join(errors))


def signature_of(r: Resolved) -> inspect.Signature:
    """The call signature as a caller sees it (a method read from its class drops ``self``)."""
    sig = inspect.signature(r.obj)
    if isinstance(r.owner, type) and inspect.isfunction(inspect.getattr_static(r.owner, r.attr, None)):
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return sig


def dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def call_problems(source: str, where: str, *, whole_snippet: bool = False) -> list[str]:
    """Every call in ``source`` to a batchlab callable must bind to its signature."""
    try:
        tree = ast.parse(source, mode="exec" if whole_snippet else "eval")
    except SyntaxError:
        return [f"{where}: not valid Python: {source!r}"] if whole_snippet else []
    local = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or (name := dotted_name(node.func)) is None:
            continue
        if whole_snippet and name.split(".")[0] in local:
            continue          # a snippet's own variable: its type is not known statically
        try:
            r = resolve(name)
        except Unresolved as e:
            if whole_snippet:          # a snippet may call builtins and its own functions
                continue
            problems.append(f"{where}: `{source}`: {name} does not exist ({e})")
            continue
        if r is None or r.obj is None:
            continue
        positional = list(node.args)
        if positional and isinstance(positional[-1], ast.Constant) and positional[-1].value is Ellipsis:
            positional.pop()                       # `f(a, ...)`: "and more", not one more argument
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        try:
            sig = signature_of(r)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind_partial(*[None] * len(positional), **keywords)
        except TypeError as e:
            problems.append(f"{where}: `{source}` does not fit {name}{sig}: {e}")
    return problems


# ---------------------------------------------------------------- commands

@dataclass(frozen=True)
class Target:
    """What a command runs: a Python script, ``python -m MODULE`` or a shell script."""
    kind: str          # "script", "module" or "shell"
    name: str          # path relative to the repo, or the module

    def help_argv(self) -> list[str]:
        return [sys.executable, self.name, "--help"] if self.kind == "script" else \
            [sys.executable, "-m", self.name, "--help"]


@functools.cache
def help_text(target: Target) -> tuple[int, str]:
    """``--help`` of a Python script or module: (exit status, output)."""
    try:
        done = subprocess.run(target.help_argv(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 124, "--help ran past 120 s"
    return done.returncode, done.stdout + done.stderr


def shell_text(path: str, seen: frozenset[str] = frozenset()) -> str:
    """A shell script's text and that of every repo script it runs."""
    if path in seen or not (ROOT / path).is_file():
        return ""
    text = (ROOT / path).read_text()
    for other in sorted(set(re.findall(r"scripts/[\w.-]+\.sh", text))):
        text += shell_text(other, seen | {path})
    return text


def split_commands(source: str, pipes: bool = True) -> list[tuple[int, list[str]]]:
    """Shell source -> (line offset, simple command): continuations joined, comments dropped,
    split at ;, && and (with ``pipes``) |."""
    commands: list[tuple[int, list[str]]] = []
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|" if pipes else ";&")
        lexer.whitespace_split, lexer.commenters = True, "#"
        try:
            tokens = list(lexer)
        except ValueError:
            tokens = line.split()
        current: list[str] = []
        for tok in tokens + [";"]:
            if tok and set(tok) <= set(";&|"):
                if current:
                    commands.append((start, current))
                current = []
            else:
                current.append(tok)
    return commands


def find_script(token: str) -> str | None:
    """A token naming a script: its repo path (a bare ``bench_step.py`` is looked up in scripts/
    and benchmarks/)."""
    if (ROOT / token).is_file():
        return token
    for folder in ("scripts", "benchmarks"):
        if "/" not in token and (ROOT / folder / token).is_file():
            return f"{folder}/{token}"
    return None


def module_exists(module: str) -> bool:
    """True if ``python -m module`` would find it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def parse_command(tokens: list[str]) -> tuple[dict[str, str], Target | str | None, list[str]]:
    """(variables set, what runs, its arguments). What runs is a Target, None for another
    program, or a message when the script or module it names does not exist."""
    env: dict[str, str] = {}
    while tokens and re.fullmatch(rf"{IDENT}=\S*", tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if not tokens:
        return env, None, []
    head, rest = tokens[0], tokens[1:]
    if head in ("bash", "sh") and rest:
        path = find_script(rest[0])
        return env, Target("shell", path) if path else f"no such script: {rest[0]}", rest[1:]
    if re.search(r"(^|/)python[\d.]*$", head) and rest:
        if rest[0] == "-m" and len(rest) > 1:
            module = rest[1]
            if module == "pytest" or module.split(".")[0] == "batchlab":
                if module != "pytest" and not module_exists(module):
                    return env, f"no such module: {module}", rest[2:]
                return env, Target("module", module), rest[2:]
            return env, None, rest[2:]
        path = find_script(rest[0])
        if rest[0].endswith(".py"):
            return env, Target("script", path) if path else f"no such script: {rest[0]}", rest[1:]
        return env, None, rest
    if head.endswith(".py"):
        path = find_script(head)
        return env, Target("script", path) if path else f"no such script: {head}", rest
    return env, None, rest


def accepts(target: Target, flag: str) -> tuple[bool, str]:
    """Whether ``target`` takes ``flag``, and where that was looked up."""
    if target.kind == "shell":
        return bool(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", shell_text(target.name))), \
            f"the text of {target.name} and the scripts it runs"
    rc, out = help_text(target)
    if rc != 0:
        return False, f"`{' '.join(target.help_argv()[1:])}` (exit {rc}: {out.strip()[-300:]})"
    return bool(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out)), \
        f"`{' '.join(target.help_argv()[1:])}`"


def command_problems(tokens: list[str], where: str) -> list[str]:
    """Scripts, paths, flags and variables of one command."""
    text = " ".join(tokens)
    env, target, args = parse_command(list(tokens))
    problems = []
    for var in env:
        if var.startswith("BATCHLAB_") and not env_is_read(var):
            problems.append(f"{where}: `{text}` sets {var}, which no code reads")
        elif not var.startswith("BATCHLAB_") and var not in code_words():
            problems.append(f"{where}: `{text}` sets {var}, which no script or module mentions")
    if isinstance(target, str):
        return problems + [f"{where}: `{text}`: {target}"]
    if target is None:
        return problems
    for arg in args:
        if not arg.startswith("-") and arg.startswith(REPO_DIRS) and not (ROOT / arg).exists():
            problems.append(f"{where}: `{text}` names {arg}, which does not exist")
    for flag in dict.fromkeys(FLAG.findall(" ".join(args))):
        ok, looked = accepts(target, flag)
        if not ok:
            problems.append(f"{where}: `{text}` passes {flag}, which {target.name} does not take "
                            f"(not in {looked})")
    return problems


def doc_commands(doc: Doc) -> Iterator[tuple[list[str], str]]:
    """Every command of a doc: each of its bash snippets' commands, and each inline span that
    runs a script or ``python -m`` (with where it is)."""
    for fence in doc.fences:
        if RUN_LANGS.get(fence.lang) == "bash":
            for offset, tokens in split_commands(fence.body):
                yield tokens, f"{fence.doc}:{fence.line + offset} (bash snippet)"
    for span, line in doc.spans:
        if re.search(r"\S+\.(py|sh)\b|python[\d.]* -m ", span.replace("\n", " ")) and " " in span.strip():
            for _, tokens in split_commands(span.replace("\n", " "), pipes=False):  # `a|b`: a choice
                yield tokens, f"{doc.name}:{line} (inline)"


def python_targets(doc_list: list[Doc]) -> list[Target]:
    """Every Python script or module the docs' commands run."""
    found = {parse_command(list(tokens))[1] for d in doc_list for tokens, _ in doc_commands(d)}
    return sorted((t for t in found if isinstance(t, Target) and t.kind != "shell"), key=lambda t: t.name)


def warm_help(doc_list: list[Doc]) -> None:
    """Run every ``--help`` the docs' commands need, two at a time."""
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(help_text, python_targets(doc_list)))


# ---------------------------------------------------------------- inline names

SPAN_KINDS: list[tuple[str, str]] = [          # (kind, pattern), the first that matches wins
    ("call", rf"{IDENT}(\.{IDENT})*\(.*\)"),
    ("keyword", rf"{IDENT}=[^=\s]\S*"),
    ("flag", r"--[A-Za-z][\w-]*( .*)?"),
    ("path", r"(scripts|tests|batchlab|notebooks|data|solutions|\.ci)/[\w./<>-]*"),
    ("file", r"[\w.-]*\.(py|sh|json|jsonl|csv|toml|txt|ipynb|md|html|gguf|yaml|yml)"),
    ("dotted", rf"{IDENT}(\.{IDENT})+"),
    ("variable", r"\$?BATCHLAB_\w+"),
    ("metric", r"vllm:[a-z_]+"),
    ("notebook", r"\d\d_\w+"),
    ("identifier", rf"_*[a-z0-9]+(_[a-z0-9]+)+|_*[A-Z]\w*[a-z]\w*|[A-Z][A-Z0-9]*(_[A-Z0-9]+)+"),
]


def span_kind(flat: str) -> str | None:
    """Which kind of name an inline span is, or None for prose, values and other programs'
    commands (those are checked by doc_commands' caller)."""
    return next((kind for kind, pattern in SPAN_KINDS if re.fullmatch(pattern, flat)), None)


def span_problems(span: str, where: str, helps: list[str]) -> list[str]:
    """Whatever an inline span names must exist: a call (bound to its signature), a keyword (some
    batchlab function's argument), a bare flag, a repository path, a file name, a dotted name, a
    variable, or an identifier (snake_case, CamelCase, CONSTANT_CASE)."""
    flat = " ".join(span.split())
    kind = span_kind(flat)
    bad = f"{where}: `{span}`:"
    if kind == "call":
        return call_problems(flat, where)
    if kind == "keyword":
        key = flat.split("=", 1)[0]
        if key.startswith("BATCHLAB_"):
            return [] if env_is_read(key) else [f"{bad} no code reads {key}"]
        if key.isupper():
            return [] if key in code_words() else [f"{bad} no code mentions {key}"]
        return [] if key in package_index()[2] else [f"{bad} no batchlab function takes an argument {key!r}"]
    if kind == "flag":
        flag = FLAG.match(flat).group(0)
        pattern = rf"(?<![\w-]){re.escape(flag)}(?![\w-])"
        if any(re.search(pattern, h) for h in helps) or re.search(rf"[\"']{re.escape(flag)}[\"'=]", code_text()) \
                or re.search(pattern, shell_scripts_text()):
            return []
        return [f"{bad} no batchlab command's --help lists {flag}, and no code passes it"]
    if kind == "path":
        if flat in FOREIGN_PATHS or re.search(r"<|\.\.\.|NN", flat) or (ROOT / flat).exists():
            return []
        return [f"{bad} no such path in the repository"]
    if kind == "file":
        dirs = ("batchlab", "scripts", "benchmarks", "tests", "notebooks", "data")
        if (ROOT / flat).exists() or any(next((ROOT / d).rglob(flat), None) for d in dirs) \
                or flat in code_text():
            return []
        return [f"{bad} no file of that name, and no code writes one"]
    if kind == "dotted":
        try:
            resolve(flat)
            return []
        except Unresolved as e:
            return [f"{bad} {e}"]
    if kind == "variable":
        name = flat.lstrip("$")
        return [] if env_is_read(name) else [f"{bad} no code reads {name}"]
    if kind == "metric":
        return [] if re.search(rf"[\"']{flat}[\"']", code_text()) else [f"{bad} no code exports {flat}"]
    if kind == "notebook":
        return [] if (ROOT / "notebooks" / f"{flat}.ipynb").is_file() else [f"{bad} no notebooks/{flat}.ipynb"]
    if kind == "identifier":
        return [] if flat in code_words() else [f"{bad} no code has the name {flat}"]
    return []


def doc_helps(doc_list: list[Doc]) -> list[str]:
    """The ``--help`` texts of every Python command the docs run."""
    warm_help(doc_list)
    return [out for rc, out in map(help_text, python_targets(doc_list)) if rc == 0]


def all_span_problems(doc_list: list[Doc]) -> list[str]:
    """span_problems over every span of every doc, plus every BATCHLAB_* the docs mention."""
    helps = doc_helps(doc_list)
    problems = [p for d in doc_list for span, line in d.spans
                for p in span_problems(span, f"{d.name}:{line} (inline)", helps)]
    for d in doc_list:
        for name in sorted(set(re.findall(r"BATCHLAB_[A-Z0-9_]+", d.text))):
            if not env_is_read(name):
                problems.append(f"{d.name}: mentions {name}, which no code reads")
    return problems


def package_map_problems(doc_list: list[Doc]) -> list[str]:
    """The package map (a plain fence that starts with ``batchlab/``): every file it lists is in
    the folder it is listed under."""
    problems = []
    for d in doc_list:
        for fence in (f for f in d.fences if f.lang == "" and f.body.startswith("batchlab/\n")):
            folder = ""
            for k, line in enumerate(fence.body.splitlines()[1:], start=1):
                if m := re.match(r"^  (\w+)/", line):
                    folder = m.group(1)
                elif re.match(r"^  \w+\.py", line):
                    folder = ""
                for name in re.findall(r"[\w/]+\.(?:py|json|txt)", line):
                    path = Path("batchlab", name if "/" in name else Path(folder, name))
                    if "NN" not in name and not (ROOT / path).is_file():
                        problems.append(f"{d.name}:{fence.line + k} (package map): lists {path}, "
                                        "which does not exist")
    return problems


def unlisted_modules(doc: Doc) -> list[str]:
    """The package's modules that ``doc``'s package map does not name (``nbNN.py`` names every
    ``nb<two digits>.py`` of its folder): one map, kept whole as the package grows."""
    listed = set()
    for fence in (f for f in doc.fences if f.lang == "" and f.body.startswith("batchlab/\n")):
        folder = ""
        for line in fence.body.splitlines()[1:]:
            if m := re.match(r"^  (\w+)/", line):
                folder = m.group(1)
            elif re.match(r"^  \w+\.py", line):
                folder = ""
            for name in re.findall(r"[\w/]+\.py", line):
                listed.add(str(Path(name if "/" in name else Path(folder, name))).replace("NN", "[0-9][0-9]"))
    package = ROOT / "batchlab"
    return [str(path.relative_to(ROOT)) for path in sorted(package.rglob("*.py"))
            if path.name not in ("__init__.py", "__main__.py")
            and not any(fnmatch.fnmatchcase(str(path.relative_to(package)), pattern) for pattern in listed)]


# ---------------------------------------------------------------- links and README's shape

def link_problems(doc_list: list[Doc]) -> list[str]:
    """Every relative link resolves from the folder of the page that has it (a page moved to
    docs/ must say ``../scripts/x.py``); links to other sites and to anchors are not followed."""
    problems = []
    for d in doc_list:
        base = (ROOT / d.name).parent
        folder = "the repository root" if base == ROOT else base.relative_to(ROOT)
        for target, line in d.links:
            if re.match(r"[A-Za-z][\w+.-]*:|#", target):
                continue
            if not (base / target.split("#")[0]).exists():
                problems.append(f"{d.name}:{line}: links {target}, which does not exist (relative to {folder})")
    return problems


def readme_shape_problems(readme: Doc, pages: list[str]) -> list[str]:
    """README is under README_MAX_LINES lines and links every page in ``pages`` (docs/NAME.md)."""
    problems = []
    lines = len(readme.text.splitlines())
    if lines >= README_MAX_LINES:
        problems.append(f"{readme.name} has {lines} lines, not under {README_MAX_LINES}: move long "
                        "explanations and measurements to a docs/ page and link it")
    linked = {target.split("#")[0] for target, _ in readme.links}
    problems += [f"{readme.name} does not link {page} (add it to \"Where to find more\")"
                 for page in pages if page not in linked]
    return problems


# ---------------------------------------------------------------- running snippets

def run_snippet(fence: Fence) -> str | None:
    """Run one snippet from the repo root in its own process group (all of it is ended if it runs
    past the limit); a message if it fails, None if it passes."""
    lang = RUN_LANGS[fence.lang]
    argv = [sys.executable, "-"] if lang == "python" else ["bash", "-euo", "pipefail", "-s"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(fence.body, timeout=SNIPPET_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return (f"{fence.where} ran past {SNIPPET_TIMEOUT_S} s: make it cheaper, or mark it with "
                "<!-- not run by tests: REASON --> right before its fence")
    if proc.returncode != 0:
        return f"{fence.where} failed (exit {proc.returncode}):\n{fence.body}\n--- output:\n{out[-3000:]}"
    return None


def snippet_problems(doc_list: list[Doc]) -> list[str]:
    """Run every runnable snippet not marked otherwise."""
    return [msg for d in doc_list for f in d.fences
            if f.lang in RUN_LANGS and f.not_run is None and (msg := run_snippet(f))]


def static_snippet_problems(doc_list: list[Doc]) -> list[str]:
    """Python snippets' calls and bash snippets' (and command spans') commands, run or not."""
    problems = [p for d in doc_list for f in d.fences if RUN_LANGS.get(f.lang) == "python"
                for p in call_problems(f.body, f.where, whole_snippet=True)]
    warm_help(doc_list)          # every page's --help at once, two at a time, each run once
    for d in doc_list:
        for tokens, where in doc_commands(d):
            problems += command_problems(tokens, where)
    return problems


# ---------------------------------------------------------------- tests

def test_the_docs_have_what_these_checks_read() -> None:
    """The parser finds the docs' code (so an empty parse cannot pass everything below): README and
    every docs page are read, and together they hold what README alone held before the long
    parts moved to docs/."""
    pages = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    assert [d.name for d in docs()] == ["README.md", *pages]
    readme = docs()[0]
    assert sum(RUN_LANGS.get(f.lang) == "bash" for f in readme.fences) >= 2, readme.fences
    assert len(readme.spans) >= 100, len(readme.spans)
    assert sum(RUN_LANGS.get(f.lang) == "bash" for d in docs() for f in d.fences) >= 5
    assert sum(len(d.spans) for d in docs()) >= 200
    assert any("(" in s and "=" in s for d in docs() for s, _ in d.spans)
    assert [p for d in docs() for p in d.marker_problems] == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_each_page_has_code_the_checks_read(doc: Path) -> None:
    """Each page parses to code the checks below read (a page of prose only would pass vacuously)."""
    found = next(d for d in docs() if d.name == str(doc.relative_to(ROOT)))
    assert found.fences or found.spans, f"{found.name}: no code fence and no inline code"


def test_readme_is_short_and_links_every_docs_page() -> None:
    """README stays a newcomer's page: under README_MAX_LINES lines, every docs page linked."""
    problems = readme_shape_problems(docs()[0], [d.name for d in docs()[1:]])
    assert not problems, "\n".join(problems)


def test_links_resolve() -> None:
    """Every relative link in README and the docs pages points at a file or folder that exists."""
    problems = link_problems(docs())
    assert not problems, "\n".join(problems)


def test_snippets_that_are_cheap_run() -> None:
    """Every python/bash snippet without a 'not run by tests' marker runs and exits 0."""
    problems = snippet_problems(docs())
    assert not problems, "\n\n".join(problems)


def test_commands_name_real_scripts_flags_and_variables() -> None:
    """Commands in snippets (run or not) and in inline spans: scripts, paths, flags, variables."""
    problems = static_snippet_problems(docs())
    assert not problems, "\n".join(problems)


PACKAGE_MAP_PAGE = "docs/architecture.md"


def package_map_page() -> Doc:
    return next(d for d in docs() if d.name == PACKAGE_MAP_PAGE)


def test_the_package_map_lists_real_files() -> None:
    """Every module the package map names is where it says."""
    assert any(f.body.startswith("batchlab/\n") for f in package_map_page().fences), \
        f"{PACKAGE_MAP_PAGE} lost its package map"
    problems = package_map_problems(docs())
    assert not problems, "\n".join(problems)


def test_the_package_map_names_every_module() -> None:
    """The package map (docs/architecture.md) is the one map of the package: a new module must be
    placed in it."""
    missing = unlisted_modules(package_map_page())
    assert not missing, f"{PACKAGE_MAP_PAGE}'s package map leaves out: {missing}"
    partial = parse_doc("```\nbatchlab/\n  engine.py\n  exercises/    nbNN.py\n```\n", "PARTIAL.md")
    left_out = unlisted_modules(partial)
    assert "batchlab/loop.py" in left_out and "batchlab/engine.py" not in left_out
    assert not any("exercises/nb" in path for path in left_out)


def test_inline_code_names_what_the_code_has() -> None:
    """Inline calls bind to real signatures; names, keywords, paths, flags and variables exist."""
    problems = all_span_problems(docs())
    assert not problems, "\n".join(problems)


BROKEN = '''\
Size it with `ModelBackend(max_num_seqs=...)` and read `prom.scrape(url, timeout=1)`; see
`batchlab.loadgen.prom.no_such_thing`, `steptime.cost_model.CostModel`, `NoSuchBackend`,
`grounded_nowhere=False`, `scripts/no_such_script.py`, `--no-such-flag` and `BATCHLAB_NO_SUCH`.
Read [the data](data/README.md), [a page](https://example.org/x.md), [a section](#two) and
[a page that is
gone](docs/no_such_page.md).

<!-- not run by tests: -->
```python
raise SystemExit("this snippet fails")
```

<!-- not run by tests: starts a server that runs until stopped -->
```bash
BATCHLAB_NOT_READ=1 .venv/bin/python -m batchlab.serve --policy continuous --max-num-sequences 8
bash scripts/no_such.sh
.venv/bin/python -m batchlab.no_such.module
.venv/bin/python benchmarks/bench_paged.py --threads 1 --no-such-option
```

```python
from batchlab.backends import ModelBackend
ModelBackend(max_num_seqs=4)
```

<!-- not run by tests: a marker with no fence after it -->
Prose.

```
batchlab/
  engine.py no_such_module.py
  backends/     model_backend.py simulator_v0.py
```
'''


def broken_line(fragment: str) -> int:
    """The 1-based line of BROKEN where ``fragment`` first appears."""
    return next(n for n, line in enumerate(BROKEN.splitlines(), 1) if fragment in line)


def test_the_checks_catch_drift() -> None:
    """Each check fails on a line that names something the code does not have."""
    doc = parse_doc(BROKEN, "BROKEN.md")
    assert doc.marker_problems == [
        f"BROKEN.md:{broken_line('by tests: -->')}: a 'not run by tests' marker must state its reason, "
        "got '<!-- not run by tests: -->'",
        f"BROKEN.md:{broken_line('no fence after it')}: a 'not run by tests' marker must come right "
        "before a code fence, not before 'Prose.'"]
    assert package_map_problems([doc]) == [
        f"BROKEN.md:{broken_line('no_such_module.py')} (package map): lists batchlab/no_such_module.py, "
        "which does not exist",
        f"BROKEN.md:{broken_line('simulator_v0.py')} (package map): lists "
        "batchlab/backends/simulator_v0.py, which does not exist"]
    spans = "\n".join(all_span_problems([doc]))
    for expected in ["ModelBackend(max_num_seqs=...)` does not fit ModelBackend(",
                     "unexpected keyword argument 'max_num_seqs'", "no_such_thing",
                     "no code has the name NoSuchBackend", "no batchlab function takes an argument "
                     "'grounded_nowhere'", "no such path", "--no-such-flag", "BATCHLAB_NO_SUCH"]:
        assert expected in spans, f"{expected!r} not reported:\n{spans}"
    assert "prom.scrape" not in spans and "CostModel" not in spans, spans
    static = "\n".join(static_snippet_problems([doc]))
    snippet = f"BROKEN.md:{broken_line('import ModelBackend')} (python snippet)"
    for expected in [f"BROKEN.md:{broken_line('BATCHLAB_NOT_READ')} (bash snippet): `BATCHLAB_NOT_READ=1",
                     "sets BATCHLAB_NOT_READ, which no code reads", "passes --max-num-sequences",
                     "no such script: scripts/no_such.sh", "passes --no-such-option",
                     "no such module: batchlab.no_such.module", snippet]:
        assert expected in static, f"{expected!r} not reported:\n{static}"
    assert "passes --policy" not in static and "passes --threads" not in static, static
    ran = snippet_problems([doc])
    assert len(ran) == 1 and f"{snippet} failed" in ran[0], ran
    assert link_problems([doc]) == [
        f"BROKEN.md:{broken_line('gone](')}: links docs/no_such_page.md, which does not exist "
        "(relative to the repository root)"]
    moved = parse_doc("# A page\n\nSee [the script](scripts/build_site.py).\n", "docs/moved.md")
    assert link_problems([moved]) == [
        "docs/moved.md:3: links scripts/build_site.py, which does not exist (relative to docs)"]
    assert readme_shape_problems(doc, ["docs/no_such_page.md", "docs/unlinked.md"]) == [
        'BROKEN.md does not link docs/unlinked.md (add it to "Where to find more")']
    long = parse_doc("A line.\n" * README_MAX_LINES, "LONG.md")
    assert readme_shape_problems(long, []) == [
        f"LONG.md has {README_MAX_LINES} lines, not under {README_MAX_LINES}: move long explanations "
        "and measurements to a docs/ page and link it"]
