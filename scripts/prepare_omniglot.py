"""Build the Omniglot images shipped in the package (run by developers only, never at run time).

Reads the two small Omniglot background subsets (``images_background_small1.zip``,
``images_background_small2.zip``; Lake et al. 2015, MIT licence) from a folder, inverts and
downscales every 105 x 105 PNG to 20 x 20 uint8 with `torch_ntm.omniglot.read_zips`, and writes
``src/torch_ntm/data/omniglot/``: ``omniglot20.safetensors.gz`` (gzipped safetensors; tensor
``images`` [K, 20, 20, 20], JSON metadata ``characters``: [alphabet, character] per row), the
LICENSE beside the zips, and a README saying where the data came from. Needs Pillow (to decode
the PNGs).

    python scripts/prepare_omniglot.py /path/to/omniglot
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from torch_ntm.omniglot import DATA_FILE, read_zips, save_characters

ZIPS = ("images_background_small1.zip", "images_background_small2.zip")

README = """\
# Omniglot, 20 x 20

`omniglot20.safetensors.gz` holds {k} characters of the Omniglot background set (Brenden Lake,
https://github.com/brendenlake/omniglot, MIT licence: `LICENSE`), 20 drawings each, from the
small subsets
`{zips}`
(the Greek and Latin characters that both hold kept once).
Alphabets: {alphabets}.

Made by `scripts/prepare_omniglot.py`: each 105 x 105 PNG is inverted (ink high) and averaged
over exact pixel areas to 20 x 20, stored as uint8 (0 blank, 255 full ink) in the tensor `images`
[{k}, 20, 20, 20] (character, drawing, row, column) of a gzipped safetensors file; its metadata
`characters` is the JSON list of [alphabet, character folder] of each row. Read it with
`torch_ntm.omniglot.load_characters`.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="folder with the two zips and LICENSE")
    parser.add_argument("--out", type=Path, default=DATA_FILE.parent, help="output folder")
    args = parser.parse_args(argv)

    characters = read_zips([args.folder / name for name in ZIPS])
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / DATA_FILE.name
    save_characters(characters, target)
    shutil.copyfile(args.folder / "LICENSE", args.out / "LICENSE")
    alphabets = sorted(set(characters.alphabets))
    (args.out / "README.md").write_text(
        README.format(
            k=len(characters.names),
            alphabets=", ".join(alphabets),
            zips="`, `".join(ZIPS),
        )
    )
    print(f"{target}: {len(characters.names)} characters, {target.stat().st_size} bytes")


if __name__ == "__main__":
    main()
