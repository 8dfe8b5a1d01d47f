"""The process mesh (:mod:`.mesh`): a communicator cut into an n-D grid with named axes, whose
axis communicators every layer above takes as its ``comm=``.

The public name ``Mesh`` is re-exported by :mod:`collectives`; docs/pt2pt.md is the guide.
"""
