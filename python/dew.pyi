"""Dew for training scripts: the pool, fast failure and meshes.

    import dew, jax
    pool = dew.prepare_process()
    jax.distributed.initialize(**pool.jax_distributed_kwargs())
"""
from typing import Any, ContextManager, Optional, Sequence, Union

import numpy as np

class PoolError(RuntimeError):
    """A pool call failed; .code is the error's code ("timeout", "unavailable", ...); .late_ranks the
    processes an agreement waited for in vain (empty otherwise)."""
    code: str
    late_ranks: list[int]

class Pool:
    """This process's pool (from prepare_process())."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def local_device_ids(self) -> Optional[list[int]]: ...
    @property
    def coordinator(self) -> str: ...  # the framework's coordinator, host:port
    def agree(self, name: str, patience: Optional[float] = None) -> None: ...
    def all_gather(self, data: bytes) -> list[bytes]: ...
    def stop_requested(self) -> bool:
        """True on every process at the same call once any process got SIGTERM or SIGUSR1 since the first call.

        When True it creates the empty file DEW_STOP_MARK names (if set, and its folder exists here)."""
        ...
    def put(self, key: str, value: bytes) -> None: ...
    def get(self, key: str, timeout: float) -> bytes: ...
    def require_shared_directory(self, path: str) -> None: ...
    def compile_cache_key(self) -> Optional[str]: ...
    def fail(self, message: str, code: int = 1) -> None:
        """code: 1 to 255 except 75 (ValueError otherwise)."""
    def jax_distributed_kwargs(self) -> dict: ...

def prepare_process(multi_host: Optional[bool] = None, patience: Optional[float] = None) -> Pool: ...

class StepWatchdog:
    """Ends the pool when a step overruns its bound: the ranks behind (outside a collective while their peers wait
    in one) end with 124 and are named, not the peers that wait for them."""
    def __init__(self, seconds: Optional[float] = None) -> None: ...
    @property
    def bound(self) -> Optional[float]: ...
    def step(self) -> ContextManager[None]: ...

class MeshSpec:
    def __init__(self, spec: Union[None, str, dict] = None, **sizes: int) -> None: ...
    @property
    def replicas(self) -> int: ...
    @property
    def sizes(self) -> dict[str, int]: ...

def build_mesh(
    spec: Union[MeshSpec, str, dict],
    processes: Optional[int] = None,
    devices_per_process: Optional[int] = None,
    topology: Union[None, str, Sequence[str]] = None,
    devices: Optional[Sequence[int]] = None,
) -> tuple[np.ndarray, tuple[str, ...]]: ...

def choose_exchange(
    heads: int,
    kv_heads: int,
    length: int,
    sequence: int,
    tensor: int = 1,
    mask: str = "causal",
    head_dim: int = 128,
    bytes_per_value: int = 2,
    gather_kernel: str = "dense-bias",
    key_length: Optional[int] = None,
) -> tuple[str, str]: ...

def torch_process_groups(
    ids: np.ndarray,
    names: Sequence[str],
    devices_per_process: int = 1,
    backend: Optional[str] = None,
) -> dict[str, Any]: ...  # {axis: this rank's torch.distributed group, or None}
