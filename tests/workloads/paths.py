"""Where the workload tests find data: the shared traces live next to the repo, not in it."""

from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]
SHARED_TRACES_DIR = REPO_DIR.parent / "shared" / "data" / "traces"
QUICKSTART_TRACE = REPO_DIR / "scenarios" / "traces" / "azure_conv_1h_first2000.csv"
