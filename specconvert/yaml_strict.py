"""YAML as recipes need it: safe, and strict about keys given twice.

Plain YAML loading keeps the last of two equal keys, so a second ``draft:`` block
silently replaced the first (a real head became a random one). Here that is an error
naming both lines.
"""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKey(ValueError):
    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(f"duplicate key '{key}' at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error.

    Plain YAML loading keeps the last value, so a second ``draft:`` block would silently
    replace the first. Keys brought in by a merge (``<<: *anchor``) may still be
    overridden: that is what merges are for.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise DuplicateKey(key, line, first)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """Safe YAML that refuses duplicate keys (raises :class:`DuplicateKey` or ``yaml.YAMLError``)."""
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
