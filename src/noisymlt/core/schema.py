"""JSON-schema checks whose errors name the offending key (shared by params and method options)."""

from __future__ import annotations

import math
import re

from noisymlt.errors import NoisyMLTError

MAX_DETAIL = 160  # jsonschema quotes the offending value; a whole method block would bury the message


class ParamsError(NoisyMLTError):
    """A bad setting: where it came from (a params file; None when unknown), its dotted key path and what is
    wrong. Layered params (config.check_layered) replace ``where`` with the file that set the key."""

    def __init__(self, where: str | None, key: str, detail: str):
        self.where, self.key, self.detail = where, key, detail
        super().__init__(": ".join(part for part in (where, key, detail) if part))


def _form(schema: dict) -> str:
    """A short name of one accepted form of a value (for a oneOf message)."""
    if "type" in schema and len(schema) == 1:
        return str(schema["type"]).replace("null", "null (nothing)")
    if schema.get("type") == "object" and schema.get("required"):
        return "{" + ", ".join(f"{k}: ..." for k in schema["required"]) + "}"
    if schema.get("type") == "array":
        inner = schema.get("items", {})
        if inner.get("type") == "array" and "enum" in inner.get("items", {}):
            return f"a list of lists of {inner['items']['enum']}"
        return "a list"
    return schema.get("type", "a value")


# YAML 1.1 (PyYAML) reads 1e-3 as a string: its float form needs a dot (1.0e-3)
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def non_finite(obj, path: tuple = ()):
    """The dotted path of the first NaN or infinity in a nested params structure, or None. JSON schema lets them
    through (every comparison with NaN is false), and a NaN lr only shows as a non-finite loss mid-run."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return ".".join(map(str, path))
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = non_finite(v, (*path, k))
        if found is not None:
            return found
    return None


def check_schema(obj: dict, schema: dict, key: str = "", where: str | None = None) -> None:
    """JSON-schema check of ``obj`` (found at dotted path ``key`` of a file ``where``): the first error, as one
    line naming the offending key. NaN and infinities are refused wherever a number is read."""
    import jsonschema

    bad = non_finite(obj)
    if bad is not None:
        raise ParamsError(where, ".".join(p for p in (key, bad) if p), "not a finite number (NaN or infinity)")

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        forms = e.schema.get("oneOf") or e.schema.get("anyOf") if isinstance(e.schema, dict) else None
        if e.context:  # oneOf / anyOf: the error of the form it comes closest to (the deepest) names the key within
            deepest = max(len(c.absolute_path) for c in e.context)
            e = jsonschema.exceptions.best_match([c for c in e.context if len(c.absolute_path) == deepest])
        path = [key] if key else []
        path += [str(p) for p in e.absolute_path]
        detail = e.message
        if forms:
            detail += f" (accepted: {' or '.join(_form(f) for f in forms)})"
        if e.validator == "additionalProperties" and isinstance(e.instance, dict):
            unknown = sorted(set(e.instance) - set(e.schema.get("properties", {})), key=str)
            if len(unknown) == 1:  # name the key itself, as for every other error
                path.append(str(unknown[0]))
                detail = "unknown key"
        if e.validator == "type" and isinstance(e.instance, str) and _EXPONENT.fullmatch(e.instance.strip()):
            detail += (f" (YAML 1.1 reads {e.instance!r} as text: write the number with a dot, "
                       f"e.g. {e.instance.strip().lower().replace('e', '.0e', 1) if '.' not in e.instance else e.instance})")
        if len(detail) > MAX_DETAIL:
            detail = detail[:MAX_DETAIL] + "..."
        raise ParamsError(where, ".".join(path), detail)
