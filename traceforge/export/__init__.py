"""A trace set for other consumers: JSON per rank, GOAL, SimAI, PARAM, and collectives
expanded into point-to-point steps."""
