"""README's two commands are the contract with newcomers and CI: keep them in sync with .ci/run."""

from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_readme_test_command():
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    start = lines.index("Install and run the tests:")
    command = next(line for line in lines[start:] if line.startswith("pip install"))
    assert "pytest" in command and "torch==2.13.0" in command
    assert "Install and run the tests" in (ROOT / ".ci" / "run").read_text()
