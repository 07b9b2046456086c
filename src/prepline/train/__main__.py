"""``python -m prepline.train --input <tokenization output> ... --output <folder> --params '{...}'``."""

import sys

from prepline.train.train import main

if __name__ == "__main__":
    sys.exit(main())
