"""Spark's hash partitioning, computed on the driver: which partition `repartition(n, col)` sends a long key to.

Spark's HashPartitioning puts a row in pmod(hash(key), n), where `hash` is Murmur3 x86_32 with seed 42 (the SQL
function `hash`); a long is hashed as its low then its high 32-bit word (Murmur3_x86_32.hashLong). Knowing it here
lets the job pick keys that land in given partitions without a Spark job to search for them.
"""

from __future__ import annotations

SPARK_HASH_SEED = 42
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _mix(h1: int, word: int) -> int:
    k1 = _rotl((word * 0xCC9E2D51) & _MASK, 15) * 0x1B873593 & _MASK
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def spark_hash_long(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `hash(value)` of a long `value` (a signed 32-bit int, as Spark returns it)."""
    unsigned = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix(_mix(seed & _MASK, unsigned & _MASK), unsigned >> 32) ^ 8
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & _MASK
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition_of(value: int, partitions: int) -> int:
    """The partition of `partitions` that `repartition(partitions, <long column>)` puts `value` in."""
    return spark_hash_long(value) % partitions  # Python's % of a positive modulus is Spark's pmod


def partition_keys(partitions: int) -> list[int]:
    """keys[p]: the smallest non-negative long that `repartition(partitions, <long column>)` sends to partition p."""
    keys: list[int | None] = [None] * partitions
    missing, candidate = partitions, 0
    while missing:
        partition = spark_partition_of(candidate, partitions)
        if keys[partition] is None:
            keys[partition] = candidate
            missing -= 1
        candidate += 1
    return keys
