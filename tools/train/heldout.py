"""Prints the held-out files of the corpus, one absolute path per line, or
with -compress the bits per byte of gzip -9 and xz -9e on them (each file
compressed on its own), the baselines k3 eval is compared with:

    go run ./cmd/k3 eval $(python3 tools/train/heldout.py)
    python3 tools/train/heldout.py -compress
"""

import argparse
import os
import subprocess

import data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-compress", action="store_true")
    args = ap.parse_args()
    goroot, version = data.go_info()
    _, held = data.corpus(goroot)
    if not args.compress:
        for path, _ in held:
            print(os.path.join(goroot, "src", path))
        return
    n = {"gzip -9": 0, "xz -9e": 0}
    total = 0
    for _, text in held:
        b = text.encode()
        total += len(b)
        n["gzip -9"] += len(subprocess.run(["gzip", "-9c"], input=b, capture_output=True, check=True).stdout)
        n["xz -9e"] += len(subprocess.run(["xz", "-9e", "-c"], input=b, capture_output=True, check=True).stdout)
    print(f"{version}: {len(held)} held-out files, {total} bytes")
    for k, v in n.items():
        print(f"{k}: {8 * v / total:.4f} bits/byte")


if __name__ == "__main__":
    main()
