"""The small configs shipped per domain (propel_core/configs/small/): each one is found by name by
`propel config`, accepted before any model loads, names its domain, and has its row, with the time
it took here, in docs/domains.md."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "propel_core" / "configs" / "small"
DOMAINS = ("arithmetic", "countdown", "math", "azr", "mle", "swe")


def test_one_small_config_per_domain_and_no_other():
    assert sorted(path.stem for path in SMALL.glob("*.yaml")) == sorted(DOMAINS)


@pytest.mark.parametrize("domain", DOMAINS)
def test_propel_config_accepts_the_small_config_by_name(propel_cli, monkeypatch, domain):
    monkeypatch.chdir(ROOT)  # the swe config names its registry from the repository's root, as config paths are read
    shown = propel_cli("config", f"small/{domain}")
    config = yaml.safe_load(shown.stdout)
    assert config["domain"]["name"] == domain and config["run_dir"] == f"runs/small-{domain}"
    assert "what this config spends" in shown.stderr
    header = (SMALL / f"{domain}.yaml").read_text().split("\n\n", 1)[0]
    assert "measured here" in header.lower() and "load average" in header  # the time, beside the load


def test_a_name_that_is_neither_a_file_nor_a_built_in_config_lists_the_built_in_ones(propel_cli):
    refused = propel_cli("config", "small/countdwon", check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "Error: config file small/countdwon does not exist, nor is it a built-in config: demo, "
        + ", ".join(f"small/{domain}" for domain in sorted(DOMAINS))
    ]


def test_the_domains_page_has_a_row_for_each_small_config():
    rows = [line for line in (ROOT / "docs" / "domains.md").read_text().splitlines() if line.startswith("| ")]
    for domain in DOMAINS:
        (row,) = [row for row in rows if f"configs/small/{domain}.yaml" in row]
        assert row.split("|")[1].strip() == domain, row


def test_the_package_ships_the_small_configs():
    """An installed propel (not only a source checkout) finds them: pyproject's package data names them."""
    import tomllib

    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ROOT / "propel_core"
    for path in SMALL.glob("*.yaml"):
        assert any(path.relative_to(package).match(pattern) for pattern in shipped["propel_core"]), path
