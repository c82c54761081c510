"""Access to sglang's process-wide state across releases (imported lazily, from inside patches)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def server_args_resolution_method(server_args_cls: type) -> str:
    """The ``ServerArgs`` method that turns the flags into a resolved configuration: ``resolve_once``
    from sglang 0.5.23 on (where ``__post_init__`` does nothing), ``__post_init__`` before."""
    return "resolve_once" if "resolve_once" in vars(server_args_cls) else "__post_init__"


def after_resolution(check: Callable[[Any], None]) -> Callable[..., Any]:
    """A wrapper (``Saver.wrap``) for the method :func:`server_args_resolution_method` names that runs
    ``check(server_args)`` once the flags are resolved: in the launcher, before any rank exists."""

    def checked(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        check(instance)
        return result

    return checked


def current_server_args() -> Any:
    """This process's ``ServerArgs``: ``runtime_context.get_server_args()`` from sglang 0.5.23 on
    (where ``get_global_server_args()`` raises), ``server_args.get_global_server_args()`` before."""
    try:
        from sglang.srt.runtime_context import get_server_args
    except ImportError:
        from sglang.srt.server_args import get_global_server_args as get_server_args
    return get_server_args()


def server_arg(name: str, default: Any = None, *, server_args: Any = None) -> Any:
    """The value of server argument ``name`` in effect in this process.

    From sglang 0.5.23 the resolved configuration lives in namespace bags (``get_context()``) and can be
    changed there at run time (``get_context().override(source, ...)``) while ``ServerArgs`` keeps the
    operator's raw input; the bag's value wins.  Before, and in a process that has published nothing,
    the attribute of ``server_args`` (default: this process's), ``default`` when it has none."""
    try:
        from sglang.srt.runtime_context import get_context
    except ImportError:
        get_context = None
    if get_context is not None:
        try:
            return _config_leaf(get_context(), name)
        except (AttributeError, KeyError, ValueError, RuntimeError):
            pass
    return getattr(server_args if server_args is not None else current_server_args(), name, default)


def _config_leaf(ctx: Any, name: str) -> Any:
    """``ctx.config_leaf(name)`` (sglang 0.5.18 on); on 0.5.17, which has ``override`` but not its read side,
    the same walk 0.5.18's ``config_leaf`` makes: the field's ``NS`` path through the published bags."""
    if hasattr(ctx, "config_leaf"):
        return ctx.config_leaf(name)
    bags = ctx._config_bags
    if bags is None:
        raise ValueError("config not published")
    from sglang.srt.arg_groups.arg_utils import namespace_of

    path = namespace_of(type(ctx.server_args)).get(name)
    if path is None:
        raise KeyError(name)
    parts = path.split(".")
    bag = bags[parts[0]]
    for seg in parts[1:]:
        bag = object.__getattribute__(bag, "_subs")[seg]
    return getattr(bag, name)


def linear_widths(layer: Any) -> tuple[int | None, int | None]:
    """(input, output) width of a linear layer: torch's ``Linear`` (``in_features`` / ``out_features``, the Llama
    draft's ``fc``) or sglang's parallel linear layers (``input_size`` / ``output_size``, the MLA draft's ``fc``)."""
    if layer is None:
        return None, None
    return (
        getattr(layer, "in_features", None) or getattr(layer, "input_size", None),
        getattr(layer, "out_features", None) or getattr(layer, "output_size", None),
    )
