"""This machine's runtime: ``provider.py`` (``LocalProvider``, the worker as a subprocess).

What the vendor is, as data (its ``VENDOR``, options, GPU ids, prices): autoslm/vendors/local/.
"""
