"""Hugging Face Jobs' runtime: ``provider.py`` (``HFJobsProvider``), ``client.py`` (its Jobs API through
huggingface_hub), ``group.py`` (a network group of jobs).

What the vendor is, as data (its ``VENDOR``, options, GPU ids, prices): autoslm/vendors/hfjobs/.
"""
