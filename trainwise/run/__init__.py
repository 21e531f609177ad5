"""How a child runs: the launcher (one Job protocol; backends: the zygote's fork, exec, torchrun ranks, a Ray
cluster), the worker side, the lifeline that kills a child with its parent, faults, and the typed events a
child sends back."""
