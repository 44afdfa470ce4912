"""Find the WSGI application named by MODULE:APP.

The spec forms are those a Gunicorn user writes:
  package.module             -> attribute `application`, then `app`
  package.module:name        -> that attribute (dotted paths allowed)
  package.module:factory()   -> call it; literal arguments only: f('x', debug=True)

`parse_spec` only decides; `load` imports. Every failure is an `AppLoadError`
whose message names the problem and what to do about it. Exceptions raised by
the application's own code while importing are kept as `__cause__` so the
caller can log their traceback.
"""

import ast
import importlib
import sys

__all__ = ["AppLoadError", "AppSpec", "parse_spec", "load"]


class AppLoadError(Exception):
    """The application could not be loaded; the message says what to do."""


class AppSpec:
    def __init__(self, module: str, attribute: str | None, args=(), kwargs=None,
                 is_call: bool = False):
        self.module = module
        self.attribute = attribute
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.is_call = is_call

    def __repr__(self):
        return f"AppSpec({self.module!r}, {self.attribute!r}, call={self.is_call})"


def parse_spec(spec: str) -> AppSpec:
    if not spec or not spec.strip():
        raise AppLoadError("no application given: name it as MODULE:APP, e.g. "
                           "`forkserve myproject.wsgi:application`")
    module, _, target = spec.strip().partition(":")
    if module.endswith(".py") or not module or not all(
            part.isidentifier() for part in module.split(".")):
        raise AppLoadError(f"{spec!r} is not MODULE:APP: {module!r} is not a module name "
                           "(use dots, not slashes or a .py suffix: `pkg.app:app`)")
    if not target:
        return AppSpec(module, None)
    try:
        expression = ast.parse(target, mode="eval").body
    except SyntaxError:
        raise AppLoadError(f"{spec!r}: {target!r} is neither an attribute name nor a call "
                           "like create_app()") from None
    if isinstance(expression, ast.Call):
        name = _dotted(expression.func)
        try:
            args = [ast.literal_eval(arg) for arg in expression.args]
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in expression.keywords}
        except ValueError:
            raise AppLoadError(f"{spec!r}: the factory's arguments must be literals "
                               "(strings, numbers, lists, dicts, True/False/None)") from None
        if name is None or None in kwargs:
            raise AppLoadError(f"{spec!r}: write the factory call as name(args), e.g. create_app()")
        return AppSpec(module, name, args, kwargs, is_call=True)
    name = _dotted(expression)
    if name is None:
        raise AppLoadError(f"{spec!r}: {target!r} is neither an attribute name nor a call "
                           "like create_app()")
    return AppSpec(module, name)


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def load(spec: str):
    """Import the application and return the WSGI callable."""
    parsed = parse_spec(spec)
    module = _import(parsed.module, spec)
    if parsed.attribute is None:
        for name in ("application", "app"):
            if callable(getattr(module, name, None)):
                parsed.attribute = name
                break
        else:
            raise AppLoadError(f"module {parsed.module!r} has no `application` or `app`; "
                               f"name the app: `{parsed.module}:NAME`")
    target = module
    for part in parsed.attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            candidates = sorted(name for name, value in vars(module).items()
                                if callable(value) and not name.startswith("_")
                                and not isinstance(value, type(sys)))
            hint = f" Callables it has: {', '.join(candidates[:8])}." if candidates else ""
            raise AppLoadError(f"module {parsed.module!r} has no attribute "
                               f"{parsed.attribute!r}.{hint}") from None
    if parsed.is_call:
        if not callable(target):
            raise AppLoadError(f"{spec!r}: {parsed.attribute!r} is not callable, so it "
                               "cannot be a factory; drop the parentheses")
        try:
            target = target(*parsed.args, **parsed.kwargs)
        except Exception as exc:
            raise AppLoadError(f"the factory {parsed.module}:{parsed.attribute}() raised "
                               f"{type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise AppLoadError(f"{spec!r} is a {type(target).__name__}, not a WSGI application "
                           "(a callable taking environ and start_response)")
    return target


def _import(module_name: str, spec: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise AppLoadError(
                f"cannot import {module_name!r}: no module named {missing!r}. Run forkserve "
                "from the directory that contains it, or pass --chdir DIR") from None
        raise AppLoadError(f"importing {module_name!r} failed: it imports {missing!r}, which "
                           "is not installed; install it in this environment") from exc
    except SyntaxError as exc:
        raise AppLoadError(f"{module_name!r} has a syntax error: {exc.filename}, line "
                           f"{exc.lineno}: {exc.msg}") from exc
    except SystemExit as exc:
        raise AppLoadError(f"importing {module_name!r} called exit({exc.code!r})") from exc
    except Exception as exc:
        raise AppLoadError(f"the application raised while loading: {type(exc).__name__}: "
                           f"{exc}") from exc
