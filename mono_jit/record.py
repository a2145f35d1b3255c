"""Record: an immutable tuple with named fields, for the records a cache hit defines.

It behaves as a ``typing.NamedTuple`` does where the project uses one (fields by name and by
position, defaults, ordering, hashing and equality as a tuple, ``_fields``, ``_asdict``,
``_replace``, pickling) but costs far less to define: NamedTuple compiles a ``__new__`` from
source for every class (70-180 us each, measured here), while a Record subclass only sets one
property per field (about 10 us). About twenty of them are defined by the first cache hit of
every serving process, so that difference was an eighth of its time.

    class Point(Record):
        x: int
        y: int = 0
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, ClassVar, TypeVar, dataclass_transform

R = TypeVar("R", bound="Record")


class _RecordType(type):
    """Makes each Record subclass: its fields from its annotations (after its parent's), each a
    read-only property over the tuple, and no instance dict (``__slots__ = ()``)."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> _RecordType:
        namespace.setdefault("__slots__", ())
        parent = next((b for b in bases if isinstance(b, _RecordType)), None)
        fields: tuple[str, ...] = parent._fields if parent is not None else ()  # type: ignore[attr-defined]
        defaults: dict[str, Any] = dict(parent._field_defaults) if parent is not None else {}  # type: ignore[attr-defined]
        annotations = namespace.get("__annotations__", {})
        own = tuple(n for n, kind in annotations.items() if not str(kind).startswith(("ClassVar", "typing.ClassVar")))
        for field in own:
            if field in namespace:
                defaults[field] = namespace.pop(field)
            elif defaults:
                raise TypeError(f"{name}.{field}: a field without a default follows one with a default")
        fields += own
        for index, field in enumerate(fields[len(fields) - len(own):], len(fields) - len(own)):
            namespace[field] = property(itemgetter(index), doc=f"field {index}")
        namespace["_fields"], namespace["_field_defaults"] = fields, defaults
        return super().__new__(mcs, name, bases, namespace, **kwargs)


@dataclass_transform(frozen_default=True)
class Record(tuple, metaclass=_RecordType):
    """Subclasses declare fields as annotations, in order, a default by assignment; a subclass
    without annotations keeps its parent's fields (to add methods or validation)."""

    _fields: ClassVar[tuple[str, ...]]
    _field_defaults: ClassVar[dict[str, Any]]

    def __new__(cls: type[R], *args: Any, **kwargs: Any) -> R:
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__} takes {len(fields)} fields ({', '.join(fields)}), got {len(args)}")
        if kwargs or len(args) < len(fields):
            values = list(args)
            for name in fields[len(args):]:
                if name in kwargs:
                    values.append(kwargs.pop(name))
                elif name in cls._field_defaults:
                    values.append(cls._field_defaults[name])
                else:
                    raise TypeError(f"{cls.__name__}: missing field {name!r}")
            if kwargs:
                raise TypeError(f"{cls.__name__}: unknown or repeated fields {sorted(kwargs)}")
            args = tuple(values)
        return tuple.__new__(cls, args)

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self))})"

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self))

    def _replace(self: R, **changes: Any) -> R:
        return type(self)(**{**self._asdict(), **changes})
