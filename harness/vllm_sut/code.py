"""The vLLM code a config tests, as private module objects: the installed (or first on the
path) vllm as it is, or its decision modules re-executed from a checkout (`vllm_src`) and/or
from in-memory copies with patches applied (`vllm_patches`).

The rest of vLLM (configs, distributed helpers, torch registrations) is imported once and
shared: re-importing it registers torch types twice. The decision modules import each other,
so all of them are re-executed together, in dependency order, in a window where sys.modules
names the private copies; the window holds the import lock, and everything is put back
after it, so the installed modules stay what every other caller sees. Nothing is written to
any vllm tree. Importing this module does not import vLLM.
"""

from __future__ import annotations

import _imp
import importlib
import importlib.abc
import importlib.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.vllm_code.api import detect_api
from harness.vllm_code.identity import VllmIdentity, git_commit, tree_version
from harness.vllm_code.release import Release
from harness.vllm_code.source import VllmPatch, module_name, patched_files

# What the decision adapter calls into, in import order (each imports the ones before it).
DECISION_MODULES = (
    "vllm.v1.worker.ubatch_utils",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.dp_utils",
)
# What `execution = vllm` runs (harness/vllm_exec): the ubatching contexts and the runner.
# Loaded with the decision modules where the tree has them, so that a patch to either is
# re-executed with the rest.
EXECUTION_MODULES = ("vllm.v1.worker.ubatching", "vllm.v1.worker.gpu.ubatch_utils")
# Every module above, in import order.
MODULE_ORDER = ("vllm.v1.worker.ubatching", "vllm.v1.worker.ubatch_utils",
                "vllm.v1.worker.gpu.ubatch_utils", "vllm.v1.worker.gpu.cudagraph_utils",
                "vllm.v1.worker.gpu.dp_utils")
_LOCK = threading.Lock()
_CACHE: dict[CodeKey, VllmCode] = {}


@dataclass(frozen=True)
class CodeKey:
    """Which code: a tree (None: the vllm that imports) and the patches over it."""

    vllm_src: str | None = None
    patches: tuple[VllmPatch, ...] = ()

    @property
    def is_installed(self) -> bool:
        return self.vllm_src is None and not self.patches


@dataclass(frozen=True)
class VllmCode:
    key: CodeKey
    modules: dict[str, ModuleType]
    identity: VllmIdentity
    api: Release  # which of the known APIs the modules expose (harness/vllm_code/api.py)

    @property
    def ubatch_utils(self) -> ModuleType:
        return self.modules["vllm.v1.worker.ubatch_utils"]

    @property
    def ubatching(self) -> ModuleType:
        return self._execution("vllm.v1.worker.ubatching")

    @property
    def runner_module(self) -> ModuleType:
        """vllm.v1.worker.gpu.ubatch_utils: UBatchRunner."""
        return self._execution("vllm.v1.worker.gpu.ubatch_utils")

    def _execution(self, name: str) -> ModuleType:
        if name not in self.modules:
            raise ConfigError("execution", f"the vLLM under test has no {_rel(name)}")
        return self.modules[name]

    @property
    def cudagraph_utils(self) -> ModuleType:
        return self.modules["vllm.v1.worker.gpu.cudagraph_utils"]

    @property
    def dp_utils(self) -> ModuleType:
        return self.modules["vllm.v1.worker.gpu.dp_utils"]


def code_key(config: HarnessConfig) -> CodeKey:
    return CodeKey(config.system.vllm_src, config.system.vllm_patches)


def vllm_code(config: HarnessConfig) -> VllmCode:
    return code_for(code_key(config))


def check_same_release(config: HarnessConfig) -> None:
    """The miniature a vLLM's code is held to (and that decides beside its execution) must
    model that code's release; the command line sets it from the code, a config written by
    hand must agree."""
    api = vllm_code(config).api
    if api is not config.serving.release:
        raise ConfigError("release", f"is {config.serving.release.value}, but the vLLM under "
                          f"test has {api.value}'s API; set release to {api.value}")


def code_for(key: CodeKey) -> VllmCode:
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load(key)
        return _CACHE[key]


def ensure_vllm_importable(vllm_src: str | None) -> None:
    """With a checkout and no vllm that imports, the checkout is the vllm: put it on the
    path (once, in this process) before anything of vLLM is imported."""
    if vllm_src is None or importlib.util.find_spec("vllm") is not None:
        return
    root = str(Path(vllm_src).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)


def installed_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("sut", "vllm does not import here")
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def check_source_tree(vllm_src: str) -> Path:
    root = Path(vllm_src).resolve()
    if not root.is_dir():
        raise ConfigError("vllm_src", f"{vllm_src} is not a directory")
    missing = [m for m in DECISION_MODULES if not (root / _rel(m)).is_file()]
    if missing:
        raise ConfigError("vllm_src", f"{vllm_src} has no {_rel(missing[0])}: give the "
                          "directory that holds the vllm package of a checkout")
    return root


def _rel(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _identity(key: CodeKey, root: Path) -> VllmIdentity:
    import vllm

    imported = str(getattr(vllm, "__version__", "unknown"))
    version = tree_version(root, imported) if key.vllm_src else imported
    return VllmIdentity(version, str(root), git_commit(root), tuple(p.short for p in key.patches))


def _importable(name: str) -> ModuleType | None:
    """An execution module of the vllm that imports, or None where it has none."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None
        raise


def _load(key: CodeKey) -> VllmCode:
    ensure_vllm_importable(key.vllm_src)
    shared = {name: importlib.import_module(name) for name in DECISION_MODULES}
    shared.update({name: module for name in EXECUTION_MODULES
                   if (module := _importable(name)) is not None})
    if key.is_installed:
        return _recognised(key, shared, _identity(key, installed_root()))
    root = check_source_tree(key.vllm_src) if key.vllm_src else installed_root()
    patched = {module_name(rel): (root / rel, text)
               for rel, text in patched_files(root, key.patches).items()}
    # A tree without the execution modules (an older vLLM) decides all the same.
    ours = [m for m in MODULE_ORDER if m in DECISION_MODULES or (root / _rel(m)).is_file()]
    order = [m for m in patched if m not in ours] + ours
    sources = {m: patched.get(m) or (root / _rel(m), (root / _rel(m)).read_text())
               for m in order}
    names = ", ".join(p.name for p in key.patches)
    modules = _execute_privately(order, sources, set(patched), f" [patched: {names}]")
    return _recognised(key, {m: modules[m] for m in ours}, _identity(key, root))


def _recognised(key: CodeKey, modules: dict[str, ModuleType],
                identity: VllmIdentity) -> VllmCode:
    return VllmCode(key, modules, identity, detect_api(modules, identity.version))


class _InMemorySource(importlib.abc.SourceLoader):
    """Serves one module's source text from memory (tracebacks read it from here too)."""

    def __init__(self, filename: str, text: str) -> None:
        self._filename = filename
        self._data = text.encode()

    def get_filename(self, fullname: str) -> str:
        return self._filename

    def get_data(self, path: str) -> bytes:
        return self._data


def _execute_privately(order: list[str], sources: dict[str, tuple[Path, str]],
                       patched: set[str], mark: str) -> dict[str, ModuleType]:
    private: dict[str, ModuleType] = {}
    saved = {name: sys.modules.get(name) for name in order}
    parents = {name: sys.modules.get(name.rpartition(".")[0]) for name in order}
    saved_attrs = {name: getattr(parents[name], name.rpartition(".")[2], None)
                   for name in order}
    _imp.acquire_lock()  # no other thread imports while sys.modules names private copies
    try:
        for name in order:
            path, text = sources[name]
            filename = f"{path}{mark}" if name in patched else str(path)
            loader = _InMemorySource(filename, text)
            spec = importlib.util.spec_from_file_location(name, filename, loader=loader)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            if parents[name] is not None:
                setattr(parents[name], name.rpartition(".")[2], module)
            try:
                loader.exec_module(module)
            except Exception as exc:  # a broken patch is bad input, told in a line
                first = (str(exc).splitlines() or [""])[0]
                raise ConfigError("vllm_patch", f"{name} does not import with the patches: "
                                  f"{type(exc).__name__}: {first}") from None
            private[name] = module
    finally:
        for name in order:
            if saved[name] is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = saved[name]
            if parents[name] is not None and saved_attrs[name] is not None:
                setattr(parents[name], name.rpartition(".")[2], saved_attrs[name])
        _imp.release_lock()
    return private
