"""The package's layout by role: every module (or subpackage) of v1/, mrv2/, lab/ and tools/ keeps its
short name in ``specfix`` (``from specfix import gumbel``), and no two roles use the same short name."""

import importlib
from pathlib import Path

import pytest

import specfix

ROLES = ("v1", "mrv2", "lab", "tools")
PACKAGE = Path(specfix.__file__).parent


def test_no_short_name_is_used_twice():
    names = [p.stem for role in ROLES for p in (PACKAGE / role).glob("[!_]*.py")]
    names += [p.parent.name for role in ROLES for p in (PACKAGE / role).glob("[!_]*/__init__.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert set(specfix._SUBPACKAGE) == set(names)


@pytest.mark.parametrize("name", sorted(specfix._SUBPACKAGE))
def test_a_short_name_loads_the_module_of_its_role(name):
    module = getattr(specfix, name)
    assert module is importlib.import_module(f"specfix.{specfix._SUBPACKAGE[name]}.{name}")


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
        specfix.no_such_module  # noqa: B018
