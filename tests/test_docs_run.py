"""The documentation is executed: every code block of README.md and docs/ that is meant to run
runs here, and every ``dvml ...`` command line in them parses with the real ``dvml`` parser.

Pages are found, not listed: README.md and every ``.md`` under docs/ (a new page is tested
the day it is added). Sybil (``sybil.parsers.markdown``) finds the fenced blocks:

- ``python`` blocks run in order, in one namespace per page, on ONE shared cluster
  (``cluster4``: 4 workers on 2 simulated hosts, GPUs declared on the first two, exactly the
  cluster the pages' ``dvml.LocalCluster(n_workers=4, hosts=2, gpus=[1, 1, 0, 0])`` starts, so
  that call yields it instead of starting another). The names a page's prose takes as given
  (``frame``, ``val_frame``, ``raw_frame`` and ``model`` for digits, the datasets
  ``"digits"``/``"digits_val"``, ``arch_id`` ...) are prepared by :data:`SETUP` before its
  first block; the data is a small slice of scikit-learn's digits, the blocks are run as
  written. Datasets, feature caches and models a page made are dropped after it (the registry
  is a private SQLite file).
- A block preceded by an HTML comment ``<!-- not run: REASON -->`` is not run (placeholder
  buckets, GPUs, several hosts, elided arguments); :func:`test_not_run_blocks_are_listed`
  lists every one with its reason, so none is silent, and refuses an empty reason or a marker
  that stands before no block.
- ``bash``/``sh``/``shell``/``console`` blocks are not run: each ``dvml ...`` line in them is
  parsed with :func:`dvml.cli.reference_parser` (synopsis lines too: ``list | describe NAME``
  are the commands ``dvml models list`` and ``dvml models describe NAME``; ``[--dry-run]`` is
  tried with and without), and each inline ``dvml ...`` code span in the prose must name real
  groups, commands and options (deprecated command names are not real here).
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import argparse

    import dvml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


INCLUDE = re.compile(r"^```\{include\}\s+(?P<path>\S+)", re.MULTILINE)
# CHANGELOG.md (docs/changelog.md includes it) records what was true when each entry was written.
NOT_PAGES = ("CHANGELOG.md",)


def doc_pages() -> list[pathlib.Path]:
    """README.md, every Markdown page under docs/ (not the build output) and the Markdown files
    those pages include (workflows/README.md, cluster/README.md), each once."""
    pages = [p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts]
    found = [ROOT / "README.md", *sorted(pages)]
    for page in list(found):
        for m in INCLUDE.finditer(page.read_text()):
            included = (page.parent / m.group("path")).resolve()
            if included.suffix == ".md" and included.name not in NOT_PAGES:
                found.append(included)
    return list(dict.fromkeys(found))


def page_id(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


# --------------------------------------------------------------------------- finding blocks

NOT_RUN = re.compile(r"<!--\s*not run:(?P<reason>.*?)-->", re.DOTALL)
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


@dataclass
class Block:
    """One fenced code block of a page, as Sybil found it."""

    page: str
    line: int
    language: str
    source: str
    example: Any  # sybil.Example; None for a block Sybil does not evaluate
    not_run: str | None  # the reason given by a <!-- not run: ... --> marker before it


def _sybil_document(path: pathlib.Path) -> Any:
    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

    def no_evaluation(example: Any) -> None:
        raise AssertionError("shell blocks are parsed, never run")  # pragma: no cover

    parsers: list[Any] = [PythonCodeBlockParser()]
    parsers += [CodeBlockParser(language, no_evaluation) for language in SHELL_LANGUAGES]
    return Sybil(parsers=parsers).parse(path)


def page_blocks(path: pathlib.Path) -> list[Block]:
    """The python and shell blocks of a page, in order, each with its not-run reason."""
    document = _sybil_document(path)
    text = document.text
    markers = [(m.end(), m.group("reason").strip()) for m in NOT_RUN.finditer(text)]
    blocks = []
    for example in document.examples():
        region = example.region
        start = region.start
        header = text[start : text.index("\n", start)].strip()
        if header.startswith(("```", "~~~")):
            language = header.lstrip("`~").strip().split()[0]
        else:  # one prompt of a doctest block (">>>"): the block's fence is before it
            language = "python"
            start = text.rfind("\n", 0, text.rfind("```", 0, start)) + 1
        # a marker counts for the block right after it (only blank space between them)
        reason = next(
            (r for end, r in markers if end <= start and not text[end:start].strip()),
            None,
        )
        blocks.append(
            Block(page_id(path), example.line, language, str(example.parsed), example, reason)
        )
    return blocks


def orphan_markers(path: pathlib.Path) -> list[int]:
    """Lines of not-run markers that stand before no python or shell block."""
    text = path.read_text()
    starts = {b.line for b in page_blocks(path)}
    orphans = []
    for m in NOT_RUN.finditer(text):
        rest = text[m.end() :]
        skipped = len(rest) - len(rest.lstrip())
        line = text.count("\n", 0, m.end() + skipped) + 1
        if line not in starts:
            orphans.append(text.count("\n", 0, m.start()) + 1)
    return orphans


# --------------------------------------------------------------------------- the dvml parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_command(argv: list[str]) -> str | None:
    """None when ``dvml argv...`` parses (``--help`` included); else argparse's message."""
    from dvml.cli import reference_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            reference_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


def synopsis_commands(line: str) -> list[list[str]]:
    """The argument lists a documented ``dvml ...`` line stands for (without ``dvml``).

    ``A | B`` (spaces around the bar) are alternatives of the same group: ``dvml models list |
    describe NAME`` is ``models list`` and ``models describe NAME``; ``[--x]`` is optional: each
    line is tried with every bracketed part and with none.
    """
    alternatives = [a.strip() for a in line.split(" | ")]
    first = shlex.split(alternatives[0])
    assert first[0] == "dvml", line
    group = first[1:2]
    lines = [first[1:]] + [group + shlex.split(a) for a in alternatives[1:]]
    commands = []
    for words in lines:
        text = " ".join(words)
        commands.append(shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", text)))
        commands.append(shlex.split(re.sub(r"\[[^\]]*\]", "", text)))
    return [list(c) for c in dict.fromkeys(tuple(c) for c in commands)]


def shell_command_lines(source: str) -> list[str]:
    """The ``dvml ...`` commands of a shell block (comments cut, ``;``/``&&`` split)."""
    found = []
    for raw in source.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip().removeprefix("$ ").strip()
        for part in re.split(r"\s*(?:;|&&)\s*", line):
            if part == "dvml" or part.startswith("dvml "):
                found.append(part)
    return found


INLINE = re.compile(r"(?<!`)`(dvml(?: [^`\n]*)?)`(?!`)")


def check_inline(span: str) -> str | None:
    """A prose ``dvml ...`` span: its groups, commands and options must exist; values and
    placeholders are not checked (a span may quote part of a command line). ``a|b`` names
    several commands. None when it is fine, else what is wrong."""
    from dvml.cli import reference_parser

    words = span.split()[1:]
    if not words or not re.fullmatch(r"[a-z-][\w|-]*", words[0]):
        return None  # "dvml / baseline", "dvml ... --debug": not a command line
    parsers = [reference_parser()]
    for word in words:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            missing = [p.prog for p in parsers if option not in p._option_string_actions]
            if missing:
                return f"{option} is not an option of {missing}"
            continue
        subs = [_subcommands(p) for p in parsers]
        if not all(subs):
            continue  # a positional value (NAME, a path)
        names = word.split("|")
        unknown = [n for n in names for s in subs if n not in s]
        if unknown:
            return f"{unknown} is not a command of {[p.prog for p in parsers]}"
        parsers = [s[n] for s in subs for n in names]
    return None


# --------------------------------------------------------------------------- CLI checks


def _shell_blocks() -> list[Block]:
    return [b for p in doc_pages() for b in page_blocks(p) if b.language in SHELL_LANGUAGES]


def test_docs_have_cli_lines_to_check() -> None:
    """The collection itself: the pages' shell blocks hold dvml lines (a broken finder that
    found nothing would pass every check below)."""
    lines = [line for b in _shell_blocks() for line in shell_command_lines(b.source)]
    assert len(lines) >= 10, lines
    assert any(line.startswith("dvml automl") for line in lines), lines


@pytest.mark.parametrize("path", doc_pages(), ids=page_id)
def test_cli_lines_parse(path: pathlib.Path) -> None:
    """Every ``dvml ...`` line of the page's shell blocks parses with dvml's argparse parser,
    and every inline ``dvml ...`` span names real commands and options."""
    failures = []
    for block in page_blocks(path):
        if block.language not in SHELL_LANGUAGES:
            continue
        for line in shell_command_lines(block.source):
            for argv in synopsis_commands(line):
                error = parse_command(argv)
                if error:
                    failures.append(f"{block.page}:{block.line}: dvml {shlex.join(argv)}: {error}")
    for match in INLINE.finditer(path.read_text()):
        error = check_inline(match.group(1))
        if error:
            failures.append(f"{page_id(path)}: `{match.group(1)}`: {error}")
    assert not failures, "\n".join(failures)


def test_cli_check_catches_a_wrong_line() -> None:
    """The checks can fail: an unknown option, a missing required one, an unknown command."""
    assert parse_command(["fit", "--config", "x.yaml"]) is None
    assert parse_command(["automl", "--config", "x.yaml", "--resume"]) is None
    assert parse_command(["fit", "--confg", "x.yaml"])
    assert parse_command(["automl"])  # --config is required
    assert [parse_command(a) for a in synopsis_commands("dvml models list | shw NAME")][1]
    assert check_inline("dvml cluster up --n-workers 2") is None
    assert check_inline("dvml cluster upp")
    assert check_inline("dvml fit|evaluate --nope")
    assert check_inline("dvml fit|evaluate --config") is None


# --------------------------------------------------------------------------- not-run markers


def test_not_run_blocks_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    """Every block that is not run says why, right before it; the list is printed (run with
    ``-s`` or read the captured output) so that no block is skipped silently."""
    blocks_to_run()  # prints the pages whose blocks are copies, run on the first page only
    marked = [b for p in doc_pages() for b in page_blocks(p) if b.not_run is not None]
    for block in marked:
        print(f"not run: {block.page}:{block.line}: {block.not_run}")
    assert all(b.not_run for b in marked), [f"{b.page}:{b.line}" for b in marked if not b.not_run]
    orphans = {page_id(p): orphan_markers(p) for p in doc_pages()}
    assert not any(orphans.values()), f"markers before no code block: {orphans}"
    python = [b for p in doc_pages() for b in page_blocks(p) if b.language == "python"]
    run = [b for b in python if b.not_run is None]
    # most blocks run: a marker is for the few that cannot
    assert len(run) > 2 * len(marked), (len(run), [f"{b.page}:{b.line}" for b in marked])


# --------------------------------------------------------------------------- running pages


@dataclass
class PageContext:
    cluster: dvml.LocalCluster
    tmp: pathlib.Path
    namespace: dict[str, Any]


def _digits(ctx: PageContext) -> None:
    """``frame`` (400 rows), ``val_frame`` (200) and ``raw_frame`` (5, with ``id``) of
    scikit-learn's digits; ``model``: the digits CNN, a tf-keras model."""
    from dvml.examples import digits_frame
    from tests.helpers.models import cnn

    data = digits_frame(seed=0)
    ctx.namespace.update(
        frame=data.iloc[:400].reset_index(drop=True),
        val_frame=data.iloc[400:600].reset_index(drop=True),
        raw_frame=data.iloc[600:605].reset_index(drop=True),
        test=data.iloc[600:605].reset_index(drop=True),
        model=cnn(),
    )


def _packed(ctx: PageContext) -> None:
    """The datasets ``"digits"`` and ``"digits_val"`` of the frames above (as ``ds``/``val``)."""
    import dvml

    ns = ctx.namespace
    ns["ds"] = dvml.training_preprocessor(
        ns["frame"], y="label", x="pixels", normalizing_const=16.0, name="digits"
    )
    ns["val"] = dvml.validation_preprocessor(
        ns["val_frame"], y="label", x="pixels", training="digits", name="digits_val"
    )


def _arch(ctx: PageContext) -> None:
    """``arch_id``: the CNN loaded into the registry."""
    import dvml

    ctx.namespace["arch_id"] = dvml.load_keras_model(ctx.namespace["model"].to_json(), name="cnn")


def _photos(ctx: PageContext) -> None:
    """A folder ``photos/<class>/<image>.png`` in the page's working directory."""
    from tests.helpers.data import write_image_folder

    write_image_folder(ctx.tmp / "photos", n_per_class=4)


def _backbone(ctx: PageContext) -> None:
    """``images`` (a packed image dataset), ``backbone`` (with a layer ``pool``) and
    ``head_arch_id`` (a head on its pooled features)."""
    import dvml
    from tests.helpers.data import write_image_folder
    from tests.helpers.models import keras

    write_image_folder(ctx.tmp / "photos", n_per_class=24)  # 16 rows a worker: batch_size=64
    k = keras()
    inputs = k.Input((32, 32, 3))
    x = k.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = k.layers.Conv2D(16, 3, activation="relu", name="pool")(x)
    backbone = k.Model(inputs, x)
    head = k.Sequential([k.layers.InputLayer(input_shape=(16,)), k.layers.Dense(3, "softmax")])
    ctx.namespace.update(
        images=dvml.training_preprocessor(
            str(ctx.tmp / "photos"), image_size=(32, 32), channels=3, name="flowers"
        ),
        backbone=backbone,
        head_arch_id=dvml.load_keras_model(head.to_json(), name="head"),
    )


# What each page's prose takes as given. A page not listed starts with `dvml` imported only.
SETUP: dict[str, list[Callable[[PageContext], None]]] = {
    "README.md": [_digits],
    "docs/getting-started.md": [_digits],
    "docs/concepts/datasets.md": [_digits],
    "docs/guides/data-sources.md": [_digits, _photos],
    "docs/guides/fit.md": [_digits, _packed],
    "docs/guides/fit-multiple.md": [_digits, _packed, _arch],
    "docs/guides/model-search.md": [_digits, _packed, _arch],
    "docs/guides/own-training-loop.md": [_digits, _packed],
    "docs/guides/memory.md": [_digits, _packed, _arch],
    "docs/guides/transfer-learning.md": [_backbone],
}


def blocks_to_run() -> dict[pathlib.Path, list[Block]]:
    """Per page, its python blocks to run (all of them, or none). A page whose every block is
    the same, character for character, as a block of an earlier page (getting-started's tour
    is README's) runs there only; an edit to one copy makes them differ, and both run."""
    seen: dict[str, str] = {}
    pages: dict[pathlib.Path, list[Block]] = {}
    for path in doc_pages():
        blocks = [b for b in page_blocks(path) if b.language == "python" and b.not_run is None]
        copies = all(b.source in seen for b in blocks)
        pages[path] = [] if copies else blocks
        for b in blocks:
            seen.setdefault(b.source, f"{b.page}:{b.line}")
        if copies and blocks:
            print(f"run once: {page_id(path)}: same code as {[seen[b.source] for b in blocks]}")
    return pages


def runnable_pages() -> list[pathlib.Path]:
    return [path for path, blocks in blocks_to_run().items() if blocks]


class SharedCluster:
    """The session's cluster as a page's ``dvml.LocalCluster(...)``: every attribute is the
    cluster's, but leaving ``with`` or calling ``close()`` leaves it running."""

    def __init__(self, cluster: dvml.LocalCluster) -> None:
        self._cluster = cluster

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def __enter__(self) -> SharedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None


@contextlib.contextmanager
def shared_local_cluster(cluster: dvml.LocalCluster) -> Iterator[None]:
    """``dvml.LocalCluster(n_workers=4, hosts=2, gpus=[1, 1, 0, 0])`` in a page yields the
    session's cluster of that shape (and leaves it running) instead of starting another."""
    import dvml

    shape = (
        len(cluster.specs),
        len({s.host for s in cluster.specs}),
        [len(s.gpus) for s in cluster.specs],
    )

    real = dvml.LocalCluster

    def local_cluster(
        n_workers: int | None = None, gpus: Any = 0, hosts: Any = None, **kw: Any
    ) -> Any:
        if kw or (n_workers, hosts, gpus) != (shape[0], shape[1], shape[2]):
            return real(n_workers=n_workers, gpus=gpus, hosts=hosts, **kw)  # as written
        return SharedCluster(cluster)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dvml, "LocalCluster", local_cluster)
        yield


@contextlib.contextmanager
def cleaned_up(cluster: dvml.LocalCluster) -> Iterator[None]:
    """Drop every dataset and feature cache the page made on the shared cluster."""
    import dvml

    client = cluster.client
    datasets = {d for d in dvml.datasets.list(client=client)["name"]}
    features = {f for f in dvml.features.list(client=client)["name"]}
    try:
        yield
    finally:
        for name in set(dvml.features.list(client=client)["name"]) - features:
            dvml.features.drop(name, client=client)
        for name in set(dvml.datasets.list(client=client)["name"]) - datasets:
            dvml.datasets.drop(name, client=client)


@pytest.mark.cluster
@pytest.mark.tf
@pytest.mark.parametrize("path", runnable_pages(), ids=page_id)
def test_page_runs(
    path: pathlib.Path,
    cluster4: dvml.LocalCluster,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page's python blocks run in order, in one namespace, without an error."""
    import dask
    from distributed import Client

    import dvml

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    settings = {
        "dvml.cluster.state-dir": str(tmp_path / "state"),
        "dvml.registry.url": f"sqlite:///{tmp_path / 'registry.db'}",
    }
    blocks = blocks_to_run()[path]
    ran = []
    with (
        dask.config.set(settings),
        Client(cluster4.scheduler_address, security=cluster4.security, set_as_default=True),
        cleaned_up(cluster4),
        shared_local_cluster(cluster4),
    ):
        ctx = PageContext(cluster4, tmp_path, {"dvml": dvml})
        for step in SETUP.get(page_id(path), []):
            step(ctx)
        for block in blocks:
            block.example.namespace.update(ctx.namespace)
            try:
                block.example.evaluate()
            except Exception as exc:
                raise AssertionError(
                    f"{block.page}:{block.line} failed: {type(exc).__name__}: {exc}"
                ) from exc
            ctx.namespace = dict(block.example.namespace)
            ran.append(block.line)
    import matplotlib.pyplot as plt

    plt.close("all")
    assert ran, f"{page_id(path)}: no block ran"
