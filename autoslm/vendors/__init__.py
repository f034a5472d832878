"""What each vendor is, as data: ``vendor.py`` (``Vendor``, ``Capabilities``), ``table.py`` (``VENDORS``,
the vendor table) and one package per vendor (``<vendor>/``: its ``VENDOR``, its options' model).

The foundation reads it (the JobSpec's provider field, the secret names, the catalog's GPU ids), so it
imports nothing but the standard library, pydantic and itself. Each vendor's runtime (its provider, API
client, its pod's own end) is in ``autoslm/providers/<vendor>/``, a floor above, named here by strings
(``Vendor.provider_class``, ``Vendor.self_end``) and imported only when used.
"""
