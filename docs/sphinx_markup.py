"""A griffe extension for the API reference: the docstrings' reST markup as Markdown.

mkdocstrings-python parses the Sphinx field lists (``:param x:``, ``:raises X:``) but
leaves the rest of reST as it is, so ``:class:`Lock``` would read ":class:Lock" and a
literal block's ``::`` would stay on the page. This turns roles into code and literal
blocks into fenced code (Python where the block parses as Python).
"""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

import griffe

# :class:`Lock`, :meth:`~tierlock.LockManager.lock`: the target as code (after a ``~``,
# its last part only, as Sphinx shows it).
ROLE = re.compile(r":(?:class|meth|func|attr|exc|mod|data|obj):`(~?)([^`]+)`")


class SphinxMarkup(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)


def to_markdown(text: str) -> str:
    text = ROLE.sub(lambda role: f"`{role[2].split('.')[-1] if role[1] else role[2]}`", text)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        # reST: a lone "::" disappears, "text::" reads "text:".
        if line.strip() != "::":
            out.append(line.rstrip()[:-1])
        indent = len(line) - len(line.lstrip())
        block: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        code = textwrap.dedent("\n".join(block)).strip("\n")
        fence = " " * indent + "```"
        out += ["", fence + language(code), *textwrap.indent(code, " " * indent).split("\n")]
        out += [fence, ""]
    return "\n".join(out)


def language(code: str) -> str:
    try:
        compile(code, "<docstring>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return "text"
    return "python"
