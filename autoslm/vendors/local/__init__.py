"""This machine as a provider: the worker runs as a subprocess. No account, no key, no GPU needed.

Its runtime, ``LocalProvider``, is autoslm/providers/local/provider.py, imported only when one is built.
"""

from __future__ import annotations

from autoslm.vendors.vendor import Capabilities, Vendor

VENDOR = Vendor(
    name="local",
    title="this machine",
    provider_class="autoslm.providers.local.provider:LocalProvider",
    capabilities=Capabilities(
        market="none",
        interruptible=False,
        not_interruptible="this machine is not rented: nothing can take it away",
        batch_status=False,
        create_window=False,  # a process starts or fails in the call: no answer can be lost
        ends_itself=False,  # the process is the pod: it ends when the worker exits
        keyless="none",
        joins_pods=True,  # processes of this machine over 127.0.0.1, each in its own working directory
        joined_by="processes of this machine",
        not_applicable={
            "compute.max_price_per_hour": "this machine costs nothing per hour",
        },
    ),
)
