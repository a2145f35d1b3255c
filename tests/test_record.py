"""Record (mono_jit/record.py) behaves as typing.NamedTuple does for every operation the project
uses: the NamedTuple of the same shape is the oracle here."""

import copy
import pickle
from typing import NamedTuple

import pytest

from mono_jit.record import Record


class Point(Record):
    x: int
    y: int
    label: str = "p"
    tags: tuple = ()


class OraclePoint(NamedTuple):
    x: int
    y: int
    label: str = "p"
    tags: tuple = ()


class Validated(Point):
    """A subclass that validates in __new__ (as Spec does) and keeps its parent's fields."""

    def __new__(cls, x: int, y: int, label: str = "p", tags: tuple = ()) -> "Validated":
        if x < 0:
            raise ValueError(f"x={x}: expected >= 0")
        return super().__new__(cls, x, y, label, tags)


CALLS = [((1, 2), {}), ((1,), {"y": 2}), ((), {"x": 1, "y": 2, "tags": (3,)}), ((1, 2, "q"), {}), ((1, 2, "q", (4,)), {})]


@pytest.mark.parametrize("args,kwargs", CALLS)
def test_a_record_holds_what_the_namedtuple_holds(args, kwargs):
    record, oracle = Point(*args, **kwargs), OraclePoint(*args, **kwargs)
    assert tuple(record) == tuple(oracle) and record == oracle and hash(record) == hash(oracle)
    assert [getattr(record, f) for f in Point._fields] == [getattr(oracle, f) for f in OraclePoint._fields]
    assert record._asdict() == oracle._asdict()
    assert record._replace(y=9, label="r") == oracle._replace(y=9, label="r")
    assert repr(record) == repr(oracle).replace("OraclePoint", "Point")
    assert Point._fields == OraclePoint._fields and Point._field_defaults == OraclePoint._field_defaults


@pytest.mark.parametrize("args,kwargs", [((), {}), ((1, 2, "q", (), 5), {}), ((1,), {"x": 2, "y": 3}),
                                         ((1, 2), {"z": 3})])
def test_a_bad_call_raises_typeerror_as_the_namedtuple_does(args, kwargs):
    with pytest.raises(TypeError):
        OraclePoint(*args, **kwargs)
    with pytest.raises(TypeError, match="Point"):
        Point(*args, **kwargs)


def test_a_record_is_immutable_and_has_no_instance_dict():
    point = Point(1, 2)
    with pytest.raises(AttributeError):
        point.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        point.other = 3  # type: ignore[attr-defined]
    assert not hasattr(point, "__dict__")


def test_records_order_unpack_pickle_and_copy_as_tuples():
    points = [Validated(3, 1), Validated(1, 5), Validated(1, 2)]
    assert sorted(points) == [Validated(1, 2), Validated(1, 5), Validated(3, 1)]
    x, y, label, tags = points[0]
    assert (x, y, label, tags) == (3, 1, "p", ())
    for point in points:
        assert pickle.loads(pickle.dumps(point)) == point and type(pickle.loads(pickle.dumps(point))) is Validated
        assert copy.deepcopy(point) == point


def test_a_subclass_keeps_its_parents_fields_and_validates_in_new_and_in_replace():
    assert Validated._fields == Point._fields
    with pytest.raises(ValueError, match="x=-1"):
        Validated(-1, 0)
    with pytest.raises(ValueError, match="x=-2"):
        Validated(1, 0)._replace(x=-2)


def test_a_field_without_a_default_after_one_with_a_default_is_refused():
    with pytest.raises(TypeError, match="without a default"):
        class Bad(Record):
            a: int = 0
            b: int
