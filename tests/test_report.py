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


def _text(page: str) -> str:
    parser = _Structure()
    parser.feed(page)
    return " ".join(" ".join(parser.text).split())


def test_comparison_columns_are_labelled_as_ratios(seen):
    study, url = seen
    page = report.render_html(study, url)
    assert "<th>samples/s</th>" not in page
    if notes.summarize(study).comparisons():
        assert "<th>&times; samples/s</th>" in page
        assert "<th>&times; accuracy_per_second</th>" in page


def test_hardware_shows_what_the_trials_used(seen):
    recorded = {"device": "cpu", "cpu_cores": 2, "torch": "2.9.0", "cuda": "13.0", "cudnn": 92400}
    assert report.hardware_rows(recorded) == [
        ("device", "cpu"),
        ("cpu_cores", "2"),
        ("torch", "2.9.0"),
        ("cuda, cudnn", "not used (the trials ran on the CPU)"),
    ]
    on_gpu = report.hardware_rows({**recorded, "device": "cuda"})
    assert ("cuda", "13.0") in on_gpu and ("cudnn", "9.24.0") in on_gpu
    assert report.hardware_rows({}) == []
    study, url = seen  # a CPU study: its report names no CUDA version
    text = _text(report.render_html(study, url))
    assert "cuda, cudnn not used (the trials ran on the CPU)" in text


def test_cudnn_versions_read_as_cudnn_writes_them():
    assert report.cudnn_version(92400) == "9.24.0"
    assert report.cudnn_version(90100) == "9.1.0"
    assert report.cudnn_version(8907) == "8.9.7"
