"""The suite never reaches the Hugging Face Hub: a repo id not in the cache fails at once, as offline."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
