"""What GRPO generates and how it is scored: multi-turn episodes, rewards, held-out evaluation.
Runs in every training rank."""
