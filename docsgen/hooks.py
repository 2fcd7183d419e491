"""MkDocs hooks (``hooks:`` in mkdocs.yml): the generated parts of the pages, and the benchmark
report's pictures, which lives beside the report in bench/results/."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# MkDocs loads this file by its path; the packages it documents are imported from the
# repository, as the tests import them.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from docsgen import pages  # noqa: E402


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for picture in pages.bench_pictures():
        files.append(File.generated(config, picture.name, abs_src_path=str(picture)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return pages.fill(markdown)
