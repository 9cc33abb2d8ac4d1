"""mkdocs hooks: serve MathJax with the site, so that equations render with no network.

MathJax 3's ``tex-svg.js`` (one self-contained file: the TeX input and SVG output, no web fonts)
comes from the ``sphinx-mathjax-offline`` package (Apache 2.0, a dependency of the ``docs`` extra)
and is added to the site as ``javascripts/mathjax/tex-svg.js``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

MATHJAX = "javascripts/mathjax/tex-svg.js"


def _mathjax_source() -> Path:
    try:
        path = Path(str(distribution("sphinx-mathjax-offline").locate_file(
            "sphinx-mathjax-offline/static/mathjax/tex-svg.js")))
    except PackageNotFoundError:
        raise PluginError("MathJax for the site comes from the package sphinx-mathjax-offline: "
                          "pip install -e '.[docs]'") from None
    if not path.is_file():
        raise PluginError(f"{path}: missing from the installed sphinx-mathjax-offline")
    return path


def on_files(files, config):  # noqa: ANN001, ANN201 (mkdocs' hook signature)
    files.append(File.generated(config, MATHJAX, abs_src_path=str(_mathjax_source())))
    return files
