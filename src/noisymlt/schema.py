"""JSON-schema checks whose errors name the offending key (shared by params and method options)."""

from __future__ import annotations

from noisymlt.errors import NoisyMLTError


def check_schema(obj: dict, schema: dict, where: str) -> None:
    """JSON-schema check whose error names the offending key path under ``where``."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path)
        raise NoisyMLTError(f"{where}{'.' + path if path else ''}: {e.message}")
