"""What MemoryX runs to train: the optimizers, their settings, defaults and state
(``optimizers``)."""
