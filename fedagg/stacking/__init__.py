"""A stacked sweep: runs that share a model structure train each round together, in one parallel-engine
computation, while each stays an ordinary run (its folder, files, checkpoints, resume).

Each run executes its usual path (`fedagg.run.train`) in a thread of its own; its engine is a
`StackedEngine`, whose `train_round` hands the round's `RoundJob` to the group's `Coordinator` and waits.
Once every run still in the group has handed in its round (or ended), the coordinator trains all of them
with `ParallelEngine.train_rounds` and gives each its `RoundResult`; aggregation, evaluation and files stay
in the run's own thread. A run that ends (completed, diverged, failed, stopped) leaves the group; the others
go on. The Hydra launcher that forms the groups is `hydra_plugins/fedagg_stacked_launcher`.
"""

from fedagg.stacking.group import Coordinator, StackedEngine, engine_for, member

__all__ = ["Coordinator", "StackedEngine", "engine_for", "member"]
