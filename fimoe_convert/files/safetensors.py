"""Former home of the safetensors code, re-exporting its public names until every importer (files/lock.py's
`write_failed`) names the new modules: st_header.py, st_reader.py, st_writer.py, atomic.py, names.py, hashing.py."""

from .atomic import (
                     WrittenFile,
                     atomic_write_bytes,
                     atomic_write_stream,
                     fsync_dir,
                     remove_own_temporaries,
                     write_failed,
)
from .hashing import sha256_file
from .names import INDEX_NAME, SINGLE_NAME, TMP_SUFFIX
from .st_header import (
                     MAX_HEADER_BYTES,
                     Header,
                     PlannedTensor,
                     TensorInfo,
                     as_typed,
                     build_header,
                     parse_header,
                     read_header,
)
from .st_reader import read_bytes, read_tensors
from .st_writer import ShardWriter, write_file

__all__ = ["INDEX_NAME", "MAX_HEADER_BYTES", "SINGLE_NAME", "TMP_SUFFIX", "Header", "PlannedTensor", "ShardWriter",
           "TensorInfo", "WrittenFile", "as_typed", "atomic_write_bytes", "atomic_write_stream", "build_header",
           "fsync_dir", "parse_header", "read_bytes", "read_header", "read_tensors", "remove_own_temporaries",
           "sha256_file", "write_failed", "write_file"]
