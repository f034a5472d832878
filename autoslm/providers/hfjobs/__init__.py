"""Hugging Face Jobs: ``data`` (what the vendor is, plain data), ``client`` (its Jobs API through
huggingface_hub), ``provider`` (``HFJobsProvider``, the Provider contract). Imported lazily: the
control plane's start does not pay for huggingface_hub."""
