"""The README as a user meets it: its first screen holds the install, run and test commands, which are
CI's own and run as written; its CPU example runs in seconds and matches torch; and every relative
link in the prose (README, BENCHMARKS, docs/) points at a file that exists."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_SCREEN = 40  # lines: the "first screen"

# The commands a user copies from the README's first screen, each the line CI runs (.ci/run),
# less the options that only quiet CI's log.
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -r requirements-cpu.txt -e ."
DEMO = ".venv/bin/tritongemm demo"
CI_ONLY_OPTIONS = {"--quiet", "--disable-pip-version-check"}
CLONE = re.compile(r"git clone \S+ (?P<dir>\S+) && cd (?P=dir)")

# The pages whose relative links must resolve, and the pages the README must link.
PROSE = [README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LINKS = ["BENCHMARKS.md", "docs/README.md"]


def _first_screen() -> list[str]:
    return README.read_text().splitlines()[:FIRST_SCREEN]


def _ci_lines() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _ci_test_command() -> str:
    """The README's test command as .ci/run runs it: the one pytest call over the whole suite (the
    Gluon compile runs name their file and set PYTHONPATH first)."""
    found = [line for line in _ci_lines() if re.match(r"\.venv/bin/python -m pytest\b", line)]
    assert len(found) == 1, f".ci/run should run the whole suite once, found {found}"
    return found[0]


def _without_ci_options(command: str) -> list[str]:
    return [word for word in shlex.split(command) if word not in CI_ONLY_OPTIONS]


def test_the_first_screen_holds_clone_install_run_and_test():
    screen = _first_screen()
    clones = [line for line in screen if CLONE.fullmatch(line.strip())]
    assert clones, f"no `git clone URL DIR && cd DIR` line in the README's first {FIRST_SCREEN} lines"
    for command in (INSTALL, DEMO, _ci_test_command()):
        assert command in (line.strip() for line in screen), f"{command!r} is not a line of the first screen"
    assert screen.index(clones[0]) < screen.index(INSTALL), "the clone step comes before the install"


@pytest.mark.parametrize(
    "readme, ci",
    [
        pytest.param(INSTALL, ["python3 -m venv .venv", ".venv/bin/pip install"], id="install"),
        pytest.param(DEMO, [DEMO], id="demo"),
    ],
)
def test_the_readme_commands_are_the_ones_ci_runs(readme, ci):
    """CI runs the README's set-up and demo: each `&&` step of the README's line is a line of .ci/run."""
    ci_lines = _ci_lines()
    steps = [step.strip() for step in readme.split("&&")]
    assert len(steps) == len(ci)
    for step, start in zip(steps, ci):
        ran = [line for line in ci_lines if line.startswith(start)]
        assert ran, f".ci/run has no line starting {start!r}"
        assert _without_ci_options(ran[0]) == _without_ci_options(step), (step, ran[0])


def test_the_install_line_parses():
    """The pip line names files of this checkout (run from inside the clone) and pins that install;
    the versions the README quotes for it are the pins."""
    venv, pip = (shlex.split(step) for step in INSTALL.split("&&"))
    assert venv[:3] == ["python3", "-m", "venv"]
    assert pip[0] == f"{venv[3]}/bin/pip" and pip[1] == "install"
    options = dict(zip(pip[2::2], pip[3::2]))
    assert set(options) == {"-r", "-e"}, pip
    assert (ROOT / options["-e"] / "pyproject.toml").is_file()
    requirements = [
        Requirement(line.split("#")[0].strip())
        for line in (ROOT / options["-r"]).read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    pins = {r.name: str(r.specifier)[2:] for r in requirements if str(r.specifier).startswith("==")}
    screen = "\n".join(_first_screen())
    for name in ("torch", "triton"):
        assert f"{name} {pins[name]}" in screen, f"the first screen should say {name} {pins[name]}, the pin"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU demo; on a GPU the demo runs real sizes (gpu-check.sh)")
def test_the_demo_command_runs():
    """`tritongemm demo` as installed: pyproject's console script, with the README's arguments."""
    script = re.search(r'^tritongemm\s*=\s*"([\w.]+):(\w+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert script, "pyproject.toml has no tritongemm console script"
    module, function = script.groups()
    argv = ["tritongemm", *shlex.split(DEMO)[1:]]
    code = f"import sys; from {module} import {function}; sys.argv = {argv!r}; sys.exit({function}())"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(\d+) of \1 runs matched the fp64 reference\.", last), last


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU example; the GPU runs the GPU tests")
def test_readme_cpu_example():
    text = README.read_text()
    example = re.search(r"```python\n(import os, time\n.*?)```", text, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", example], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"matches torch: True, \d+\.\d s\n", done.stdout), done.stdout


def _links(page: Path) -> list[str]:
    """The targets of the page's Markdown links and images, outside code."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)\)", text)


def _external(target: str) -> bool:
    return bool(re.match(r"[a-z][a-z0-9+.-]*:", target))  # https:, mailto:


@pytest.mark.parametrize("page", PROSE, ids=[str(p.relative_to(ROOT)) for p in PROSE])
def test_relative_links_point_at_files(page):
    files = [t.split("#")[0] for t in _links(page) if not _external(t) and not t.startswith("#")]
    missing = [t for t in files if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that don't exist: {missing}"


def _anchors(page: Path) -> set[str]:
    """The page's heading anchors, as GitHub makes them: the heading's text, lowercased, without
    punctuation but hyphens and underscores, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.replace("`", "").strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PROSE, ids=[str(p.relative_to(ROOT)) for p in PROSE])
def test_anchors_point_at_headings(page):
    wrong = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        linked = page.parent / path if path else page
        if anchor and not _external(target) and linked.suffix == ".md" and linked.is_file():
            if anchor not in _anchors(linked):
                wrong.append(target)
    assert not wrong, f"{page.relative_to(ROOT)} links to headings that don't exist: {wrong}"


def test_the_readme_links_benchmarks_and_the_docs_index():
    assert set(README_LINKS) <= set(_links(README))


def test_the_docs_index_lists_every_page():
    index = ROOT / "docs" / "README.md"
    listed = {Path(t.split("#")[0]).name for t in _links(index) if not _external(t)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= listed, f"docs/README.md does not list {sorted(pages - listed)}"
