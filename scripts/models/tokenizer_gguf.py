#!/usr/bin/env python3
"""Copies a GGUF's tokenizer (every `tokenizer.*` key: vocabulary, merges, token types, special
ids, chat template) into a small GGUF without tensors, for `shaped_gguf.py --tokenizer-from`
on a machine that cannot fetch the real model: the shaped file then tokenizes, renders chats
and constrains output as the real one does.

  python3 scripts/models/tokenizer_gguf.py REAL.gguf OUT.gguf
"""

import sys

import gguf


def copy_tokenizer(reader, writer):
    """Adds every tokenizer.* key of `reader` to `writer` with its type."""
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    reader = gguf.GGUFReader(sys.argv[1])
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(sys.argv[2], arch)
    copy_tokenizer(reader, w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


if __name__ == "__main__":
    main()
