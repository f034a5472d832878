"""One module per training method. Each holds the ``[train]`` model for its method, with its defaults.

A field documented here is documented nowhere else: ``autoslm validate`` and the docs read it from
the model.
"""
