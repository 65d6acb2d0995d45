"""A real install: the distribution's name and metadata, the wheel's contents, shipped data found through the
installed package (never a checkout's paths), a cheap `import tunekit` with a lazy `tunekit.ops`, and the version
written once. .ci/run installs the wheel in a fresh environment and smoke-runs the commands from there."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import cli

import tunekit
from tunekit.core.errors import TunekitError
from tunekit.store.shipped_data import (
    default_table_files,
    recorded_table_path,
    resolve_table,
    shipped_dir,
    shipped_table_files,
    table_name,
)

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; tunekit itself runs on 3.10
ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False)


def test_distribution_name_and_single_version():
    project = pyproject()["project"]
    assert project["name"] == tunekit.DISTRIBUTION == "tunekit-triton"
    assert "version" not in project and project["dynamic"] == ["version"]
    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tunekit.__version__"}
    assert importlib.metadata.version(tunekit.DISTRIBUTION) == tunekit.__version__


def test_version_ranges_exclude_what_is_known_to_break():
    deps = {d.split(">")[0].split("<")[0].split("=")[0]: d for d in pyproject()["project"]["dependencies"]}
    assert deps["triton"] == "triton>=3.6,<4"  # what CI tests (3.6.0); other 3.x: runtime/version_policy.py
    assert deps["torch"] == "torch>=2.8"  # the first torch built against Triton 3.4
    assert "<2.4" in deps["numpy"]  # numpy 2.4 breaks Triton's interpreter
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert pins["torch"] == "2.13.0"  # the CPU wheel CI installs: the range must admit it


def test_install_hints_name_the_distribution():
    from tunekit.evaluation import plot
    from tunekit.tuning import samplers

    for module in (plot, samplers):
        text = Path(module.__file__).read_text()
        assert "pip install 'tunekit[" not in text and "pip install 'tunekit-triton[" in text


def test_py_typed_ships():
    assert importlib.resources.files("tunekit").joinpath("py.typed").is_file()


def test_shipped_data_is_found_through_the_installed_package():
    assert shipped_dir() == Path(str(importlib.resources.files("tunekit.shipped")))
    tables = shipped_table_files()
    assert {table_name(p) for p in tables} >= {"h200-sm90-132sm/gemm", "h200-sm90-132sm/layernorm"}
    assert resolve_table("h200-sm90-132sm/gemm") == shipped_dir() / "timings" / "h200-sm90-132sm" / "gemm.json.gz"
    assert resolve_table(str(tables[0])) == tables[0]
    with pytest.raises(TunekitError, match=r"neither\. Shipped: \[.*'h200-sm90-132sm/gemm'"):
        resolve_table("nope/gemm")


def test_record_writes_to_the_cache_directory_and_efficiency_reads_it(isolated_cache):
    path = recorded_table_path("h200-sm90-132sm", "gemm")
    assert path == isolated_cache / "timings" / "h200-sm90-132sm" / "gemm.json.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert default_table_files() == [*shipped_table_files(), path]


def test_explain_takes_a_shipped_table_by_name():
    result = cli(
        "explain", "-k", "gemm", "-s", "4097x4096x4096", "--dtype", "bfloat16", "--table", "h200-sm90-132sm/gemm"
    )
    assert result.exit_code == 0, result.output
    assert "132" in result.output  # the H200's SMs, modelled on this CPU machine
    result = cli("explain", "-k", "gemm", "-s", "4097x4096x4096")
    # one short line naming a shipped table to model instead (it once listed them all, 343 characters)
    (line,) = result.output.splitlines()
    assert result.exit_code == 1 and "--table " in line and len(line) <= 120
    suggested = line.rsplit("--table ", 1)[1].strip()
    assert cli("explain", "-k", "gemm", "-s", "4097x4096x4096", "--table", suggested).exit_code == 0


def test_import_is_cheap_and_ops_load_on_first_use():
    done = python(
        "import sys, tunekit\n"
        "heavy = sorted(m for m in ('torch', 'triton', 'optuna', 'numpy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert callable(tunekit.ops.layer_norm) and callable(tunekit.record_problems)\n"
        "assert tunekit.nn.LayerNorm and callable(tunekit.patch) and callable(tunekit.unpatch)\n"
        "names = list(sys.modules)\n"
        "assert names.index('tunekit.core.backend') < names.index('triton'), 'triton before the backend choice'\n"
        "try:\n"
        "    tunekit.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["tunekit.core.device", "tunekit.tuning.verify", "tunekit.cli", "triton"])
def test_the_backend_is_chosen_before_triton_is_imported(module):
    """Triton reads TRITON_INTERPRET when it is imported: after `import tunekit`, whatever imports triton first
    (a tunekit module that imports it at its top, or the user's own `import triton`), the backend runs first."""
    done = python(
        f"import os, sys, tunekit, {module}\n"
        "names = list(sys.modules)\n"
        "if 'triton' in names:\n"
        "    assert names.index('tunekit.core.backend') < names.index('triton'), names\n"
        "    assert os.environ.get('TRITON_INTERPRET') == '1'  # no GPU here: the interpreter was chosen\n"
    )
    assert done.returncode == 0, done.stderr


def test_the_wheel_holds_the_package_and_its_data(tmp_path):
    # Built from a copy of the sources: an in-tree build reuses build/lib, where modules deleted since linger.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "tunekit", "kernels", "search_spaces", "cache"):
        path = ROOT / item
        (shutil.copytree(path, src / item, ignore=ignore) if path.is_dir() else shutil.copy2(path, src / item))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("tunekit_triton-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"tunekit_triton-{tunekit.__version__}.dist-info/METADATA").decode()
        entry_points = z.read(f"tunekit_triton-{tunekit.__version__}.dist-info/entry_points.txt").decode()
    assert {
        "tunekit/py.typed",
        "tunekit/__main__.py",
        "tunekit/search_spaces/gemm/gemm.py",
        "tunekit/kernels/norms/layernorm.py",
    } <= names
    installed_as = {"tunekit": "tunekit", "kernels": "tunekit/kernels", "search_spaces": "tunekit/search_spaces"}
    for top, prefix in installed_as.items():  # every (sub)package ships, with every module of it
        for init in (ROOT / top).rglob("__init__.py"):
            for module in init.parent.glob("*.py"):
                assert prefix + "/" + str(module.relative_to(ROOT / top)) in names, module
    assert "tunekit/shipped/timings/h200-sm90-132sm/gemm.json.gz" in names
    assert any(n.startswith("tunekit/shipped/") and n.endswith(".json") for n in names)
    for pack in (ROOT / "cache" / "packs").glob("*.json"):  # every model pack installs with the package
        assert f"tunekit/shipped/packs/{pack.name}" in names, pack.name
    assert {n.split("/")[0] for n in names} == {"tunekit", f"tunekit_triton-{tunekit.__version__}.dist-info"}
    assert "Name: tunekit-triton" in metadata and re.search(r"Requires-Dist: triton(<4,>=3.6|>=3.6,<4)", metadata)
    assert "tunekit = tunekit.cli:main" in entry_points
