"""Command-line flags naming the vLLM code under test (`--sut vllm`): patches applied over
it, a checkout to take its decision modules from, and the differential against the base.

Everything is checked before any world starts: a patch that does not parse or apply, or
names a file the tree lacks, is one line and exit 2. The line naming the vLLM tested
(version, path, git commit, patches) is what every command prints."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from harness.config import HarnessConfig, Release
from harness.errors import ConfigError
from harness.scenario import Scenario
from harness.vllm_code.source import VllmPatch, read_patch


def add_vllm_flags(parser: argparse.ArgumentParser, *, sut_flag: bool = True,
                   differential: bool = True) -> None:
    g = parser.add_argument_group("vLLM code under test (with --sut vllm)")
    if sut_flag:
        g.add_argument("--sut", choices=["harness", "vllm"], default="harness",
                       help="whose decision code the ranks run: the harness's (default) or "
                       "vLLM's")
    g.add_argument("--vllm-patch", action="append", default=[], metavar="FILE",
                   help="a unified diff against vLLM's tree (vllm/...py), applied in memory "
                   "to private copies of the files it touches (repeatable, in order)")
    g.add_argument("--vllm-fix", action="append", default=[], metavar="NAME",
                   help="one of the project's fixes of a known vLLM bug, by file name "
                   "(scenarios/vllm/patches/; the one written against the tested release "
                   "where there is one), applied before any --vllm-patch (repeatable)")
    g.add_argument("--vllm-src", metavar="DIR",
                   help="a vLLM checkout (the directory holding its vllm package) whose "
                   "decision modules replace the installed ones")
    if differential:
        g.add_argument("--differential-against", choices=["base"],
                       help="also hold the patched vLLM's decisions to the unpatched one's "
                       "(checker differential_base)")


def _sut(args: argparse.Namespace) -> str:
    return getattr(args, "sut", "harness")


def vllm_fields(args: argparse.Namespace, sut: str | None = None,
                each_alone: bool = False) -> dict[str, Any]:
    """The config fields the flags give, read and checked against the tree they patch: in
    order, one over the other, or (`each_alone`, the matrix's rows) each by itself."""
    sut = sut or _sut(args)
    differential = getattr(args, "differential_against", None) == "base"
    executes = getattr(args, "execution", "harness") == "vllm"
    fixes = _fixes(args)
    if sut != "vllm" and not executes:
        given = ("vllm_patch" if args.vllm_patch else "vllm_fix" if fixes
                 else "vllm_src" if args.vllm_src
                 else "differential_against" if differential else None)
        if given:
            raise ConfigError(given, "names vLLM code; it needs --sut vllm or --exec vllm")
        return {}
    release = None
    if fixes:  # named for the release of the tree they fix: that tree is checked first
        check_vllm_code(args.vllm_src, ())
        release = release_of(args.vllm_src).value
    patches = tuple(read_patch(path) for path in
                    [*(_fix(name, release) for name in fixes), *args.vllm_patch])
    names = [p.name for p in patches]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError("vllm_patch", f"{twice} is given twice")
    for group in ([(p,) for p in patches] if each_alone else [patches]):
        check_vllm_code(args.vllm_src, group)
    fields = {"vllm_src": args.vllm_src, "vllm_patches": patches,
              "differential_against_base": differential,
              "release": release or release_of(args.vllm_src).value}
    if sut == "vllm":
        fields["sut"] = "vllm"
    if executes:
        fields["execution"] = "vllm"
    return fields


def _fixes(args: argparse.Namespace) -> list[str]:
    return getattr(args, "vllm_fix", None) or []


def _fix(name: str, release: str) -> str:
    """A known fix's file for the tested release, or one line naming the field."""
    from harness.vllm_code.fixes import fix_names, fix_path, releases_fixed

    path = fix_path(name, release)
    if path is None and releases_fixed(name):
        raise ConfigError("vllm_fix", f"{name} fixes vLLM {', '.join(releases_fixed(name))}'s "
                          f"code, not {release}'s")
    if path is None:
        raise ConfigError("vllm_fix", f"no fix {name!r} for vLLM {release} (known: "
                          f"{', '.join(fix_names())})")
    return str(path)


def release_of(vllm_src: str | None) -> Release:
    """The release whose API the vLLM tree has (patches, which the matrix applies one at a
    time, do not change it): the miniature and the spec model that one, so that the reference
    a vLLM decision is held to is its own release's."""
    from harness.vllm_sut.code import CodeKey, code_for

    return code_for(CodeKey(vllm_src)).api


def check_vllm_code(vllm_src: str | None, patches: tuple[VllmPatch, ...]) -> None:
    """vLLM imports (the checkout on the path where none is installed) and every patch
    applies to the tree it names: its modules load with the patches, here, now."""
    from harness.vllm_sut.available import unavailable_reason, vllm_version
    from harness.vllm_sut.code import check_source_tree, ensure_vllm_importable

    if vllm_src is not None:
        check_source_tree(vllm_src)
    ensure_vllm_importable(vllm_src)
    if vllm_version() is None:
        raise ConfigError("sut", f"vllm cannot be used here: {unavailable_reason()} "
                          "(make test-vllm installs it)")
    from harness.vllm_sut.code import CodeKey, code_for

    code_for(CodeKey(vllm_src, patches))


def tested_vllm(config: HarnessConfig) -> str:
    """One line naming the vLLM code a config tests ('' for the harness's own)."""
    if not config.uses_vllm:
        return ""
    from harness.sut.systems import base_config
    from harness.vllm_sut.code import vllm_code

    line = f"vllm under test: {vllm_code(config).identity.describe()}"
    base = base_config(config)
    if base is not None:
        line += f"; held against {vllm_code(base).identity.describe()}"
    return line


def tested_vllm_json(config: HarnessConfig) -> dict[str, Any] | None:
    if not config.uses_vllm:
        return None
    from harness.vllm_sut.code import vllm_code

    return vllm_code(config).identity.to_dict()


def replay_flags(config_fields: dict[str, Any]) -> str:
    """The flags a replay of a finding needs to run the same vLLM code."""
    flags = [f"--vllm-patch {p.path or p.name}" for p in config_fields.get("vllm_patches", ())]
    if config_fields.get("vllm_src"):
        flags.append(f"--vllm-src {config_fields['vllm_src']}")
    if config_fields.get("differential_against_base"):
        flags.append("--differential-against base")
    return " ".join(flags)


def scenario_with_vllm_code(scenario: Scenario, args: argparse.Namespace) -> tuple[Scenario, str]:
    """The scenario with the vLLM code the flags give, held to what it recorded: a scenario
    found on patched code runs only with those patches (by content hash), so that a replay
    tests the code it was found on. Returns it and a note for the user ('' if none)."""
    config = scenario.config
    if not config.uses_vllm:
        vllm_fields(args, config.system.sut.value)  # refuses vLLM flags for the harness's code
        return scenario, ""
    given = tuple(read_patch(path) for path in args.vllm_patch)
    differential = args.differential_against == "base"
    recorded = config.system.vllm_patches
    by_hash = {p.sha256: p for p in given}
    missing = [p for p in recorded if p.sha256 not in by_hash and not p.resolved]
    if missing:
        raise ConfigError("vllm_patches", f"the scenario was found on vLLM patched with "
                          f"{missing[0].short}; replay it with --vllm-patch FILE holding that "
                          "content (no such patch was given)")
    recorded_hashes = {p.sha256 for p in recorded}
    note = ""
    if recorded and any(p.sha256 not in recorded_hashes for p in given):
        extra = next(p for p in given if p.sha256 not in recorded_hashes)
        raise ConfigError("vllm_patch", f"{extra.short} is not among the patches the "
                          f"scenario was found with ({', '.join(p.short for p in recorded)})")
    if given and not recorded:
        note = (f"note: the scenario recorded unpatched vLLM; running it with "
                f"{', '.join(p.short for p in given)}")
    patches = tuple(by_hash.get(p.sha256, p) for p in recorded) or given
    src = args.vllm_src or config.system.vllm_src
    if src != config.system.vllm_src and config.system.vllm_src is not None:
        note = f"note: the scenario recorded --vllm-src {config.system.vllm_src}; running {src}"
    check_vllm_code(src, patches)
    release = release_of(src)
    if release is not config.serving.release:
        note = "; ".join(n for n in (note, f"note: the scenario modelled vLLM "
                                     f"{config.serving.release.value}; the vLLM under test "
                                     f"has {release.value}'s API, so it runs as {release.value}")
                         if n)
    new = config.with_changes(vllm_src=src, vllm_patches=patches, release=release.value,
                              differential_against_base=differential
                              or config.system.differential_against_base)
    return replace(scenario, config=new), note
