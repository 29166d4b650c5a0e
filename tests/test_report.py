"""The HTML report: one valid file that opens offline."""

from __future__ import annotations

import html.parser

from autotune import notes, report


class _Structure(html.parser.HTMLParser):
    """Checks that elements close in order and collects the text."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.text: list[str] = []
        self.seen: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.seen.add(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_the_report_is_one_valid_offline_html_file(seen):
    study, url = seen
    page = report.render_html(study, url)
    parser = _Structure()
    parser.feed(page)
    parser.close()
    assert parser.problems == [] and parser.stack == []
    assert page.startswith("<!DOCTYPE html>") and {"html", "head", "body", "table"} <= parser.seen
    best = notes.summarize(study).best
    assert f"Best: trial {best.number}" in " ".join("".join(parser.text).split())
    assert "Plotly" in page and 'src="http' not in page  # plotly is inlined: opens offline
    for heading in ("Where the time goes", "Accuracy and speed", "Optimization history"):
        assert heading in page
