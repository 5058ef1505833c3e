"""Input files are read with the safe YAML loader: a key given twice is an error, merge keys still work."""

import pytest

from hardware.errors import SpecError
from hardware.files import read_yaml


def test_a_merge_key_brings_keys_the_mapping_may_override(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("base: &b {max_model_len: 4096, max_num_seqs: 4}\nengine: {<<: *b, max_num_seqs: 8}\n")
    assert read_yaml(path)["engine"] == {"max_model_len": 4096, "max_num_seqs": 8}


@pytest.mark.parametrize("text,expected", [
    ("engine:\n  max_num_seqs: 4\n  max_num_seqs: 8\n", "line 3, column 3: key 'max_num_seqs' is given twice"),
    ("? [a, b]\n: 1\n", "line 1, column 3: found unhashable key"),
    ("!!python/object/apply:os.system ['true']\n", "could not determine a constructor"),  # never evaluated
])
def test_what_is_not_plain_data_is_one_line_with_its_place(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="not valid YAML: ") as err:
        read_yaml(path)
    assert expected in str(err.value) and "\n" not in str(err.value)
