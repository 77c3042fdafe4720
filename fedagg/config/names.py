"""A method's display name, written once in its YAML (`display_name: FedProx`) and shown by tables, figures and
reports instead of the option's file name.

The name is not a setting of the method: its constructor never sees it. `Named` is the metaclass of the
method base classes (`fedagg.Aggregator`, client objectives), so that `hydra.utils.instantiate(node)` of a
YAML that carries `display_name` still builds a ready object, as it does for every other key; a subclass in
the user's own folder inherits it with no code of its own.
"""

from __future__ import annotations

DISPLAY_NAME = "display_name"


class Named(type):
    """Takes `display_name` out of a constructor call and keeps it on the object (default: the class's own)."""

    def __call__(cls, *args, **kwargs):
        name = kwargs.pop(DISPLAY_NAME, None)
        obj = super().__call__(*args, **kwargs)
        if name is not None:
            obj.display_name = str(name)
        return obj


def takes_display_name(target) -> bool:
    """Whether a config node's target accepts the `display_name` key (a method class)."""
    return isinstance(target, Named)
