"""The fix switches: defaults, names, and the marked lines that ``show_fix`` puts on screen."""

import re
from pathlib import Path

import pytest

from specfix.fixes import FIX_SITES, Fixes, show_fix

PACKAGE = Path(__file__).resolve().parents[1] / "specfix"


def test_every_fix_is_on_by_default():
    assert all(getattr(Fixes(), name) for name in Fixes.names())
    assert not any(getattr(Fixes.all_off(), name) for name in Fixes.names())


def test_without_names_the_unknown_switch():
    with pytest.raises(ValueError, match=r"unknown fix name\(s\) \['clamp'\]"):
        Fixes().without("clamp")


@pytest.mark.parametrize("name", Fixes.names())
def test_each_switch_shows_the_lines_it_changes(name):
    listing = show_fix(name)
    assert listing.marked("+"), f"{name}: no '# [fix]' line left in {FIX_SITES[name]}"
    text = str(listing)
    assert all(f"+ {line}" in text for line in listing.marked("+"))
    assert "# [fix]" not in text and "# [no fix]" not in text  # the markers themselves are not shown
    assert "<pre" in listing._repr_html_()
    # long source lines wrap on the page instead of running past its right edge
    assert "white-space:pre-wrap" in listing._repr_html_()


def test_the_switch_itself_is_read_on_a_marked_line():
    """A listing that marks lines without ever reading its switch would show the wrong code."""
    kernel_flag = {"mask_invalid_reqs": "MASK_INVALID", "reject_negative_drafts": "REJECT_NEGATIVE_DRAFTS"}
    for name in Fixes.names():
        marked = " ".join(show_fix(name).marked("+") + show_fix(name).marked("-"))
        assert re.search(rf"\b{kernel_flag.get(name, name)}\b", marked), name


def test_every_marker_in_the_package_sits_in_a_registered_site():
    shown = {
        (site_path, first + i)
        for name in Fixes.names()
        for _, site_path, first, lines in show_fix(name).sites
        for i in range(len(lines))
    }
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.rstrip().endswith(("# [fix]", "# [no fix]")):
                rel = path.relative_to(PACKAGE.parent).as_posix()
                assert (rel, number) in shown, f"{rel}:{number} is marked but no FIX_SITES entry shows it"


def test_show_fix_names_the_bad_switch():
    with pytest.raises(ValueError, match=r"name must be one of .*got 'clamp'"):
        show_fix("clamp")
