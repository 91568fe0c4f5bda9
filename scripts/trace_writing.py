"""What the generators of Mooncake-format traces share: hash ids handed out in order, one per
512-token block, and the gzip file written so that the same seed gives the same bytes."""
import gzip, json

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
