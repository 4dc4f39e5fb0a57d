"""The configuration page (docs/operations/configuration.md) names exactly the settings the
code reads: the app's ``pikku_*`` settings and the ``PIKKU_*`` environment variables.

What the code reads is found in its source: a ``pikku_*`` key read from a Celery app's
``conf`` (``conf.get(key)``, ``conf.pikku_x``, or a helper handed the ``conf`` and the key),
and every ``PIKKU_*`` name written as a string in the package, with those the command's
options read (``[env: NAME]`` in their help, some built from a prefix).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pikku_celery
from pikku_celery.cli.commands import build_parser
from tests.docs.pages import DOCS

PACKAGE = Path(pikku_celery.__file__).parent
PAGE = DOCS / "operations" / "configuration.md"
_ENV = re.compile(r"PIKKU_[A-Z0-9_]*[A-Z0-9]")
_SETTING = re.compile(r"pikku_[a-z0-9_]*[a-z0-9]")


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's names bound to a string (``NAME = "..."`` or ``NAME: Final = "..."``)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return found


def _is_conf(node: ast.expr) -> bool:
    return ast.unparse(node).split(".")[-1] == "conf"


def settings_in(source: str) -> tuple[set[str], set[str]]:
    """The ``pikku_*`` settings a module reads from a Celery ``conf``, and the ``PIKKU_*``
    names it writes as strings."""
    tree = ast.parse(source)
    constants = _constants(tree)

    def text(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    # `__all__` names Python objects (a constant may be called PIKKU_...), not settings.
    exported = {
        id(element)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for element in ast.walk(node.value)
    }
    settings: set[str] = set()
    env: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _ENV.fullmatch(node.value) and id(node) not in exported:
                env.add(node.value)
        elif isinstance(node, ast.Attribute) and _is_conf(node.value):
            settings.add(node.attr)
        elif isinstance(node, ast.Call):
            func = node.func
            reads_conf = (
                isinstance(func, ast.Attribute) and func.attr == "get" and (_is_conf(func.value))
            )
            if reads_conf or any(_is_conf(arg) for arg in node.args):
                settings.update(t for arg in node.args if (t := text(arg)) is not None)
    return {s for s in settings if _SETTING.fullmatch(s)}, env


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def read_by_code() -> tuple[set[str], set[str]]:
    settings: set[str] = set()
    env: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        found_settings, found_env = settings_in(path.read_text(encoding="utf-8"))
        settings |= found_settings
        env |= found_env
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            env.update(re.findall(r"\[env: (PIKKU_[A-Z0-9_]+)\]", action.help or ""))
    return settings, env


def _first_column(section: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE))


def named_by_page() -> tuple[set[str], set[str]]:
    text = PAGE.read_text(encoding="utf-8")
    settings_part = text[text.index("## The app's settings") : text.index("## Environment")]
    env_part = text[text.index("## Environment variables") :]
    return _first_column(settings_part), _first_column(env_part)


def test_the_page_names_every_setting_the_code_reads_and_no_other() -> None:
    code_settings, code_env = read_by_code()
    page_settings, page_env = named_by_page()
    assert code_settings - page_settings == set(), "read by the code, missing from the page"
    assert page_settings - code_settings == set(), "on the page, read nowhere in the code"
    assert code_env - page_env == set(), "read by the code, missing from the page"
    assert page_env - code_env == set(), "on the page, read nowhere in the code"


def test_the_app_settings_table_names_each_variable_the_code_reads_beside_it() -> None:
    """A setting's environment variable, in its row, is one the code reads."""
    _, code_env = read_by_code()
    text = PAGE.read_text(encoding="utf-8")
    rows = text[text.index("## The app's settings") : text.index("## Environment")]
    assert set(_ENV.findall(rows)) <= code_env


def test_the_scan_finds_each_way_a_setting_is_read() -> None:
    """What the page test relies on: a new setting read any of these ways is found."""
    source = """
KEY = "pikku_from_constant"
ENV_NAME: Final = "PIKKU_FROM_CONSTANT"
a = app.conf.get("pikku_from_get")
b = self.app.conf.get(KEY)
c = app.conf.pikku_from_attribute
d = _setting(conf, "pikku_from_helper", "PIKKU_FROM_HELPER")
e = other.get("pikku_not_a_setting")
f = f"PIKKU_PREFIX_{name}"
__all__ = ["PIKKU_EXPORTED_CONSTANT"]
"""
    settings, env = settings_in(source)
    assert settings == {
        "pikku_from_constant",
        "pikku_from_get",
        "pikku_from_attribute",
        "pikku_from_helper",
    }
    assert env == {"PIKKU_FROM_CONSTANT", "PIKKU_FROM_HELPER"}
