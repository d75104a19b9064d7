"""How the weights move: the optimizers by parameter role (optimizers.py) and the learning rate
as a function of the step (schedule.py)."""
