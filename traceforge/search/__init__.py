"""`traceforge plan`'s search: the layouts it considers, the validator and memory filter, lower
bounds and floors, and the candidates replayed in memory and ranked."""
