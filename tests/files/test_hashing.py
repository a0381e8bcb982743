"""Parallel hashing on the standard thread pool: largest first, a callback per result, the first error raised and
no key started after it."""

import hashlib
import threading

import pytest

from fimoe_convert.files.hashing import ParallelHashes, hash_files, sha256_file


def test_largest_first_and_every_result_reported():
    sizes = {"a": 1, "b": 30, "c": 20, "d": 10}
    started, reported = [], {}
    lock = threading.Lock()

    def digest(k):
        with lock:
            started.append(k)
        return k * 2

    got = ParallelHashes(list(sizes), digest, 1, sizes.__getitem__, on_result=reported.__setitem__).result()
    assert started == ["b", "c", "d", "a"]
    assert got == reported == {k: k * 2 for k in sizes}


def test_the_first_error_is_raised_and_no_key_starts_after_it():
    sizes = {"big": 3, "bad": 2, "small": 1}
    started = []

    def digest(k):
        started.append(k)
        if k == "bad":
            raise OSError(f"{k}: unreadable")
        return k

    with pytest.raises(OSError, match="^bad: unreadable$"):
        ParallelHashes(list(sizes), digest, 1, sizes.__getitem__).result()
    assert started == ["big", "bad"]


@pytest.mark.parametrize("threads", [1, 3])
def test_hash_files_matches_hashlib(tmp_path, threads):
    paths = []
    for i, n in enumerate([0, 1, 5000, 70_000]):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes(range(256)) * (n // 256) + b"x" * (n % 256))
        paths.append(p)
    seen = []
    got = hash_files(paths, progress=lambda done, total: seen.append((done, total)), threads=threads)
    assert got == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert seen[-1] == (75_001, 75_001) and sha256_file(paths[3], block=4096) == got[paths[3]]
