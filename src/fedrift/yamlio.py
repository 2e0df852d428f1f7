"""YAML read and written by libyaml's C parser and emitter (PyYAML's wheels carry them), with
PyYAML's pure-Python ones where it has none.

Every run reads and writes its resolved config, a compare or tune many times over: the pure-
Python parser and emitter took 40 ms of a 150 ms two-round run (``benchmarks/suite_cpu.py``'s
notes, BENCHMARKS T). The documents are the same either way (checked on every YAML file of the
repository, and in tests/test_config.py); where the C parser refuses a text, the Python one
reads it again, so an error keeps PyYAML's usual message (a text's quotes the offending line).
"""

from __future__ import annotations

from typing import IO, Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(source: str | IO[str]) -> Any:
    """``yaml.safe_load``: a text or an open file (whose name then appears in errors)."""
    try:
        return yaml.load(source, Loader=_LOADER)
    except yaml.YAMLError:
        if _LOADER is yaml.SafeLoader:
            raise
        if not isinstance(source, str):
            source.seek(0)
        return yaml.load(source, Loader=yaml.SafeLoader)  # its error names the line and quotes it


def dump(doc: Any) -> str:
    """``yaml.safe_dump(doc, sort_keys=False)``: the keys in their order."""
    return yaml.dump(doc, Dumper=_DUMPER, sort_keys=False)
