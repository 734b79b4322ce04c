"""The rank-0 RL trainer that logs through tracklane: GRPO/PPO on a built-in addition task (see ``main``)."""
