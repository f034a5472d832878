"""What a user sees of a run: the notebook's ``Run`` handle, the run as plain data (``runview``),
``watch``, ``report``, ``push``, the notebook's frames and plots, and the CLI's view commands.

The top layer on the laptop: views call the SDK and read the store; nothing below imports them.
"""
