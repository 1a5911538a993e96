"""Write the error registry's codes (``oci.errcode``) into both OpenAPI documents'
``ErrorBody.code``; tests/test_error_registry.py fails until this is run after a change.

    PYTHONPATH=src python devtools/openapi_codes.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

from docker_variant import openapi

DOCUMENTS = Path(openapi.__file__).parent


def main() -> None:
    for server in get_args(openapi.Server):
        path = DOCUMENTS / f"{server}.json"
        loaded = json.loads(path.read_text())
        openapi.error_code_slot(loaded)["code"] = openapi.error_code_schema(server)
        path.write_text(json.dumps(loaded, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
