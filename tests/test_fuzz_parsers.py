"""Fuzzing the readers of untrusted bytes, as part of the suite (issue 17): the ELF, fatbin,
offload-bundle and tar readers, the reference grammar, the index document, the matrix, and
the proxy's route parser.

For each target (``tests/fuzz/targets.py``: it returns, or raises the package's own error,
within an operation budget counted in code):

- every file of its corpus, ``tests/fuzz/corpus/<target>/`` (seeds, and each input a fuzz
  run found: the regression cases), is replayed;
- hypothesis mutates the seeds (bytes overwritten, inserted, cut; sizes set to extremes);
- atheris (libFuzzer, coverage-guided) runs a few thousand inputs from the corpus.

The long runs are ``scripts/fuzz --minutes N`` by hand.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.targets import CORPUS, MAX_LEN, TARGETS

RUNNER = Path(__file__).resolve().parent / "fuzz" / "run.py"
CI_RUNS = 2_000  # per target, coverage-guided: seconds each
EXTREMES = [0, 1, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 63, (1 << 64) - 1]


def _files(target: str) -> list[Path]:
    return sorted((CORPUS / target).iterdir())


@st.composite
def _mutated(draw: st.DrawFn, target: str) -> bytes:
    data = bytearray(draw(st.sampled_from([p.read_bytes() for p in _files(target)])))
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(data)))
        choice = draw(st.integers(0, 4))
        if choice == 0 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif choice == 1:
            data[at:at] = draw(st.binary(max_size=32))
        elif choice == 2:
            del data[at : at + draw(st.integers(1, 512))]
        elif choice == 3:  # a size or offset field set to an extreme
            width = draw(st.sampled_from([2, 4, 8]))
            value = draw(st.sampled_from(EXTREMES)) & ((1 << (8 * width)) - 1)
            data[at : at + width] = value.to_bytes(width, "little")
        else:
            data = data[:at]
    return bytes(data)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_corpus_replays_within_its_budget(target: str) -> None:
    files = _files(target)
    assert any(f.name.startswith("seed-") for f in files)
    for path in files:
        TARGETS[target](path.read_bytes())


@pytest.mark.parametrize("target", sorted(TARGETS))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_seeds_return_or_raise_the_packages_errors(
    target: str, data: st.DataObject
) -> None:
    TARGETS[target](data.draw(_mutated(target) | st.binary(max_size=256)))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_short_coverage_guided_run_finds_nothing(target: str, tmp_path: Path) -> None:
    found = tmp_path / "new"
    found.mkdir()
    done = subprocess.run(
        [sys.executable, str(RUNNER), target, f"-runs={CI_RUNS}", f"-max_len={MAX_LEN}",
         "-timeout=60", "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/",
         str(found), str(CORPUS / target)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-"))]
    assert done.returncode == 0 and not crashes, f"{crashes}: {done.stderr[-4000:]}"
    # libFuzzer checks the run budget between mutation rounds, so it may stop a few past it.
    runs = re.search(r"^Done (\d+) runs", done.stderr, re.MULTILINE)
    assert runs is not None and int(runs.group(1)) >= CI_RUNS, done.stderr[-2000:]
