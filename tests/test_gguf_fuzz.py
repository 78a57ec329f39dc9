"""Seeded mutation fuzzing of the GGUF reader (deterministic; the long run is scripts/fuzz_gguf.py).

Every corrupted variant must either load, with every value and tensor usable and the
reader's guarantees holding, or raise GGUFError. Another exception, or taking more than
2 s, fails the test and names the variant so it can be reproduced.
"""

from __future__ import annotations

import collections
import traceback

import pytest

from gguf_fuzzing import Mutator, Timeout, build_seeds, check_variant

FUZZ_SEED = 20240601
N_VARIANTS = 25_000


@pytest.fixture(scope="module")
def mutator(tmp_path_factory):
    return Mutator(build_seeds(tmp_path_factory.mktemp("seeds")))


def test_seeds_are_valid_and_rewrite_identically(mutator, tmp_path):
    assert len(mutator.seeds) == 4
    for data in mutator.seeds:
        assert check_variant(str(tmp_path / "seed.gguf"), data, rewrite=True) == "ok"


def test_mutator_is_deterministic(mutator):
    assert [mutator.variant(FUZZ_SEED, i) for i in range(50)] == [
        mutator.variant(FUZZ_SEED, i) for i in range(50)
    ]
    variants = {mutator.variant(FUZZ_SEED, i)[0] for i in range(200)}
    assert len(variants - set(mutator.seeds)) > 150


def test_fuzz_reader(mutator, tmp_path):
    path = str(tmp_path / "variant.gguf")
    counts: collections.Counter[str] = collections.Counter()
    failures = []
    for i in range(N_VARIANTS):
        data, how = mutator.variant(FUZZ_SEED, i)
        try:
            # alternate mapped and in-memory reading; rewrite a quarter of the loaded ones
            counts[check_variant(path, data, use_mmap=i % 2 == 0, rewrite=i % 4 == 0)] += 1
        except Timeout:
            failures.append(f"variant {i} ({how}): no result after 2 s")
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            failures.append(f"variant {i} ({how}): {tb}")
        if len(failures) >= 10:
            break
    assert not failures, (
        f"fuzz seed {FUZZ_SEED}: {len(failures)} variant(s) neither loaded nor raised GGUFError "
        "(reproduce with Mutator(build_seeds(dir)).variant(seed, index)):\n" + "\n".join(failures)
    )
    assert sum(counts.values()) == N_VARIANTS
    # the mutations must produce both outcomes in quantity, or they test nothing
    assert counts["ok"] > N_VARIANTS // 50 and counts["error"] > N_VARIANTS // 2, counts
