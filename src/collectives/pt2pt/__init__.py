"""Point-to-point messages between two ranks: ``send``, ``recv``, ``sendrecv``, the
non-blocking ``isend`` and ``irecv``, the persistent ``send_init`` and ``recv_init``
(:mod:`.messages`: how a message's dtype and count are checked, and what a failure does).

The public names are re-exported by :mod:`collectives`; docs/pt2pt.md is the guide.
"""
