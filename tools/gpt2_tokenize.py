#!/usr/bin/env python3
"""GPT-2 BPE pre-tokenization for shardwise: Debian 12 packages no C/C++ library for GPT-2's byte-level
BPE (only SentencePiece, which `shardwise tokenize` uses), so GPT-2 token files are written here with
OpenAI's tiktoken (`pip install tiktoken`) or, failing that, Hugging Face's transformers
(`pip install transformers`), and trained on with `shardwise train --data OUT --vocab 50304`.

Documents are cut as `shardwise tokenize --documents` cuts them (file, lines, paragraphs, or
--document-separator) and each is followed by <|endoftext|> (50256) unless --no-eos. The output is
nanoGPT's headerless uint16 .bin (`--format u16`, read by --data-format auto when named *.bin) or
llm.c's format with its 1024-byte header (`--format llmc`, as llm.c's own data scripts write).

  python3 tools/gpt2_tokenize.py --in corpus.txt --out corpus.bin --documents paragraphs
  build/bin/shardwise train --data corpus.bin --vocab 50304 --eos-id 50256 --no-cross-document-attention
"""
import argparse
import re
import struct
import sys

EOT = 50256
LLMC_MAGIC = 20240520


def gpt2_encoder():
    """A function text -> ids (no special tokens), from tiktoken or transformers."""
    try:
        import tiktoken
        enc = tiktoken.get_encoding('gpt2')
        return lambda text: enc.encode_ordinary(text)
    except ImportError:
        pass
    try:
        from transformers import GPT2TokenizerFast
        tok = GPT2TokenizerFast.from_pretrained('gpt2')
        tok.model_max_length = sys.maxsize  # no warning for long documents
        return lambda text: tok(text, add_special_tokens=False)['input_ids']
    except ImportError:
        sys.exit('gpt2_tokenize.py needs tiktoken or transformers: pip install tiktoken')


def documents(text, how, separator):
    """The documents of `text`, as shardwise's split_documents (src/shardwise/data/tokenize.h) cuts them."""
    if separator:
        pieces = (p.strip('\r\n') for p in text.split(separator))
        return [p for p in pieces if p]
    if how == 'file':
        return [text] if text else []
    lines = text.split('\n')
    if text.endswith('\n'):
        lines.pop()
    blank = [not re.sub(r'[ \t\r]', '', line) for line in lines]
    if how == 'lines':
        return [line[:-1] if line.endswith('\r') else line for line, b in zip(lines, blank) if not b]
    out, run = [], []
    for line, b in zip(lines, blank):
        if not b:
            run.append(line)
        elif run:
            out.append('\n'.join(run))
            run = []
    if run:
        out.append('\n'.join(run))
    return out


def write_tokens(path, ids, fmt):
    if max(ids, default=0) > 0xFFFF:
        sys.exit(f'token id {max(ids)} does not fit in uint16')
    with open(path, 'wb') as f:
        if fmt == 'llmc':
            f.write(struct.pack('<256i', LLMC_MAGIC, 1, len(ids), *([0] * 253)))
        f.write(struct.pack(f'<{len(ids)}H', *ids))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--in', dest='inputs', nargs='+', required=True, help='text files, in order')
    p.add_argument('--out', required=True, help='the token file to write')
    p.add_argument('--format', choices=['u16', 'llmc'], default='u16')
    p.add_argument('--documents', choices=['file', 'lines', 'paragraphs'], default='file')
    p.add_argument('--document-separator', default='', help="e.g. '<|endoftext|>' (overrides --documents)")
    p.add_argument('--no-eos', action='store_true', help='no <|endoftext|> after each document')
    a = p.parse_args()
    encode = gpt2_encoder()
    ids, count = [], 0
    for path in a.inputs:
        with open(path, encoding='utf-8') as f:
            text = f.read()
        for doc in documents(text, a.documents, a.document_separator):
            ids.extend(encode(doc))
            if not a.no_eos:
                ids.append(EOT)
            count += 1
    write_tokens(a.out, ids, a.format)
    print(f'tokenized {len(a.inputs)} file(s) into {count} documents, {len(ids)} GPT-2 tokens: {a.out} ({a.format})')


if __name__ == '__main__':
    main()
