"""JSON-schema checks whose errors name the offending key (shared by params and method options)."""

from __future__ import annotations

from noisymlt.errors import NoisyMLTError

MAX_DETAIL = 160  # jsonschema quotes the offending value; a whole method block would bury the message


class ParamsError(NoisyMLTError):
    """A bad setting: where it came from (a params file; None when unknown), its dotted key path and what is
    wrong. Layered params (config.check_layered) replace ``where`` with the file that set the key."""

    def __init__(self, where: str | None, key: str, detail: str):
        self.where, self.key, self.detail = where, key, detail
        super().__init__(": ".join(part for part in (where, key, detail) if part))


def check_schema(obj: dict, schema: dict, key: str = "", where: str | None = None) -> None:
    """JSON-schema check of ``obj`` (found at dotted path ``key`` of a file ``where``): the first error, as one
    line naming the offending key."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = [key] if key else []
        path += [str(p) for p in e.absolute_path]
        detail = e.message
        if e.validator == "additionalProperties" and isinstance(e.instance, dict):
            unknown = sorted(set(e.instance) - set(e.schema.get("properties", {})), key=str)
            if len(unknown) == 1:  # name the key itself, as for every other error
                path.append(str(unknown[0]))
                detail = "unknown key"
        if len(detail) > MAX_DETAIL:
            detail = detail[:MAX_DETAIL] + "..."
        raise ParamsError(where, ".".join(path), detail)
