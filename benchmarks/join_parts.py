"""Join the parts of a zip that travelled to a device one call each (``gpu_r1_full.sh``,
``gpu_precision.sh``) into one stored zip, and check that none is missing.

    python benchmarks/join_parts.py DST EXPECTED PART.zip [PART.zip ...]
"""

import sys
import zipfile


def main(dst: str, expected: int, parts: list[str]) -> int:
    n = 0
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for src in parts:
            with zipfile.ZipFile(src) as zin:
                for info in zin.infolist():
                    z.writestr(info, zin.read(info))
                    n += 1
    print(f"join_parts: {n} images from {len(parts)} parts into {dst}")
    if n != expected:
        print(f"join_parts: {n} images, not {expected:,}: a part is missing (carry each in its own call)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
