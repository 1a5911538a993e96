"""Coverage-guided fuzzing of one target with atheris (libFuzzer):
``python tests/fuzz/run.py TARGET [libFuzzer flags] [CORPUS_DIR ...]``.

The package is instrumented as it is imported, so libFuzzer's mutations follow the branches
they reach. A crash (a stray exception or a budget assertion) ends the run with the input
saved under ``-artifact_prefix`` and a non-zero exit; ``-runs=N`` or ``-max_total_time=S``
end it cleanly (exit 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/

with atheris.instrument_imports(include=["docker_variant", "fuzz"]):
    from fuzz.targets import TARGETS


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: run.py {{{','.join(TARGETS)}}} [libFuzzer flags] [corpus dirs]")
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
