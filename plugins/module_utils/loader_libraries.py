"""Which shared libraries the dynamic loader finds, from `ldconfig -p`: a name in LD_PRELOAD
without a slash is looked up the same way, and one it cannot find is ignored with a
warning, so a launch asks before it preloads."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def parse(text):
    """``{soname: path}`` of every library in ``ldconfig -p``'s listing (the first entry of
    a name wins, as the loader's search order does)."""
    found = {}
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep and name:
            found.setdefault(name.split(" (", 1)[0], path.strip())
    return found


def answer(names, listing, error=None):
    """``{name: path or None, ..., 'error': error}`` for the asked ``names``."""
    result = {name: listing.get(name) for name in names}
    if error:
        result["error"] = error
    return result
