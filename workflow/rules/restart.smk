# The restart experiment (study §7.5, Fig. 14): on the kubernetes backend, delete the serving pod,
# re-apply it and record the event timeline. Other backends have no pods to restart.

RESTART_REPS = [f"restart{k}" for k in range(1, 4)]
