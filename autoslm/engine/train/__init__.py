"""Building and running a trainer: the GPU recipe, model loading, SFT and GRPO trainers, training
arguments, ``--print-config``, adapter merging and the built-in tiny model. Runs in every training rank."""
