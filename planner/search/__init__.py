"""Plans for one scenario: the space of layouts, CP-SAT's choice, the independent checker, explanations,
and batches of scenarios."""
