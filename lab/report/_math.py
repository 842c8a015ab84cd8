"""LaTeX math in markdown -> MathML at export time, so formulas render with no MathJax CDN.

Chromium (and every current browser) draws MathML natively. Math spans (``$...$``,
``$$...$$``) outside code are swapped for plain placeholders before nbconvert renders the
markdown (so markdown never sees ``_`` or ``*`` inside a formula), then for MathML made by
``latex2mathml`` afterwards. Without that package the TeX source stays as it was.
"""
from __future__ import annotations

import html
import re
import uuid

_CODE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$|(`+).+?\2", re.M | re.S)  # fenced blocks, code spans
_DISPLAY = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$", re.S)
# pandoc's rule: no space just inside the dollars, no digit right after the closing one ($5 and $6)
_INLINE = re.compile(r"(?<![\\$])\$(?![\s$])((?:\\\$|[^$\n])+?)(?<![\s\\])\$(?!\d)")


class MathToMathML:
    """Collects the formulas of one notebook: :meth:`protect` sources, then :meth:`restore` HTML."""

    def __init__(self) -> None:
        self._salt = uuid.uuid4().hex[:8]
        self._formulas: list[tuple[str, str]] = []  # (tex, "inline" | "block")
        try:
            from latex2mathml.converter import convert
        except ImportError:
            convert = None
        self._convert = convert

    @property
    def missing_converter(self) -> bool:
        """True when formulas were found but latex2mathml is not installed (they stay as TeX)."""
        return bool(self._formulas) and self._convert is None

    def _token(self, tex: str, display: str) -> str:
        self._formulas.append((tex, display))
        return f"LABMATH{self._salt}N{len(self._formulas) - 1}E"

    def _protect_text(self, text: str) -> str:
        text = _DISPLAY.sub(lambda m: self._token(m.group(1), "block"), text)
        return _INLINE.sub(lambda m: self._token(m.group(1), "inline"), text)

    def protect(self, source: str) -> str:
        """``source`` with its math spans (outside code) replaced by placeholders."""
        if self._convert is None and "$" not in source:
            return source
        out, last = [], 0
        for m in _CODE.finditer(source):
            out += [self._protect_text(source[last:m.start()]), m.group(0)]
            last = m.end()
        out.append(self._protect_text(source[last:]))
        protected = "".join(out)
        if self._convert is None:  # keep the TeX: only report that there was some
            return source
        return protected

    def restore(self, page: str) -> str:
        """Put MathML (or, if a formula does not convert, its TeX source) where the placeholders are."""
        def one(m: re.Match) -> str:
            tex, display = self._formulas[int(m.group(1))]
            try:
                return self._convert(tex.strip(), display=display)
            except Exception:  # noqa: BLE001 - show the source rather than lose the formula
                return f"<code>{html.escape(tex)}</code>"

        token = re.compile(rf"LABMATH{self._salt}N(\d+)E")
        # Inside a tag (a heading's id/href anchor) a formula becomes plain characters.
        page = re.sub(r"<[^<>]*LABMATH[^<>]*>", lambda t: token.sub(
            lambda m: re.sub(r"[^\w-]", "", self._formulas[int(m.group(1))][0]), t.group(0)), page)
        return token.sub(one, page)
