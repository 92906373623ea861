#!/usr/bin/env python3
"""Token files as other tools write them, for tests/data/test_token_files_golden.cc.

Writes into tests/golden/tokens/ (run from the repository root; numpy only):
  nanogpt.bin    nanoGPT's prepare.py format: the tokens as headerless little-endian uint16
                 (np.array(ids, dtype=np.uint16).tofile)
  llmc_u16.bin   llm.c's dev/data/data_common.py write_datafile: a 256 x int32 header (magic
                 20240520, version 1, token count), then the tokens as uint16
  llmc_u32.bin   the same with version 2 and uint32 tokens (llm.c's Llama 3 files)
  tokens.json    the token ids all three hold
The ids are a fixed pseudo-random sequence (numpy's PCG64, seed 2024) below GPT-2's 50257, with an
end-of-text 50256 every 97 tokens; llmc_u32.bin's ids are shifted up by 70000 (above uint16).
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokens")


def llmc(path, ids, version, dtype):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, version, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, dtype=dtype).tobytes())


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(2024)
    ids = rng.integers(0, 50256, size=600).tolist()
    for i in range(96, len(ids), 97):
        ids[i] = 50256
    np.array(ids, dtype=np.uint16).tofile(os.path.join(OUT, "nanogpt.bin"))
    llmc(os.path.join(OUT, "llmc_u16.bin"), ids, 1, np.uint16)
    wide = [t + 70000 for t in ids]
    llmc(os.path.join(OUT, "llmc_u32.bin"), wide, 2, np.uint32)
    json.dump({"generator": "tests/golden/token_files.py", "ids": ids, "u32_offset": 70000},
              open(os.path.join(OUT, "tokens.json"), "w"))
    print(f"wrote {len(ids)} tokens into {OUT}")


if __name__ == "__main__":
    main()
