"""The simulation path: trace -> simulate -> answer.

`run.py` starts a simulator (ASTRA-sim's analytical backend) on a set's bundle and bounds it;
`astra_log.py` reads its answer from the log; `result.py` is that answer tied to its trace set
(simulation.json, the file `simulate` writes and `report --simulation` reads); `view.py` shows it
per rank class and dimension beside the estimate.
"""
