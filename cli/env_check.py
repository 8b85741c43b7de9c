"""Warn about `INFER_*` environment variables that no setting reads, naming the closest one.

A misspelt variable (`INFER_TEMP` for `INFER_TEMPERATURE`) would otherwise be ignored without a word.
llama.cpp's `LLAMA_ARG_*` variables are not read (documented in the README): each setting has one env
name, `INFER_<NAME>`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from infer.profiles.settings import ENV_PREFIX, SETTINGS

OTHER_VARIABLES = frozenset({"INFER_HOME", "INFER_API_KEY"})
"""`INFER_*` variables read outside the settings: the cache folder and `infer serve --api-key`."""


def _known() -> dict[str, str]:
    """Every accepted variable -> itself, and each flag spelt as a variable (`INFER_TEMP`) -> its twin."""
    known = {name: name for name in OTHER_VARIABLES}
    for spec in SETTINGS.values():
        known[spec.env] = spec.env
        for flag in spec.flags:
            if flag.startswith("--"):
                known.setdefault(ENV_PREFIX + flag[2:].replace("-", "_").upper(), spec.env)
    return known


def unknown_variable_warnings(env: Mapping[str, str]) -> list[str]:
    """One warning line per `INFER_*` variable no setting reads, with the closest accepted name."""
    known = _known()
    accepted = {name for name, target in known.items() if name == target}
    lines = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in accepted:
            continue
        # Compare what follows INFER_: the shared prefix would make every name look close.
        suffixes = {target[len(ENV_PREFIX) :]: target for target in accepted}
        close = difflib.get_close_matches(name[len(ENV_PREFIX) :], sorted(suffixes), n=1)
        closest = known.get(name) or (suffixes[close[0]] if close else None)
        hint = f"; did you mean {closest}?" if closest else ""
        lines.append(f"infer: warning: {name} is not a setting and is ignored{hint}")
    return lines
