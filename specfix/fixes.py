"""One switch per fix, all on by default, so every bug can be re-created on demand.

from specfix import Fixes
Fixes()                                  # everything fixed
Fixes(clamp_placeholders=False)          # re-create chapter 2's device-side assert
Fixes.all_off()                          # the code as it was before every fix
"""

from __future__ import annotations

import ast
import dataclasses
import html
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Fixes:
    #: vLLM PR #47029: ``_preprocess`` clamps ``input_ids`` to >= 0 before the embedding (chapters 1, 2).
    clamp_placeholders: bool = True
    #: vLLM PR #46533: the rejection sampler rejects any draft id < 0, in every mode (chapter 1).
    reject_negative_drafts: bool = True
    #: vLLM PR #47066: ``gumbel_block_argmax`` masks loads and the processed-logits store by
    #: ``req_state_idx >= 0`` (chapters 3, 4).
    mask_invalid_reqs: bool = True
    #: vLLM PR #47066: ``_copy_request_inputs`` fills ``idx_mapping[num_reqs:]`` with -1 (chapter 3).
    pad_idx_mapping: bool = True
    #: vLLM PR #47066: DFlash input preparation pads ``sample_idx_mapping`` with -1, not 0 (chapter 3).
    dflash_pad_idx: bool = True
    #: vLLM 0.33 Model Runner V2 (not 0.25): ``gather_draft_sampled`` marks the zeroed draft slots of a step
    #: that starts inside the prefill -1, so they are rejected, not judged as drafts (chapter 1).
    mark_placeholder_drafts: bool = True

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def all_off(cls) -> Fixes:
        return cls(**{name: False for name in cls.names()})

    def without(self, *names: str) -> Fixes:
        unknown = sorted(set(names) - set(self.names()))
        if unknown:
            raise ValueError(f"unknown fix name(s) {unknown}; known: {self.names()}")
        return dataclasses.replace(self, **{name: False for name in names})


# The lines a switch changes end in ``# [fix]`` (run only with the fix on) or ``# [no fix]`` (only with it
# off); ``show_fix`` reads the live source of each site, so what a chapter shows is what runs.

#: Where each switch acts: ``module:qualname`` of the functions (Triton kernels included) holding its lines.
FIX_SITES: dict[str, tuple[str, ...]] = {
    "clamp_placeholders": ("specfix.v1.model_runner:GPUModelRunner._preprocess",),
    "reject_negative_drafts": ("specfix.v1.rejection_kernels:rejection_random_sample_kernel",),
    "mask_invalid_reqs": ("specfix.mrv2.gumbel:gumbel_block_argmax",),
    "pad_idx_mapping": ("specfix.mrv2.speculator:DraftModelSpeculator._copy_request_inputs",),
    "dflash_pad_idx": ("specfix.mrv2.dflash:prepare_dflash_inputs",),
    "mark_placeholder_drafts": ("specfix.mrv2.draft_slots:gather_draft_sampled",),
}

_MARK = {"# [fix]": "+", "# [no fix]": "-"}


@dataclass(frozen=True)
class FixListing:
    """One switch's code sites as ``(site, path, first line, [(mark, text)])``; mark is "+", "-" or " "."""

    name: str
    sites: tuple[tuple[str, str, int, tuple[tuple[str, str], ...]], ...]

    def marked(self, mark: str) -> list[str]:
        return [text for *_, lines in self.sites for m, text in lines if m == mark]

    def __str__(self) -> str:
        out = [f"Fixes.{self.name}: '+' runs only with the fix on, '-' only with it off"]
        for site, path, first, lines in self.sites:
            out.append(f"\n{site}  ({path}:{first})")
            out.extend(f"{mark} {text}" for mark, text in lines)
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colours = {"+": "#d9f2d9", "-": "#f9d6d5", " ": "transparent"}
        parts = [
            f"<p><b><code>Fixes.{self.name}</code></b>: lines on <span style='background:{colours['+']}'>"
            f"green (+)</span> run only with the fix on, lines on <span style='background:{colours['-']}'>"
            "red (&minus;)</span> only with it off.</p>"
        ]
        for site, path, first, lines in self.sites:
            # a line longer than the page wraps, its continuation indented under the code (never cut off)
            rows = "".join(
                f"<div style='background:{colours[m]};padding-left:4ch;text-indent:-2ch'>"
                f"{m} {html.escape(t) or '&nbsp;'}</div>"
                for m, t in lines
            )
            parts.append(
                f"<p><code>{html.escape(site)}</code> "
                f"<small>({html.escape(path)}:{first})</small></p>"
                "<pre style='line-height:1.3;font-size:90%;white-space:pre-wrap;"
                f"overflow-wrap:anywhere'>{rows}</pre>"
            )
        return "".join(parts)


def _site_source(site: str) -> tuple[str, int, tuple[tuple[str, str], ...]]:
    """A site's file, first line and dedented source lines (decorators included) with their marks, read with
    ast: nothing is imported, so no module that imports this one is imported back by name."""
    module_name, qualname = site.split(":")
    root = Path(__file__).resolve().parent
    path = root.joinpath(*module_name.split(".")[1:]).with_suffix(".py")
    text = path.read_text()
    node = ast.parse(text)
    for name in qualname.split("."):
        node = next((n for n in node.body if getattr(n, "name", None) == name), None)
        if node is None:
            raise ValueError(f"fix site {site!r}: {path.name} defines no {name!r} at that level")
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    source = textwrap.dedent("".join(text.splitlines(keepends=True)[first - 1 : node.end_lineno]))
    return path.relative_to(root.parent).as_posix(), first, tuple(map(_marked, source.splitlines()))


def _marked(text: str) -> tuple[str, str]:
    tag = next((tag for tag in _MARK if text.rstrip().endswith(tag)), None)
    return (_MARK[tag], text.rstrip().removesuffix(tag).rstrip()) if tag else (" ", text)


def show_fix(name: str) -> FixListing:
    """The live source of every site of switch ``name``, its marked lines flagged; displays in a notebook."""
    if name not in Fixes.names():
        raise ValueError(f"name must be one of {Fixes.names()}, got {name!r}")
    return FixListing(name, tuple((site, *_site_source(site)) for site in FIX_SITES[name]))
