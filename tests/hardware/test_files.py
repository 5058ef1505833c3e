"""Input files are read with a safe, bounded YAML loader: keys given twice or not text, deep nesting and alias bombs
are one-line errors; merge keys still work."""

import pytest

from servesim.hardware.errors import SpecError
from servesim.hardware.files import read_text, read_yaml


def test_a_merge_key_brings_keys_the_mapping_may_override(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("base: &b {max_model_len: 4096, max_num_seqs: 4}\nengine: {<<: *b, max_num_seqs: 8}\n")
    assert read_yaml(path)["engine"] == {"max_model_len": 4096, "max_num_seqs": 8}


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "engine:\n  max_num_seqs: 4\n  max_num_seqs: 8\n",
            "line 3, column 3: key 'max_num_seqs' is given twice",
        ),
        ("? [a, b]\n: 1\n", "line 1, column 3: key a list is not text"),
        ("engine:\n  1: 4\n", "line 2, column 3: key 1 is not text"),
        ("on: 4\n", "line 1, column 1: key True is not text"),
        ("a: &x [1, *x]\n", "line 1, column 4: an alias refers to a node that contains it"),
        (
            "[" * 10_000 + "]" * 10_000,
            "line 1, column 65: nested deeper than 64 levels",
        ),  # not a RecursionError
        ("a: &a 1\nb: [" + ", ".join(["*a"] * 201) + "]\n", "more than 200 aliases"),
        (
            "!!python/object/apply:os.system ['true']\n",
            "could not determine a constructor",
        ),  # never evaluated
    ],
)
def test_what_is_not_plain_data_is_one_line_with_its_place(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="not valid YAML: ") as err:
        read_yaml(path)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    """Nine levels of nine aliases: 81 aliases in a few lines, 9**9 values once expanded."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError, match=r"line 7, column \d+: expands to more than 1,000,000 values"):
        read_yaml(path)


def test_a_path_with_a_nul_character_is_one_line_not_a_value_error(tmp_path):
    """Found by the fuzzer: open() raises ValueError (not OSError) for a NUL in a GPU file's path."""
    with pytest.raises(SpecError, match="a GPU file path cannot hold a NUL character"):
        read_text(tmp_path / "gpus\x00.yaml", "GPU file")
