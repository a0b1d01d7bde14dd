"""Tensor parallelism inside one pod: rank 0's handle on the worker ranks (`tensor_parallel`), the
worker rank process (`rank_worker`), the typed messages between them (`messages`) and the all-reduce
(`collective`). May import `worker` and `heap`."""
