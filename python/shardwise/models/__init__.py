"""Built-in architectures written again with shardwise.nn (the way new models are written): their
graphs are the C++ builders' (src/shardwise/models), so their losses are the same bit for bit."""
from .gpt2 import GPT2  # noqa: F401
from .llama import Llama  # noqa: F401
