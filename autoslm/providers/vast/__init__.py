"""Vast's runtime: ``provider.py`` (``VastProvider``), ``client.py`` (its REST API), ``selfterm.py`` (an
instance's own end).

What the vendor is, as data (its ``VENDOR``, options, GPU ids, prices): autoslm/vendors/vast/.
"""
