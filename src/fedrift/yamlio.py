"""YAML read and written by libyaml's C parser and emitter (PyYAML's wheels carry them), with
PyYAML's pure-Python ones where it has none.

Every run reads and writes its resolved config, a compare or tune many times over: the pure-
Python parser and emitter took 40 ms of a 150 ms two-round run (``benchmarks/suite_cpu.py``'s
notes, BENCHMARKS T). The documents are the same either way (checked on every YAML file of the
repository, and in tests/test_config.py); where the C parser refuses a text, the Python one
reads it again, so an error keeps PyYAML's usual message (a text's quotes the offending line).

One refusal is fedrift's own: a key twice in the same mapping (``lr: 0.1`` then ``lr: 0.5``),
which PyYAML reads as the last value and YAML itself forbids, is a :class:`DuplicateKeyError`
naming the file and the line (issue 68, F16). The loaders stay safe ones (``SafeConstructor``:
no ``!!python`` tags).
"""

from __future__ import annotations

from typing import IO, Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_MERGE = "tag:yaml.org,2002:merge"  # ``<<: *base``: its keys may be given again, that is its use
_NO_FILE = ("<unicode string>", "<byte string>", "<file>")  # PyYAML's names for a text, not a file


class DuplicateKeyError(ConstructorError):
    """``FILE line N: key 'lr' appears twice in the same mapping; allowed: each key once``.

    A ``yaml.YAMLError`` (a ``MarkedYAMLError``: ``problem`` and ``problem_mark`` as PyYAML's
    own), so every reader that refuses invalid YAML refuses this too; its text is one line."""

    def __init__(self, key: Any, mark: Any) -> None:
        super().__init__(None, None, f"key {key!r} appears twice in the same mapping; allowed: each key once", mark)

    def __str__(self) -> str:
        mark = self.problem_mark
        name = getattr(mark, "name", None)
        where = "" if mark is None else (f"line {mark.line + 1}" if name in _NO_FILE or not name else f"{name} line {mark.line + 1}")
        return f"{where}: {self.problem}" if where else str(self.problem)


class _UniqueKeys:
    """Refuses a mapping that gives a key twice, checked on the document's nodes before they are
    built (a merge key's ``<<`` mappings are flattened into their parent while building: the keys
    given explicitly may override theirs). Keys are compared as the dict would hold them (``1``
    and ``1.0``, ``lr`` and ``"lr"`` are one key)."""

    def construct_document(self, node: Node) -> Any:
        _check_unique(self, node)
        return super().construct_document(node)  # type: ignore[misc]


def _check_unique(loader: Any, root: Node) -> None:
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:  # an alias: the same node again (or a recursive one)
            continue
        seen_nodes.add(id(node))
        if isinstance(node, MappingNode):
            keys: set[Any] = set()
            for key_node, value_node in node.value:
                stack.append(value_node)
                if key_node.tag == _MERGE or not isinstance(key_node, ScalarNode):
                    stack.append(key_node)
                    continue
                key = loader.construct_object(key_node)
                try:
                    if key in keys:
                        raise DuplicateKeyError(key, key_node.start_mark)
                    keys.add(key)
                except TypeError:  # unhashable: SafeConstructor refuses it itself
                    continue
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)


class _SafeLoader(_UniqueKeys, yaml.SafeLoader):
    pass


_LOADER: type = _SafeLoader
if hasattr(yaml, "CSafeLoader"):
    class _CSafeLoader(_UniqueKeys, yaml.CSafeLoader):  # type: ignore[name-defined, misc]
        pass

    _LOADER = _CSafeLoader

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(source: str | IO[str]) -> Any:
    """``yaml.safe_load``: a text or an open file (whose name then appears in errors); a key given
    twice in one mapping is refused (:class:`DuplicateKeyError`)."""
    try:
        return yaml.load(source, Loader=_LOADER)
    except DuplicateKeyError:
        raise
    except yaml.YAMLError:
        if _LOADER is _SafeLoader:
            raise
        if not isinstance(source, str):
            source.seek(0)
        return yaml.load(source, Loader=_SafeLoader)  # its error names the line and quotes it


def dump(doc: Any) -> str:
    """``yaml.safe_dump(doc, sort_keys=False)``: the keys in their order."""
    return yaml.dump(doc, Dumper=_DUMPER, sort_keys=False)
