"""README is a newcomer's page: short, its links alive, and the output it shows what a fresh run prints."""

import re
from pathlib import Path

from typer.testing import CliRunner

from servesim.simulator.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_is_a_page_not_a_manual():
    assert len(README.encode()) < 12_000


def test_every_link_in_readme_and_docs_names_a_file_that_exists():
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"


def test_the_tour_shows_what_the_quickstart_prints(tmp_path):
    """Each line of the tour's output block is a line of `servesim simulate scenarios/quickstart.yaml`."""
    block = README.split("servesim simulate scenarios/quickstart.yaml` prints", 1)[1].split("```text\n", 1)[1]
    shown = block.split("```", 1)[0].splitlines()
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["simulate", str(ROOT / "scenarios" / "quickstart.yaml"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    printed = result.stdout.replace(f"{out}/", "runs/quickstart/").splitlines()
    assert len(shown) >= 8 and all(line in printed for line in shown), (shown, printed)
