"""The one timing engine: a replay of rank programs on a machine (either estimate mode), the
step estimate and the timeline. Reads only the program representation and the machine."""
