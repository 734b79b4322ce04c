"""The rank-0 trainer that logs through tracklane (for now a simulated verl-style loop; see ``demo``)."""
