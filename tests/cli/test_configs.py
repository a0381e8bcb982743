"""configs/: every preset opens with the exact command that runs it, loads, and dry-runs through the CLI on a
checkpoint of its model's published geometry (sparse: real headers, holes for the data); pyproject.toml ships the
folder as the package data fimoe_convert.configs."""

import json
import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from fimoe_convert.checkpoint import VARIANTS
from fimoe_convert.cli import main
from fimoe_convert.errors import UsageError
from fimoe_convert.files.preset import PRESETS_DIR, load_preset
from fimoe_convert.testing import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "configs").glob("*.toml"))
FIXTURE_OF = {"V4-Flash": "v4-flash", "V4-Pro": "v4-pro"}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    made = {}

    def get(model: str) -> Path:
        if model not in made:
            made[model] = make_checkpoint(tmp_path_factory.mktemp(FIXTURE_OF[model]) / "src", FIXTURE_OF[model],
                                          sparse=True)
        return made[model]

    return get


def test_there_are_presets():
    assert len(PRESETS) >= 6
    assert PRESETS_DIR == ROOT / "configs"  # run from the source tree: its own configs/


def test_pyproject_ships_every_package_and_the_presets():
    """The package list is written out (find cannot map configs/ into the package): every folder of the package,
    and configs/ as fimoe_convert.configs with its TOML files."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fimoe_convert").rglob("__init__.py")}
    assert sorted(tool["packages"]) == sorted(folders | {"fimoe_convert.configs"})
    assert tool["package-dir"] == {"fimoe_convert.configs": "configs"}
    assert tool["package-data"] == {"fimoe_convert.configs": ["*.toml"]}


@pytest.mark.slow
@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_opens_with_its_command_and_dry_runs_at_its_geometry(path, published, tmp_path):
    first = path.read_text().splitlines()[0]
    m = re.fullmatch(r"# fimoe-convert (\S+) OUT --config (\S+)", first)
    assert m, first
    preset = load_preset(path)
    assert m.group(2) == path.stem
    assert m.group(1) == VARIANTS[preset["model"]].repo_id
    src = published(preset["model"])
    r = CliRunner().invoke(main, [str(src), str(tmp_path / "out"), "--config", path.stem, "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert (res["target"], res["dry_run"]) == (preset["target"], True)
    assert res["bytes_read"] > 0.9 * VARIANTS[preset["model"]].source_bytes
    ranks = {row["rank"] for row in res["plan"]} - {None}
    assert (
        len(ranks) == (preset.get("ep_size", 1) if preset["target"] != "bf16" else 0) or preset.get("ep_size", 1) == 1
    )


def test_flags_given_override_the_preset(tiny_ckpt, tmp_path):
    """--param and --target given on the command line win over the file's."""
    vllm = "v4_flash_fp8_block_vllm"
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "a"), "--config", str(vllm), "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "a" / "fimoe-manifest.json").read_text())["target"]["parameters"] == {
        "scale_dtype": "f32"
    }
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "b"), "--config", str(vllm), "--param",
                                  "scale_dtype=e8m0", "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "fimoe-manifest.json").read_text())["target"]["parameters"] == {
        "scale_dtype": "e8m0"
    }
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "c"), "--config", str(vllm), "--target", "bf16",
                                  "--dry-run", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["target"] == "bf16", r.output  # the preset's params dropped


@pytest.mark.parametrize("text, match", [
    ('target = "bf16"\ncolour = "red"\n', r"unknown key 'colour'; expected some of model, target"),
    ('model = 4\n', r"model is 4; expected a string"),
    ('[params]\nscale_dtype = 3\n', r"params is \{'scale_dtype': 3\}; expected a table of strings"),
    ('target = \n', r"not valid TOML"),
])
def test_a_bad_preset_names_the_file_and_the_key(tmp_path, text, match):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=rf"--config {re.escape(str(path))}: .*{match}"):
        load_preset(path)


@pytest.mark.parametrize("text, match", [
    ('ep_size = "eight"\n', r"ep_size is 'eight': 'eight' is not a valid integer; correct it in the file "
                            r"\(or give --ep-size"),
    ('device = "tpu"\n', r"device is 'tpu': 'tpu' is not one of 'auto', 'cpu', 'cuda'"),
    ('writers = [2]\n', r"writers is \[2\]: int\(\) argument must be"),
])
def test_a_preset_value_the_flag_refuses_names_the_file_and_the_key(tiny_ckpt, tmp_path, text, match):
    """The preset's values are converted by the flags' own types (click's default_map), exit 2."""
    path = tmp_path / "p.toml"
    path.write_text(text)
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "out"), "--config", str(path),
                                  "--dry-run"])
    assert r.exit_code == 2, r.output
    assert re.search(rf"^error: --config {re.escape(str(path))}: {match}", r.output), r.output
    assert not (tmp_path / "out").exists()


def test_preset_values_become_the_flags_defaults(tiny_ckpt, tmp_path):
    """A preset plans as its flags typed out do; a flag given on the command line wins over the preset's."""
    path = tmp_path / "p.toml"
    path.write_text('target = "fp8_block"\nshard_size = "300KB"\n')

    def plan(*args):
        r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "out"), *args, "--dry-run", "--json"])
        assert r.exit_code == 0, r.output
        res = json.loads(r.output)
        return res["target"], res["plan"]

    assert plan("--config", str(path)) == plan("--target", "fp8_block", "--shard-size", "300KB")
    assert (plan("--config", str(path), "--shard-size", "100KB")
            == plan("--target", "fp8_block", "--shard-size", "100KB"))
    assert plan("--shard-size", "100KB") != plan("--shard-size", "300KB")  # the sizes make different plans
