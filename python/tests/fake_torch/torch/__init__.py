"""A stand-in for the few torch names shardwise.checkpoint.TorchGroup uses, for python/tests only
(make test installs no PyTorch; test_checkpoint_torch_group.py puts this folder first on sys.path
in its worker processes). Tensors are NumPy arrays; torch.distributed is distributed.py. It keeps
torch's rules that TorchGroup must follow: frombuffer refuses an empty buffer, recv needs a tensor
of the sent dtype and size, a peer is a global rank of the group."""
import numpy as np

from . import distributed  # noqa: F401  (import torch.distributed works as with torch)

uint8, int64 = np.dtype(np.uint8), np.dtype(np.int64)


class Tensor(np.ndarray):
    def numpy(self):
        return self.view(np.ndarray)

    def numel(self):
        return self.size


def tensor(values, dtype):
    return np.array(values, dtype=dtype).view(Tensor)


def empty(n, dtype):
    return np.empty(n, dtype=dtype).view(Tensor)


def frombuffer(buffer, dtype):
    if len(buffer) == 0:
        raise ValueError("both buffer length (0) and count (-1) must not be 0")
    return np.frombuffer(buffer, dtype=dtype).view(Tensor)
