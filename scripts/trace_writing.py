"""What the generators of Mooncake-format traces share: hash ids handed out in order, one per
512-token block, and the gzip file written so that the same seed gives the same bytes."""
import gzip, json, sys

BLOCK = 512


class Ids:
    """Hash ids never handed out before, in order from 1."""

    def __init__(self):
        self.n = 1

    def new(self, k):
        r = list(range(self.n, self.n + k))
        self.n += k
        return r


def write_trace(path, rows):
    """Writes `rows` (already in timestamp order) as gzipped JSONL; mtime 0: the same rows give the same bytes."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for d in rows:
            f.write((json.dumps(d) + "\n").encode())


def seed_range(argv, last):
    """The seeds FIRST..LAST a generator writes, from `DIR [FIRST [LAST]]` (FIRST alone: that seed;
    neither: 1..`last`); exits with a usage line for anything else."""
    try:
        first, end = (int(argv[2]), int(argv[3 if len(argv) > 3 else 2])) if len(argv) > 2 else (1, last)
    except ValueError:
        sys.exit(f"usage: {argv[0]} DIR [FIRST [LAST]]: seeds are whole numbers, got {argv[2:]}")
    if not 1 <= first <= end:
        sys.exit(f"usage: {argv[0]} DIR [FIRST [LAST]]: need 1 <= FIRST <= LAST, got {first} {end}")
    return range(first, end + 1)
