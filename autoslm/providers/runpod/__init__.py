"""RunPod's runtime: ``provider.py`` (``RunPodProvider``), ``client.py`` (its REST v2 API), ``clusters.py``
(Instant Clusters), ``selfterm.py`` (a pod's own end).

What the vendor is, as data (its ``VENDOR``, options, GPU ids, prices): autoslm/vendors/runpod/.
"""
