"""Memoisation keyed on the identity of large immutable inputs (ModelGraph, Cluster).

Their dataclass hash walks every layer on each call; the serving search evaluates thousands of
deployments of one model, so the cost terms key their caches on ``Ident(model)`` instead (the
cache holds the object, so its id is never reused while cached).
"""
from __future__ import annotations


class Ident:
    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other) -> bool:
        return isinstance(other, Ident) and other.obj is self.obj
