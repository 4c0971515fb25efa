"""Reward functions for verl's ``reward.custom_reward_function`` mechanism (used by the recipes)."""
